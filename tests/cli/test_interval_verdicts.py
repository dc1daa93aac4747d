"""Forecast intervals do not keep winning forecasts from shipping (issue 30, item 2), through
`onnxcast.cli.main`, the console script's function.

The first release refused every family of a single monthly series on coverage alone while its
forecasts beat the seasonal naive: the gate bootstrapped 2 rolling origins of an 18-step horizon
(one independent window) and called a 75% coverage of the 80% interval a certain miss. Now a
coverage is judged only on enough independent holdout windows; a judged miss recalibrates the
intervals on the most recent windows; `--strict-intervals` refuses as before.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest

from onnxcast import cli
from onnxcast.base.contract import read_metadata
from onnxcast.pipeline.report import validate_report

pytestmark = pytest.mark.slow  # three real pipeline runs of one small family, about 20 s each

# weekly CO2 (tests/real_series.py): dlinear after one epoch covers ~88% of the holdout at 80%
# (its validation split holds the rougher Pinatubo years), judged on 28 independent windows
CO2 = ["--models", "dlinear", "--max-epochs", "1", "--horizon", "12", "--lookback", "56", "--latency-repeats", "3"]


def run(argv: list[str], capsys) -> tuple[int, str, list[str]]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, [line for line in captured.err.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def monthly_series(tmp_path_factory) -> Path:
    """M3 monthly N1755 (126 months; tests/real_panels.py) as ``ds,y``: a series the first release
    refused on coverage alone, its forecasts 8% better than the seasonal naive."""
    from real_panels import load_panel

    frame = load_panel("m3-monthly").frame
    path = tmp_path_factory.mktemp("m3") / "N1755.csv"
    frame[frame["unique_id"] == "N1755"][["ds", "y"]].to_csv(path, index=False)
    return path


def test_a_single_monthly_series_whose_forecasts_win_ships_with_its_coverage_reported(monthly_series, tmp_path,
                                                                                       capsys):
    out = tmp_path / "out"
    code, printed, errors = run(["pipeline", "--data", str(monthly_series), "--out", str(out), "--models", "dlinear",
                                 "--horizon", "18", "--lookback", "24", "--holdout-windows", "1", "--max-epochs", "30",
                                 "--latency-repeats", "3"], capsys)
    assert (code, errors) == (0, [])
    report = json.loads((out / "report.json").read_text())
    validate_report(report)
    (model,) = report["models"]
    assert model["fp32_holdout_mae"] < report["baselines"]["seasonal_naive"]["mae"]
    verdict = model["intervals"]
    assert verdict["status"] == "not_judged" and verdict["independent_windows"] == 1
    assert verdict["note"] == ("not judged: 1 independent holdout window(s), fewer than the 20 a coverage needs to "
                               "refuse anything")
    fp32 = model["variants"][0]
    assert fp32["intervals_status"] == "not_judged"
    figures = fp32["holdout"]["intervals"]
    assert 0 <= figures["coverage_80"] <= 1 and "coverage_80_ci95" not in figures  # reported, no false certainty
    assert report["selected"]["cloud"]["family"] == "dlinear"
    assert "  intervals: not judged: 1 independent holdout window(s)" in printed


@pytest.fixture(scope="module")
def recalibrated(tmp_path_factory) -> tuple[int, str, list[str], Path]:
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from real_series import weekly_co2_csv

    out = tmp_path_factory.mktemp("co2") / "out"
    printed, err = io.StringIO(), io.StringIO()
    with redirect_stdout(printed), redirect_stderr(err):
        code = cli.main(["pipeline", "--data", weekly_co2_csv(), "--out", str(out), *CO2])
    return code, printed.getvalue(), [line for line in err.getvalue().splitlines() if line.startswith("error:")], out


def test_a_judged_coverage_miss_recalibrates_the_intervals_on_the_most_recent_windows(recalibrated):
    code, printed, errors, out = recalibrated
    assert (code, errors) == (0, [])
    report = json.loads((out / "report.json").read_text())
    validate_report(report)
    (model,) = report["models"]
    verdict = model["intervals"]
    assert verdict["status"] == "recalibrated"
    before = verdict["before"]
    assert before["status"] == "uncalibrated" and before["independent_windows"] >= 20
    assert re.match(r"80% interval covers \d+\.\d% of holdout points, more than 5\.0% from nominal and outside "
                    r"its 95% interval", before["missed"][0])
    assert verdict["calibration_windows"] == model["training"]["intervals"]["windows"] > 300
    assert model["training"]["intervals"]["calibrated_on"] == "recent"
    for variant in model["variants"]:
        assert variant["intervals_status"] == "recalibrated"
        coverage = variant["gates"]["interval_coverage"]
        assert coverage["passed"] and not coverage["judged"] and "in-sample" in coverage["note"]
        metadata = read_metadata(onnx.load(out / variant["onnx_path"]))
        assert metadata["intervals_calibrated_on"] == "recent"
    # the shipped intervals now cover the latest windows about as nominal (in-sample)
    assert abs(model["variants"][0]["holdout"]["intervals"]["coverage_80"] - 0.8) < 0.03
    assert "  intervals: recalibrated on the" in printed
    assert report["selected"]["cloud"]["family"] == "dlinear"


def test_strict_intervals_refuses_the_same_run(recalibrated, tmp_path, capsys):
    from real_series import weekly_co2_csv

    *_, shipped = recalibrated
    out = tmp_path / "out"
    code, _, errors = run(["pipeline", "--data", weekly_co2_csv(), "--out", str(out), *CO2, "--strict-intervals"],
                          capsys)
    before = json.loads((shipped / "report.json").read_text())["models"][0]["intervals"]["before"]["missed"][0]
    assert code == 3
    assert errors == [f"error: validation gate(s) failed: dlinear: fp32 {before}; dlinear: fp32-opt {before}"]
    failed = json.loads((out / "failed-report.json").read_text())
    assert failed["models"][0]["intervals"]["status"] == "refused"
    assert not (out / "report.json").exists()
