"""The whole pipeline on real data at tiny settings: what a user of report.json relies on."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxcast.base.contract import read_metadata, signature
from onnxcast.base.errors import ConfigError, GateError
from onnxcast.base.files import sha256_file
from onnxcast.pipeline.report import validate_report
from onnxcast.pipeline.run import run_pipeline
from onnxcast.pipeline.sessions import onnx_session

pytestmark = pytest.mark.slow


def test_report_follows_the_contract(tiny_run):
    cfg, report = tiny_run
    validate_report(report)
    on_disk = json.loads((Path(cfg.out_dir) / "report.json").read_text())
    assert on_disk["selected"] == report["selected"]
    assert [m["family"] for m in report["models"]] == ["lstm", "transformer", "nhits", "dlinear"]
    assert report["dataset"]["rows"] == 2284 and report["dataset"]["freq"].startswith("W-")
    assert report["split"]["holdout_end"].startswith("2001-12-29T00:00")
    # one series kept: judged over its origins, said in the report and each validation.json
    assert report["judging"] == "over_origins" and {m["judging"] for m in report["models"]} == {"over_origins"}
    origins = report["baselines"]["origins"]  # aligned at the series' end, as statsforecast's cross_validation
    assert origins["last"] == 2284 - cfg.horizon


def test_key_figures_match_the_golden_report(tiny_run):
    """Gates, baselines, origins, family choice and holdout MAEs of the tiny run are those of
    tests/golden/tiny-run.json (issue 31: a refactor that moves a number fails here)."""
    from golden_reports import assert_matches_golden, key_figures

    _, report = tiny_run
    assert_matches_golden(key_figures(report), "tiny-run")


def test_every_family_passes_parity_at_several_shapes_and_beats_the_baseline(tiny_run):
    _, report = tiny_run
    baseline = report["baselines"]["seasonal_naive"]["mae"]
    for model in report["models"]:
        assert model["gates_passed"], model["failures"]
        for variant in model["variants"]:
            if variant["name"] in ("fp32", "fp32-opt"):
                assert variant["gates"]["parity"]["passed"]
                shapes = {(s["batch"], s["time"]) for s in variant["parity_shapes"]}
                assert len(shapes) >= 4 and any(t != 48 for _, t in shapes) and any(b != 2 for b, _ in shapes)
        fp32 = model["variants"][0]
        assert fp32["name"] == "fp32" and fp32["holdout"]["mae"] < baseline


def test_onnx_files_match_the_report_and_carry_metadata(tiny_run):
    cfg, report = tiny_run
    for model in report["models"]:
        for variant in model["variants"]:
            path = Path(cfg.out_dir) / variant["onnx_path"]
            assert sha256_file(path) == variant["sha256"]
            assert path.stat().st_size == variant["size_bytes"]
            proto = onnx.load(path)
            meta = read_metadata(proto)
            assert meta["model_family"] == model["family"] and meta["horizon"] == "12"
            assert meta["dataset_sha256"] == report["dataset"]["sha256"]
            assert signature(proto)["inputs"][0]["shape"][:2] == ["batch", "time"]


def test_selected_variants_are_eligible_and_the_int8_is_smaller(tiny_run):
    _, report = tiny_run
    by_name = {(m["family"], v["name"]): v for m in report["models"] for v in m["variants"]}
    for channel in ("edge", "cloud"):
        choice = report["selected"][channel]
        assert by_name[(choice["family"], choice["variant"])]["eligible"]
    for family in ("lstm", "transformer", "nhits", "dlinear"):
        assert by_name[(family, "int8")]["size_bytes"] < by_name[(family, "fp32")]["size_bytes"]


def test_onnx_forecast_equals_the_reported_holdout_accuracy(tiny_run):
    """Re-run the selected model on the holdout windows: the same MAE as in the report."""
    from onnxcast.pipeline.fleet_data import load_split
    from onnxcast.pipeline.sessions import onnx_predict
    from onnxcast.pipeline.validate import holdout_metrics, holdout_windows

    cfg, report = tiny_run
    series, split = load_split(Path(cfg.out_dir) / "data" / "fleet", cfg)
    holdout = holdout_windows(cfg, series, split)
    choice = report["selected"]["cloud"]
    variant = next(v for m in report["models"] if m["family"] == choice["family"] for v in m["variants"]
                   if v["name"] == choice["variant"])
    session = onnx_session(Path(cfg.out_dir) / variant["onnx_path"])
    mae = holdout_metrics(onnx_predict(session, holdout.history), holdout)["mae"]
    assert mae == pytest.approx(variant["holdout"]["mae"], rel=1e-6)


def test_an_unbeatable_baseline_fails_the_run_and_leaves_no_model(tmp_path, tiny_config):
    """A perfectly periodic series: seasonal naive is exact, no model can beat it."""
    periodic = np.tile(np.array([5.0, 9.0, 4.0, 7.0, 6.0, 8.0, 3.0, 2.0, 6.5, 7.5, 5.5, 4.5] * 2), 40)
    times = np.arange("2024-01-01T00", len(periodic), dtype="datetime64[h]")
    data = tmp_path / "periodic.csv"
    data.write_text("ds,y\n" + "".join(f"{t},{v}\n" for t, v in zip(times.astype(str), periodic, strict=True)))
    cfg = tiny_config(data_uri=str(data), out_dir=str(tmp_path / "out"), models=("lstm",), max_epochs=1)
    with pytest.raises(GateError, match="does not beat the best baseline"):
        run_pipeline(cfg)
    out = tmp_path / "out"
    assert not (out / "report.json").exists()
    assert not (out / "models").exists() and not (out / ".staging").exists()
    failed = json.loads((out / "failed-report.json").read_text())
    assert failed["status"] == "failed" and failed["failures"]


def test_lookback_shorter_than_the_season_is_a_settings_error(tmp_path, tiny_config):
    cfg = tiny_config(out_dir=str(tmp_path / "out"), lookback=16)
    with pytest.raises(ConfigError, match="lookback 16 is shorter than the season 52"):
        run_pipeline(cfg)
    assert not (tmp_path / "out" / "report.json").exists()


def test_nhits_through_the_cli_on_daily_and_weekly_anchors(tmp_path):
    """`onnxcast pipeline --models nhits`: anchored on the 24- and 168-hour seasonal naive,
    exported with dynamic batch and time, parity at histories of at least the lookback, and
    an int8 variant judged by holdout accuracy."""
    from onnxcast import cli
    from onnxcast.pipeline.models import ModelSpec

    out = tmp_path / "out"
    code = cli.main(["pipeline", "--data", "example", "--out", str(out), "--models", "nhits", "--horizon", "24",
                     "--lookback", "168", "--max-epochs", "6", "--latency-repeats", "3"])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    validate_report(report)
    (model,) = report["models"]
    assert model["family"] == "nhits" and model["gates_passed"], model["failures"]
    assert model["fp32_holdout_mae"] < report["baselines"]["seasonal_naive"]["mae"]
    variants = {v["name"]: v for v in model["variants"]}
    for name in ("fp32", "fp32-opt"):
        shapes = variants[name]["parity_shapes"]
        assert {s["time"] for s in shapes} > {168} and all(s["time"] >= 168 for s in shapes)
        assert {s["batch"] for s in shapes} >= {1, 64}
    assert variants["int8"]["size_bytes"] < 0.3 * variants["fp32"]["size_bytes"]
    assert "accuracy_vs_fp32" in variants["int8"]["gates"]
    assert signature(onnx.load(out / variants["fp32"]["onnx_path"]))["inputs"][0]["shape"][:2] == ["batch", "time"]
    spec = ModelSpec(**json.loads((out / "models" / "nhits" / "model.json").read_text())["spec"])
    assert sorted(spec.seasons) == [24, 168] and spec.anchor_seasons == spec.seasons


def test_a_long_table_of_one_series_is_run_exactly_as_that_series(tiny_csv, tiny_config, tmp_path):
    """Issue 31, a series is a fleet of one: the same series given as a long table
    (``series_column``, the shard steps) and as a one-series file gives the same split, origins,
    baselines, reference and holdout MAE, and both are judged over their origins (no ``fleet``
    object, no global-model metadata). Before, the table was trained as a global model and judged
    across its one series."""
    import pandas as pd

    table = pd.read_csv(tiny_csv)
    table.insert(0, "unique_id", "co2")
    table.to_csv(tmp_path / "long.csv", index=False)
    one = run_pipeline(tiny_config(models="dlinear", max_epochs=1))
    cfg = tiny_config(models="dlinear", max_epochs=1, data_uri=str(tmp_path / "long.csv"), series_column="unique_id")
    long = run_pipeline(cfg)
    assert "fleet" not in long and "fleet" not in one
    for key in ("origins", "best", "mase_scale"):
        assert long["baselines"][key] == one["baselines"][key]
    assert long["baselines"]["seasonal_naive"]["mae"] == one["baselines"]["seasonal_naive"]["mae"]
    assert long["split"] == one["split"]
    assert long["models"][0]["fp32_holdout_mae"] == one["models"][0]["fp32_holdout_mae"]
    # one gate (changes-31.md 16): the table's one series gets the reference over its origins too
    figures = [{k: v for k, v in report["reference"].items() if k != "seconds"} for report in (long, one)]
    assert figures[0]["mae"] is not None and figures[0] == figures[1]
    metadata = read_metadata(onnx.load(Path(cfg.out_dir) / "models/dlinear/onnx/fp32.onnx"))
    assert "global" not in metadata and metadata["trained_until"] == one["dataset"]["end"]
