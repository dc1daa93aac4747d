"""The golden-report comparison (tests/golden_reports.py) can fail: a moved figure is named."""

import json

import golden_reports
import pytest
from golden_reports import assert_matches_golden, key_figures

REPORT = {"status": "passed", "baselines": {"best": "naive", "origins": {"count": 111, "stride": 3, "block": 4}},
          "family_choice": {"best": "lstm", "order": ["lstm"], "tied_with_best": ["lstm"], "tests": {}},
          "selected": {"edge": {"family": "lstm", "variant": "int8"}},
          "models": [{"family": "lstm", "fp32_holdout_mae": 0.65, "gates_passed": True,
                      "variants": [{"name": "fp32", "holdout": {"mae": 0.65}, "eligible": True,
                                    "gates": {"parity": {"passed": True}}}]}]}


@pytest.fixture
def golden(tmp_path, monkeypatch):
    monkeypatch.setattr(golden_reports, "GOLDEN", tmp_path)
    (tmp_path / "run.json").write_text(json.dumps(key_figures(REPORT)))


def test_equal_figures_and_float_noise_pass(golden):
    noisy = json.loads(json.dumps(REPORT))
    noisy["models"][0]["fp32_holdout_mae"] *= 1 + 1e-7
    noisy["selected"]["edge"]["variant"] = "fp32"  # chosen by measured latency: not compared
    assert_matches_golden(key_figures(noisy), "run")


def test_a_moved_figure_or_flipped_gate_is_named(golden):
    moved = json.loads(json.dumps(REPORT))
    moved["models"][0]["fp32_holdout_mae"] = 0.66
    moved["models"][0]["variants"][0]["gates"]["parity"]["passed"] = False
    moved["baselines"]["origins"]["count"] = 110
    with pytest.raises(AssertionError) as failed:
        assert_matches_golden(key_figures(moved), "run")
    message = str(failed.value)
    assert "3 key figure(s)" in message and "models.lstm.fp32_holdout_mae: 0.66 (golden 0.65)" in message
    assert "models.lstm.variants.fp32.gates.parity: False (golden True)" in message
