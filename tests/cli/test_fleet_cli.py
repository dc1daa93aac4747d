"""`onnxcast pipeline --series-column` as a user runs it: a fleet of real series in, one global
model per family out, judged per series, read by ONNX Runtime for series it never saw."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.real_panels import load_panel, write_panel

FLEET_ARGS = ["--series-column", "unique_id", "--horizon", "18", "--lookback", "36", "--freq", "MS",
              "--season", "12", "--hidden-size", "16", "--num-layers", "1", "--max-epochs", "2",
              "--windows-per-epoch", "2000", "--reference-series", "40", "--shards", "2", "--latency-repeats", "3",
              "--holdout-windows", "1"]


def onnxcast(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("onnxcast")), *args], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(Path.home())})


@pytest.fixture(scope="module")
def m3_fleet(tmp_path_factory) -> tuple[str, object]:
    """150 M3 monthly series (a seeded sample) as one Parquet long table."""
    panel = load_panel("m3-monthly", limit=150, seed=3)
    return write_panel(panel, tmp_path_factory.mktemp("fleet") / "m3.parquet"), panel


@pytest.mark.slow
def test_a_fleet_run_trains_global_models_and_judges_every_series(m3_fleet, tmp_path):
    data, panel = m3_fleet
    out = tmp_path / "out"
    # the holdout of every series is its official test period (the last 18 months)
    result = onnxcast("pipeline", "--data", data, "--out", str(out), "--models", "nhits,dlinear", *FLEET_ARGS)
    assert result.returncode in (0, 3), result.stderr[-3000:]  # 3: no family passed its gates (tiny models)
    name = "report.json" if result.returncode == 0 else "failed-report.json"
    report = json.loads((out / name).read_text())
    fleet = report["fleet"]
    assert fleet["n_series"] + len(report["quality"]["excluded"]) == panel.n_series
    for family in ("nhits", "dlinear"):
        table = __import__("pandas").read_parquet(out / "models" / family / "per_series.parquet")
        assert len(table) == fleet["n_series"] and table["series"].is_unique
        assert np.isfinite(table["fp32.mase"]).all()
        aggregate = fleet["families"][family]["fp32"]
        assert aggregate["mase_mean"] == pytest.approx(table["fp32.mase"].mean(), rel=1e-6)
        low, high = aggregate["mase_ci95"]
        assert low <= aggregate["mase_mean"] <= high
    assert fleet["reference"]["sample_size"] == 40
    assert "AutoETS" in fleet["reference"]["aggregates"]
    if result.returncode == 0:
        assert "selected for edge:" in result.stdout


@pytest.mark.slow
def test_the_global_model_forecasts_a_series_it_never_saw(m3_fleet, tmp_path):
    """Trained on M3 monthly, asked about M1 monthly series: any length at least the lookback,
    any scale, one batch."""
    import onnx
    import onnxruntime as ort

    data, panel = m3_fleet
    out = tmp_path / "out"
    result = onnxcast("pipeline", "--data", data, "--out", str(out), "--models", "dlinear", *FLEET_ARGS)
    assert result.returncode in (0, 3), result.stderr[-3000:]
    path = out / "models" / "dlinear" / "onnx" / "fp32.onnx"
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert meta["onnxcast.global"] == "true"
    assert int(meta["onnxcast.n_series"]) > 100
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    unseen = load_panel("m1-monthly", limit=5, seed=1).frame
    histories = np.stack([g["y"].to_numpy("float32")[-36:] for _, g in unseen.groupby("unique_id")])[:, :, None]
    forecast = session.run(["forecast"], {"history": histories})[0]
    assert forecast.shape == (5, 18) and np.isfinite(forecast).all()
    scaled = session.run(["forecast"], {"history": histories * 1000})[0]
    np.testing.assert_allclose(scaled, forecast * 1000, rtol=1e-3)  # a global model is scale-free


def test_a_table_without_the_series_column_is_one_line(m3_fleet, tmp_path):
    data, _ = m3_fleet
    result = onnxcast("pipeline", "--data", data, "--out", str(tmp_path / "out"), "--models", "dlinear",
                      *[a if a != "unique_id" else "meter" for a in FLEET_ARGS])
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "meter" in last and "column" in last
    assert not (tmp_path / "out" / "report.json").exists()
