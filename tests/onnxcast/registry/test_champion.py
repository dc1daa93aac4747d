"""Champion/challenger decisions on numbers measured in the same run (no training here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from onnxcast.registry.champion import PlanError, decide, plan_entry, write_plan


def per_origin(mae: float, noise: float, n: int = 100, seed: int = 0) -> list[float]:
    """Per-origin MAEs with mean ``mae`` exactly: a shared pattern plus independent noise."""
    rng = np.random.default_rng(seed)
    pattern = 10 * np.sin(np.arange(n) / 5.0)  # hard and easy stretches both models share
    values = mae + pattern + rng.normal(0, noise, n)
    return (values - values.mean() + mae).tolist()


def fp32_entry(mae: float, noise: float, seed: int) -> dict:
    return {"fp32_holdout_mae": mae, "variants": [{"name": "fp32", "per_origin_mae": per_origin(mae, noise, seed=seed)}]}


def make_run(tmp_path: Path, challenger_mae: float, champion_mae: float | None, incomparable: dict | None = None,
             noise: float = 0.5) -> Path:
    run = tmp_path / "run"
    report = {"selected": {"edge": {"family": "lstm", "variant": "int8"}},
              "models": [{"family": "lstm", **fp32_entry(challenger_mae, noise, seed=1)}],
              "baselines": {"origins": {"block": 5}},
              "split": {"holdout_start": "2012-05-07T00:00:00Z", "holdout_end": "2012-05-29T23:00:00Z"}}
    (run / "models" / "champion").mkdir(parents=True)
    (run / "report.json").write_text(json.dumps(report))
    entries = [{"family": "lstm", "source": None, "role": "challenger"}]
    if champion_mae is not None:
        entries.append({"family": "champion", "source": "models:/m/3", "role": "champion", "version": "3"})
        (run / "models/champion/validation.json").write_text(json.dumps(fp32_entry(champion_mae, noise, seed=2)))
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


def test_a_lower_mae_that_is_noise_keeps_the_champion(tmp_path):
    """Issue 13: 2% better on average, but the per-origin differences are mostly noise."""
    decision = decide(make_run(tmp_path, 98.0, 100.0, noise=30.0))
    assert decision["promote"] is False
    assert decision["paired_test"]["significant"] is False and decision["paired_test"]["p_value"] > 0.05
    assert "not significantly" in decision["reason"] and "the champion stays" in decision["reason"]
    quiet = decide(make_run(tmp_path / "b", 98.0, 100.0, noise=0.5))
    assert quiet["promote"] is True and quiet["paired_test"]["p_value"] < 0.05


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
