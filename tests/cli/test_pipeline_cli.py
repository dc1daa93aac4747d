"""`onnxcast pipeline` as a user runs it: a subprocess, exit codes, stderr, files left behind."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TINY_ARGS = ["--horizon", "12", "--lookback", "56", "--hidden-size", "16", "--num-layers", "1"]


def onnxcast(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("onnxcast")), *args], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(Path.home())})


@pytest.mark.slow
def test_pipeline_writes_a_report_and_prints_a_summary(tiny_csv, tmp_path):
    out = tmp_path / "out"
    result = onnxcast("pipeline", "--data", tiny_csv, "--out", f"{out}/", "--models", "transformer",
                      "--max-epochs", "3", *TINY_ARGS)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "passed"
    assert "selected for edge: transformer" in result.stdout
    assert f"report: {out}/report.json\n" in result.stdout  # "out//report.json" for --out out/ before
    assert "[5/6] validate transformer" in result.stderr  # progress on the terminal
    # step 1 says what its slow part (the statistical reference, refitted per origin) is doing
    assert "INFO onnxcast.pipeline.run: baselines and the statistical reference: " in result.stderr
    assert "holdout origins" in result.stderr
    assert "torchvision" not in result.stderr  # four warnings per export before: torchvision is not installed
    assert (out / "models" / "transformer" / "onnx" / "int8.onnx").exists()


@pytest.mark.slow
def test_weekly_co2_with_other_column_names_beats_seasonal_naive(tmp_path):
    """A dataset the defaults were never tuned on: weekly CO2 (statsmodels), columns week/ppm,
    59 missing weeks (2.6%) accepted and interpolated on request."""
    import statsmodels.datasets.co2 as co2

    frame = co2.load_pandas().data.rename(columns={"co2": "ppm"}).rename_axis("week").reset_index()
    data = tmp_path / "co2.csv"
    frame.to_csv(data, index=False)
    out = tmp_path / "out"
    result = onnxcast("pipeline", "--data", str(data), "--time-column", "week", "--target-column", "ppm",
                      "--horizon", "13", "--lookback", "104", "--models", "lstm,transformer", "--fill-gaps", "20", "--max-missing-fraction", "0.03",
                      "--hidden-size", "32", "--max-epochs", "6", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    baselines = report["baselines"]
    assert report["dataset"]["freq"].startswith("W") and set(baselines["candidates"]) == {"naive", "seasonal_naive_52"}
    for model in report["models"]:  # both beat the better of naive and yearly seasonal naive
        assert model["fp32_holdout_mae"] < baselines["seasonal_naive"]["mae"] == min(
            c["mae"] for c in baselines["candidates"].values())


@pytest.mark.slow
def test_half_hourly_data_with_a_feature_column(example_csv, tmp_path):
    """Half-hourly demand (the hourly example interpolated to 30 min) with an extra numeric
    column: season 48, two input features."""
    import pandas as pd

    hourly = pd.read_csv(example_csv, parse_dates=["ds"]).set_index("ds")["y"]
    half = hourly.resample("30min").interpolate()
    frame = pd.DataFrame({"timestamp": half.index, "demand_mw": half.to_numpy(),
                          "hour_of_day": half.index.hour + half.index.minute / 60})
    data = tmp_path / "halfhourly.parquet"
    frame.to_parquet(data)
    out = tmp_path / "out"
    result = onnxcast("pipeline", "--data", str(data), "--time-column", "timestamp", "--target-column", "demand_mw",
                      "--feature-columns", "hour_of_day", "--horizon", "24", "--lookback", "336",
                      "--models", "nhits", "--max-epochs", "6", "--latency-repeats", "3", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["dataset"]["freq"] == "30min" and report["dataset"]["features"] == ["hour_of_day"]
    assert set(report["baselines"]["candidates"]) == {"naive", "seasonal_naive_48", "seasonal_naive_336"}
    assert sorted(report["models"][0]["training"]["spec"]["seasons"]) == [48, 336]  # a week of history: both anchors
    assert report["models"][0]["fp32_holdout_mae"] < report["baselines"]["seasonal_naive"]["mae"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--horizon", "0"], "horizon must be in [1, 10000], got 0"),
        (["--models", "lstm,gru"], "'gru'"),
        (["--data", "/nonexistent/data.csv"], "/nonexistent/data.csv: file not found"),
        (["--target-column", "load"], "missing ['load']"),
        (["--freq", "fortnightly"], "fortnightly"),
    ],
)
def test_bad_settings_exit_2_with_one_line_and_no_output(tiny_csv, tmp_path, args, fragment):
    out = tmp_path / "out"
    base = {"--data": tiny_csv}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    flat = [x for pair in base.items() for x in pair] + [a for a in args if a not in base and a not in base.values()]
    result = onnxcast("pipeline", *flat, "--out", str(out), *TINY_ARGS[4:])
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    assert fragment in result.stderr.split(lines[0], 1)[1] or fragment in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (out / "report.json").exists() and not (out / "models").exists()


def test_gate_failure_exits_3(tmp_path):
    periodic = np.tile([5.0, 9.0, 4.0, 7.0, 6.0, 8.0, 3.0, 2.0, 6.5, 7.5, 5.5, 4.5] * 2, 40)
    times = np.arange("2024-01-01T00", len(periodic), dtype="datetime64[h]")
    data = tmp_path / "periodic.csv"
    data.write_text("ds,y\n" + "".join(f"{t},{v}\n" for t, v in zip(times.astype(str), periodic, strict=True)))
    out = tmp_path / "out"
    result = onnxcast("pipeline", "--data", str(data), "--models", "lstm", "--max-epochs", "1", "--out", str(out), *TINY_ARGS)
    assert result.returncode == 3, result.stderr[-2000:]
    assert "error: validation gate(s) failed: lstm: fp32 holdout MAE" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (out / "report.json").exists()
