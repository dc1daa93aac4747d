"""Champion/challenger decisions on numbers measured in the same run (no training here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnxcast.champion import PlanError, decide, plan_entry, write_plan


def make_run(tmp_path: Path, challenger_mae: float, champion_mae: float | None, incomparable: dict | None = None) -> Path:
    run = tmp_path / "run"
    report = {"selected": {"edge": {"family": "lstm", "variant": "int8"}},
              "models": [{"family": "lstm", "fp32_holdout_mae": challenger_mae}],
              "split": {"holdout_start": "2012-05-07T00:00:00Z", "holdout_end": "2012-05-29T23:00:00Z"}}
    (run / "models" / "champion").mkdir(parents=True)
    (run / "report.json").write_text(json.dumps(report))
    entries = [{"family": "lstm", "source": None, "role": "challenger"}]
    if champion_mae is not None:
        entries.append({"family": "champion", "source": "models:/m/3", "role": "champion", "version": "3"})
        (run / "models/champion/validation.json").write_text(json.dumps({"fp32_holdout_mae": champion_mae}))
        (run / "models/champion/model.json").write_text(json.dumps({"spec": {"family": "transformer"}}))
    write_plan(run, entries, [], incomparable)
    return run


@pytest.mark.parametrize("challenger, champion, margin, promote", [
    (90.0, 100.0, 0.0, True),    # better
    (100.0, 100.0, 0.0, False),  # a tie keeps the champion
    (110.0, 100.0, 0.0, False),  # worse
    (95.0, 100.0, 0.10, False),  # better, but not by the required margin
    (85.0, 100.0, 0.10, True),
])
def test_challenger_must_beat_the_champion(tmp_path, challenger, champion, margin, promote):
    decision = decide(make_run(tmp_path, challenger, champion), min_improvement=margin)
    assert decision["promote"] is promote
    assert (decision["champion_version"], decision["champion_family"]) == ("3", "transformer")
    assert decision["improvement"] == pytest.approx(1 - challenger / champion)
    assert json.loads((tmp_path / "run/champion_challenger.json").read_text()) == decision


def test_no_champion_promotes(tmp_path):
    assert decide(make_run(tmp_path, 90.0, None))["promote"] is True


def test_incomparable_champion_is_not_replaced_automatically(tmp_path):
    run = make_run(tmp_path, 90.0, None, {"version": "3", "differences": {"horizon": [24, 12]}})
    decision = decide(run)
    assert decision["promote"] is False and "onnxcast_promote" in decision["reason"]
    assert decide(run, require_beats_champion=False)["promote"] is True


def test_plan_names_its_families(tmp_path):
    run = make_run(tmp_path, 1.0, 2.0)
    assert plan_entry(run, "champion")["version"] == "3"
    with pytest.raises(PlanError, match="no family 'gru'"):
        plan_entry(run, "gru")
