"""The data gate on one series: every corpus input gets the answer it should, reports are written and readable.

One series goes through the gate of any number of series (onnxcast.pipeline.fleet_quality:
the table, the shard of its one series, the merge), in this process."""

from __future__ import annotations

import html
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from corpus.bad_inputs import BAD_INPUTS, GOOD_INPUTS, Case, edit

from onnxcast.base.errors import DataError, DataQualityError
from onnxcast.pipeline.config import PipelineConfig, QualitySettings
from onnxcast.pipeline.expectations import RESULT_JSON
from onnxcast.pipeline.fleet_data import FleetData, min_rows_over_origins, split_fleet
from onnxcast.pipeline.fleet_quality import check_in_process

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def base(example_csv) -> bytes:
    return Path(example_csv).read_bytes()


def run_case(case: Case, base: bytes, directory: Path):
    path = case.write(directory, base)
    cfg = case.config(str(path), str(directory / "run"))
    return cfg, directory / "run" / "quality"


def gate(cfg: PipelineConfig) -> tuple[dict, FleetData]:
    """The gate's summary (dataset.json) and the series it kept."""
    summary = check_in_process(cfg)
    return summary, FleetData.load(cfg.layout.fleet)


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c.name for c in BAD_INPUTS])
def test_bad_input_fails_with_a_clear_error(case, base, tmp_path):
    cfg, quality_dir = run_case(case, base, tmp_path)
    with pytest.raises(DataError) as error:
        gate(cfg)
    message = str(error.value)
    assert case.expect in message
    assert message.startswith(cfg.data_uri) and "\n" not in message
    written = [p.read_bytes() for p in quality_dir.rglob("*") if p.is_file()] if quality_dir.exists() else []
    for secret in case.hidden:
        assert secret not in message and all(secret.encode() not in data for data in written), secret
    if case.stage == "reading":  # not a table: nothing to report on
        assert not isinstance(error.value, DataQualityError)
        assert not quality_dir.exists()
        return
    assert isinstance(error.value, DataQualityError)
    failures = error.value.failures
    assert failures and all("\n" not in f for f in failures)
    page = html.unescape(Path(error.value.report_path).read_text())
    assert "FAILED" in page
    for failure in failures:  # in the verdict on top, word for word
        assert failure in page
    results = [json.loads(p.read_text()) for p in quality_dir.rglob(RESULT_JSON)]
    assert any(r["success"] is False for r in results)


@pytest.mark.parametrize("case", GOOD_INPUTS, ids=[c.name for c in GOOD_INPUTS])
def test_good_input_passes(case, base, tmp_path):
    cfg, _ = run_case(case, base, tmp_path)
    summary, series = gate(cfg)
    assert series.values.shape == (3600, 1) and series.ids == ("y",)
    assert series.freq == "h"
    quality = summary["quality"]
    assert Path(quality["html_path"]).exists() and Path(quality["json_path"]).exists()
    json.dumps(quality)  # goes into report.json as is


def test_example_passes_without_warnings(example_csv, tmp_path, capfd):
    cfg = PipelineConfig(data_uri=example_csv, out_dir=str(tmp_path))
    summary, _ = gate(cfg)
    quality = summary["quality"]
    assert quality["warnings"] == [] and quality["repairs"] == {}
    assert quality["passed"] and all(c["passed"] for c in quality["checks"])
    assert {c["check"] for c in quality["checks"]} >= {
        "required_columns", "too_short", "timestamps_parse", "timestamps_one_zone_style",
        "duplicated_times", "not_increasing", "one_frequency", "off_grid", "gap_share",
        "gaps_repairable", "edges_present", "values_numeric", "mostly_missing", "non_finite",
        "constant", "outlier_share", "excluded_share"}
    assert summary["dataset"]["n_series"] == 1 and summary["split"]["holdout_rows"] > 0
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # no GX progress bars, no GX log lines


def test_imperfect_input_passes_with_warnings_and_recorded_repairs(base, tmp_path):
    case = next(c for c in GOOD_INPUTS if c.name == "imperfect_with_repairs")
    cfg, _ = run_case(case, base, tmp_path)
    quality = gate(cfg)[0]["quality"]
    warned = {c["check"] for c in quality["checks"] if not c["passed"]}
    assert warned == {"duplicated_times", "no_outliers"}
    assert all(c["severity"] == "warning" for c in quality["checks"] if not c["passed"])
    assert any("the last row of each was kept (drop_duplicate_timestamps), 2 rows dropped" in w
               for w in quality["warnings"])
    assert any(w.startswith("'y' has no outliers") and "kept as they are" in w for w in quality["warnings"])
    assert "6 missing step(s) interpolated (fill_gaps_max_steps=3)" in quality["warnings"]
    assert quality["repairs"] == {"fill_gaps": {"max_steps": 3, "interpolated_steps": 6},
                                  "drop_duplicate_timestamps": {"dropped_rows": 2}}
    page = Path(quality["html_path"]).read_text()
    assert "PASSED" in page


def test_outliers_warn_by_the_thresholds_of_the_settings(base, tmp_path):
    spikes = next(c for c in GOOD_INPUTS if c.name == "outlier_spikes")
    cfg, _ = run_case(spikes, base, tmp_path)

    def warned(quality):
        return [c["check"] for c in quality["checks"] if not c["passed"]]

    assert warned(gate(cfg)[0]["quality"]) == ["outlier_share", "no_outliers"]
    loose = replace(cfg, out_dir=str(tmp_path / "loose"), quality=QualitySettings(max_outlier_fraction=0.02))
    assert warned(gate(loose)[0]["quality"]) == ["no_outliers"]
    strict = replace(cfg, out_dir=str(tmp_path / "wide"), quality=QualitySettings(outlier_mad_threshold=1000.0))
    assert warned(gate(strict)[0]["quality"]) == []  # spikes x100 are within 1000 robust sigmas


def test_a_week_missing_passes_when_the_gap_share_and_repair_allow_it(base, tmp_path):
    gap = next(c for c in BAD_INPUTS if c.name == "large_gap")
    cfg, _ = run_case(gap, base, tmp_path)
    allowed = replace(cfg, quality=QualitySettings(max_gap_fraction=0.05, fill_gaps_max_steps=168))
    summary, series = gate(allowed)
    assert series.values.shape == (3600, 1)
    assert summary["quality"]["repairs"]["fill_gaps"]["interpolated_steps"] == 168


def test_feature_columns_are_checked_like_the_target(base, tmp_path):
    def with_feature(table):
        return [[*r, "" if i == 7 else str(i % 24)] for i, r in enumerate(table)]

    case = Case("feature_gap", "a feature with an empty value", edit(with_feature, header="ds,y,hour"), "",
                settings={"feature_columns": ("hour",)})
    cfg, _ = run_case(case, base, tmp_path)
    with pytest.raises(DataQualityError, match=r"gaps .* longest 1 steps \(series 'y'\)"):
        gate(cfg)
    summary, series = gate(replace(cfg, quality=QualitySettings(fill_gaps_max_steps=1)))
    assert series.values.shape == (3600, 2)
    assert summary["quality"]["repairs"]["fill_gaps"]["interpolated_steps"] == 1

    def mostly_empty(table):
        return [[*r, "" if i % 20 == 0 else str(i % 24)] for i, r in enumerate(table)]

    case = Case("feature_mostly_empty", "5% of a feature empty", edit(mostly_empty, header="ds,y,hour"), "",
                settings={"feature_columns": ("hour",), "quality": {"fill_gaps_max_steps": 3}})
    (tmp_path / "empty").mkdir()
    cfg, _ = run_case(case, base, tmp_path / "empty")
    with pytest.raises(DataQualityError, match=r"'y', 'hour' empty values at most 1.00% \(max_missing_fraction\): "
                                               r"'hour' empty in 5.00% of rows \(series 'y'\)"):
        gate(cfg)  # the column at fault is named


def test_a_time_column_of_numbers_is_named(base, tmp_path):
    epoch = next(c for c in BAD_INPUTS if c.name == "epoch_seconds")
    cfg, _ = run_case(epoch, base, tmp_path)
    with pytest.raises(DataQualityError, match="'ds' timestamps parse as dates: 3600 of 3600 rows.*; numbers are not read as timestamps"):
        gate(cfg)


@pytest.mark.parametrize("lookback,horizon", [(168, 24), (24, 6), (500, 48)])
def test_min_rows_is_what_the_split_of_one_series_accepts(lookback, horizon):
    cfg = PipelineConfig(data_uri="x", out_dir="y", lookback=lookback, horizon=horizon)
    n = min_rows_over_origins(cfg)
    split_fleet(np.array([n]), cfg)
    with pytest.raises(DataError):
        split_fleet(np.array([n - 1]), cfg)


def test_module_imports_neither_pandas_nor_great_expectations():
    code = ("import sys, onnxcast.pipeline.fleet_quality, onnxcast.pipeline.quality; "
            "assert not {'pandas', 'great_expectations'} & set(sys.modules), 'heavy import at module level'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)")
def test_html_report_renders_the_verdict_in_a_browser(base, tmp_path):
    from PIL import Image

    case = next(c for c in BAD_INPUTS if c.name == "duplicate_timestamps")
    cfg, _ = run_case(case, base, tmp_path)
    with pytest.raises(DataQualityError) as error:
        gate(cfg)
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900",
                    f"--screenshot={shot}", Path(error.value.report_path).as_uri()],
                   check=True, capture_output=True, timeout=90)
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 900)
    # The verdict box on top has a red (#cf222e) border: the page is styled even offline.
    red = sum(1 for r, g, b in image.getdata() if r > 180 and g < 80 and b < 80)
    assert red > 1000
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)
