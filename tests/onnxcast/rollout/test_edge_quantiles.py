"""Forecast distributions on the device: a model with the ``quantiles`` output is promoted with
both outputs in its signed manifest, pulled, and ``edge predict`` prints one ``q<level>``
column per level after ``forecast`` (single series and fleets), equal to ONNX Runtime's
numbers; a model from before quantiles prints what it always printed; a model whose
quantiles disagree with its ``onnxcast.quantile_levels`` is refused in one line."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from rollout_support import one_error_line

from onnxcast import cli
from onnxcast.base.errors import VerificationError
from onnxcast.rollout.edge import inspect_model, predict, pull
from onnxcast.rollout.promote import promote
from onnxcast.rollout.store import open_store

LEVELS = ["0.025", "0.1", "0.5", "0.9", "0.975"]
Q_COLUMNS = [f"q{level}" for level in LEVELS]


@pytest.fixture
def history_csv(tmp_path):
    """40 hourly rows of ds, y, x1 (the tiny model reads the last 16 of y and x1)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "history.csv"
    lines = ["ds,y,x1"] + [f"2026-01-01T{i % 24:02d}:00:00Z,{100 + 10 * np.sin(i / 3) + rng.normal():.4f},"
                           f"{5 + rng.normal():.4f}" for i in range(40)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def fleet_csv(tmp_path):
    """A long table of 3 series (ids a, b, c), 20 hourly rows each, interleaved."""
    rng = np.random.default_rng(1)
    rows = ["unique_id,ds,y,x1"]
    for i in range(20):
        for k, series in enumerate("abc"):
            rows.append(f"{series},2026-01-01T{i:02d}:00:00Z,{100 + 10 * np.sin(i / 3 + k) + rng.normal():.4f},"
                        f"{5 + rng.normal():.4f}")
    path = tmp_path / "fleet.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _windows(path, series_column: str | None = None) -> dict[str, np.ndarray]:
    """The newest 16 rows of (y, x1) per series (one key '' for a single-series table)."""
    out: dict[str, list] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(row[series_column] if series_column else "", []).append([float(row["y"]), float(row["x1"])])
    return {k: np.array(v, np.float32)[-16:] for k, v in out.items()}


def _ort(onnx_path, histories: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    forecast, quantiles = session.run(["forecast", "quantiles"], {"history": histories})
    return forecast, quantiles


@pytest.fixture
def quantile_device(tmp_path, make_run):
    """A device folder that pulled a model with quantiles; (store, dest, the promoted file)."""
    store, dest = str(tmp_path / "store"), tmp_path / "device"
    report = make_run("a", quantiles=True)
    promote(report, store, "m", "edge", version="1")
    pull(store, "m", "edge", dest)
    return store, dest, report.parent / "models/lstm/onnx/fp32-opt.onnx"


class TestPredictWithQuantiles:
    def test_cli_prints_one_column_per_level_equal_to_onnxruntime(self, quantile_device, history_csv, capsys):
        _, dest, onnx_path = quantile_device
        assert cli.main(["edge", "predict", "--dir", str(dest), "--input", str(history_csv)]) == 0
        rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
        assert rows[0] == ["step", "ds", "forecast", *Q_COLUMNS, "version"]
        assert len(rows) == 1 + 4 and {r[-1] for r in rows[1:]} == {"1"}
        printed = np.array([[np.float32(v) for v in r[2:-1]] for r in rows[1:]])  # forecast, then the levels
        forecast, quantiles = _ort(onnx_path, _windows(history_csv)[""][None])
        assert np.array_equal(printed[:, 0], forecast[0])
        assert np.array_equal(printed[:, 1:], quantiles[0])
        assert (np.diff(printed[:, 1:], axis=1) >= 0).all()  # ascending along the levels
        assert (printed[:, 1] < printed[:, 0]).all() and (printed[:, 0] < printed[:, -1]).all()

    def test_fleet_prints_the_levels_per_series(self, quantile_device, fleet_csv, capsys):
        _, dest, onnx_path = quantile_device
        assert cli.main(["edge", "predict", "--dir", str(dest), "--input", str(fleet_csv),
                         "--series-column", "unique_id"]) == 0
        rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
        assert rows[0] == ["unique_id", "step", "ds", "forecast", *Q_COLUMNS, "version"]
        assert [r[0] for r in rows[1:]] == [s for s in "abc" for _ in range(4)]
        windows = _windows(fleet_csv, "unique_id")
        forecast, quantiles = _ort(onnx_path, np.stack([windows[s] for s in "abc"]))
        printed = np.array([[np.float32(v) for v in r[3:-1]] for r in rows[1:]]).reshape(3, 4, 1 + len(LEVELS))
        assert np.array_equal(printed[..., 0], forecast) and np.array_equal(printed[..., 1:], quantiles)
        result = predict(dest, fleet_csv, series_column="unique_id", out=io.StringIO(), chunk=2)  # chunks join
        assert result.quantiles.shape == (3, 4, 5) and np.array_equal(result.quantiles, quantiles)

    def test_a_model_without_quantiles_prints_what_it_always_did(self, tmp_path, make_run, history_csv, fleet_csv,
                                                                capsys):
        store, dest = str(tmp_path / "store"), str(tmp_path / "device")
        promote(make_run("old"), store, "m", "edge", version="1")
        pull(store, "m", "edge", dest)
        assert cli.main(["edge", "predict", "--dir", dest, "--input", str(history_csv)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == "step,ds,forecast,version" and all(len(line.split(",")) == 4 for line in out)
        assert cli.main(["edge", "predict", "--dir", dest, "--input", str(fleet_csv), "--series-column",
                         "unique_id"]) == 0
        assert capsys.readouterr().out.splitlines()[0] == "unique_id,step,ds,forecast,version"
        assert predict(dest, fleet_csv, series_column="unique_id", out=io.StringIO()).quantiles is None


class TestVerification:
    def test_the_signed_manifest_records_both_outputs_and_the_pull_accepts_them(self, quantile_device):
        store, dest, _ = quantile_device
        manifest = json.loads(open_store(store).read("m/versions/1/manifest.json"))["signed"]
        entry = manifest["artifacts"]["lstm-fp32-opt.onnx"]
        assert entry["signature"]["outputs"] == [
            {"name": "forecast", "dtype": "float32", "shape": ["batch", 4]},
            {"name": "quantiles", "dtype": "float32", "shape": ["batch", 4, 5]}]
        assert entry["metadata"]["quantile_levels"] == ",".join(LEVELS)
        assert (dest / "current" / "lstm-fp32-opt.onnx").is_file()

    def test_a_light_device_reads_the_same_signature(self, tiny_onnx_quantiles):
        """Without the ``onnx`` package (a device install) the ORT path finds the same two outputs."""
        code = ("import sys, json\nsys.modules['onnx'] = None\nfrom onnxcast.rollout.edge import inspect_model\n"
                "print(json.dumps(inspect_model(sys.argv[1]).signature))\n")
        light = subprocess.run([sys.executable, "-c", code, str(tiny_onnx_quantiles)], capture_output=True,
                               text=True, check=True).stdout
        assert json.loads(light) == inspect_model(tiny_onnx_quantiles).signature

    def test_levels_that_disagree_with_the_output_are_refused(self, tiny_onnx_quantiles, tmp_path):
        bad = _relabel(tiny_onnx_quantiles, tmp_path / "bad.onnx", "0.1,0.5,0.9")
        with pytest.raises(VerificationError, match=r"bad.onnx: quantiles holds 5 levels, the metadata lists 3$"):
            inspect_model(bad)
        code = ("import sys\nsys.modules['onnx'] = None\nfrom onnxcast.rollout.edge import inspect_model\n"
                "from onnxcast.base.errors import VerificationError\n"
                "try:\n    inspect_model(sys.argv[1])\nexcept VerificationError as exc:\n    print(exc)\n")
        light = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, check=True)
        assert light.stdout.strip().endswith("quantiles holds 5 levels, the metadata lists 3")
        unlabelled = _relabel(tiny_onnx_quantiles, tmp_path / "none.onnx", None)
        with pytest.raises(VerificationError, match="needs the metadata onnxcast.quantile_levels"):
            inspect_model(unlabelled)

    def test_an_installed_model_with_wrong_levels_is_not_run(self, quantile_device, history_csv, capsys):
        """A model installed by an older client (which did not check the levels) is refused at
        load, in one line, before anything is printed."""
        _, dest, _ = quantile_device
        artifact = dest / "current" / "lstm-fp32-opt.onnx"
        _relabel(artifact, artifact, "0.05,0.5,0.95")
        pulled = dest / "current" / "pulled.json"
        info = json.loads(pulled.read_text())
        info["sha256"] = hashlib.sha256(artifact.read_bytes()).hexdigest()
        pulled.write_text(json.dumps(info))
        assert cli.main(["edge", "predict", "--dir", str(dest), "--input", str(history_csv)]) == 1
        one_error_line(capsys, "lstm-fp32-opt.onnx: quantiles holds 5 levels, the metadata lists 3")
        assert capsys.readouterr().out == ""


def _relabel(source, target, levels: str | None):
    """``source`` with its onnxcast.quantile_levels set to ``levels`` (removed for None)."""
    proto = onnx.load(source)
    kept = [p for p in proto.metadata_props if p.key != "onnxcast.quantile_levels"]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    if levels is not None:
        proto.metadata_props.add(key="onnxcast.quantile_levels", value=levels)
    onnx.save(proto, target)
    return target
