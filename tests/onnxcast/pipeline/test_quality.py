"""The data-quality gate: every corpus input gets the answer it should, reports are written and readable."""

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
from onnxcast.pipeline.expectations import REPORT_HTML, RESULT_JSON
from onnxcast.pipeline.fleet_data import split_fleet
from onnxcast.pipeline.quality import check_data, min_rows

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def base(example_csv) -> bytes:
    return Path(example_csv).read_bytes()


def run_case(case: Case, base: bytes, directory: Path):
    path = case.write(directory, base)
    cfg = case.config(str(path), str(directory / "run"))
    return cfg, directory / "run" / "quality"


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c.name for c in BAD_INPUTS])
def test_bad_input_fails_with_a_clear_error(case, base, tmp_path):
    cfg, quality_dir = run_case(case, base, tmp_path)
    with pytest.raises(DataError) as error:
        check_data(cfg, quality_dir)
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
    for failure in failures:  # in the verdict on top, word for word, and as a row of GX's table
        assert failure in page
        assert page.count(failure.split(": ")[0]) >= 2
    result = json.loads((quality_dir / RESULT_JSON).read_text())
    assert result["success"] is False


@pytest.mark.parametrize("case", GOOD_INPUTS, ids=[c.name for c in GOOD_INPUTS])
def test_good_input_passes(case, base, tmp_path):
    cfg, quality_dir = run_case(case, base, tmp_path)
    result = check_data(cfg, quality_dir)
    assert result.series.values.shape == (3600, 1)
    assert result.series.freq == "h"
    assert Path(result.html_path).exists() and Path(result.json_path).exists()
    json.dumps(result.to_dict())  # goes into report.json as is


def test_example_passes_without_warnings(example_csv, tmp_path, capfd):
    cfg = PipelineConfig(data_uri=example_csv, out_dir=str(tmp_path))
    result = check_data(cfg, tmp_path / "quality")
    assert result.warnings == [] and result.repairs == {}
    summary = result.to_dict()
    assert summary["passed"] and all(c["passed"] for c in summary["checks"])
    assert {c["check"] for c in summary["checks"]} >= {
        "required_columns", "enough_rows", "timestamps_parse", "timestamps_one_zone_style",
        "timestamps_unique", "timestamps_increasing", "timestamps_on_grid", "gap_share",
        "gaps_repairable", "edges_present", "values_numeric", "missing_share", "values_finite",
        "not_constant", "outlier_share"}
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # no GX progress bars, no GX log lines


def test_imperfect_input_passes_with_warnings_and_recorded_repairs(base, tmp_path):
    case = next(c for c in GOOD_INPUTS if c.name == "imperfect_with_repairs")
    cfg, quality_dir = run_case(case, base, tmp_path)
    result = check_data(cfg, quality_dir)
    warned = {c["check"] for c in result.checks if not c["passed"]}
    assert warned == {"timestamps_unique", "no_gaps", "no_missing", "no_outliers"}
    assert all(c["severity"] == "warning" for c in result.checks if not c["passed"])
    assert len(result.warnings) == 4
    assert "kept the last row of each (drop_duplicate_timestamps)" in result.warnings[0]
    assert result.repairs == {"fill_gaps": {"max_steps": 3, "interpolated_steps": 6},
                              "drop_duplicate_timestamps": {"dropped_rows": 2}}
    html = Path(result.html_path).read_text()
    assert "PASSED" in html and "Warnings (tolerated)" in html


def test_thresholds_come_from_settings(base, tmp_path):
    spikes = next(c for c in BAD_INPUTS if c.name == "outlier_spikes")
    cfg, quality_dir = run_case(spikes, base, tmp_path)
    loose = replace(cfg, quality=QualitySettings(max_outlier_fraction=0.02))
    result = check_data(loose, quality_dir)
    assert [c["check"] for c in result.checks if not c["passed"]] == ["no_outliers"]
    strict = replace(cfg, quality=QualitySettings(outlier_mad_threshold=1000.0))
    check_data(strict, quality_dir)  # spikes x100 are within 1000 robust sigmas


def test_a_week_missing_passes_when_the_gap_share_and_repair_allow_it(base, tmp_path):
    gap = next(c for c in BAD_INPUTS if c.name == "large_gap")
    cfg, quality_dir = run_case(gap, base, tmp_path)
    allowed = replace(cfg, quality=QualitySettings(max_gap_fraction=0.05, fill_gaps_max_steps=168))
    result = check_data(allowed, quality_dir)
    assert result.series.values.shape == (3600, 1)
    assert result.repairs["fill_gaps"]["interpolated_steps"] == 168


def test_feature_columns_are_checked_like_the_target(base, tmp_path):
    def with_feature(table):
        return [[*r, "" if i == 7 else str(i % 24)] for i, r in enumerate(table)]

    case = Case("feature_gap", "a feature with an empty value", edit(with_feature, header="ds,y,hour"), "",
                settings={"feature_columns": ("hour",)})
    cfg, quality_dir = run_case(case, base, tmp_path)
    with pytest.raises(DataQualityError, match=r"gaps .* longest 1 steps"):
        check_data(cfg, quality_dir)
    result = check_data(replace(cfg, quality=QualitySettings(fill_gaps_max_steps=1)), quality_dir)
    assert result.series.values.shape == (3600, 2)
    assert any(w.startswith("'hour' has no empty values") for w in result.warnings)


@pytest.mark.parametrize("lookback,horizon", [(168, 24), (24, 6), (500, 48)])
def test_min_rows_is_what_the_split_of_one_series_accepts(lookback, horizon):
    cfg = PipelineConfig(data_uri="x", out_dir="y", lookback=lookback, horizon=horizon)
    n = min_rows(cfg)
    split_fleet(np.array([n]), cfg)
    with pytest.raises(DataError):
        split_fleet(np.array([n - 1]), cfg)


def test_module_imports_neither_pandas_nor_great_expectations():
    code = ("import sys, onnxcast.pipeline.quality; "
            "assert not {'pandas', 'great_expectations'} & set(sys.modules), 'heavy import at module level'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)")
def test_html_report_renders_the_verdict_in_a_browser(base, tmp_path):
    from PIL import Image

    case = next(c for c in BAD_INPUTS if c.name == "duplicate_timestamps")
    cfg, quality_dir = run_case(case, base, tmp_path)
    with pytest.raises(DataQualityError):
        check_data(cfg, quality_dir)
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900",
                    f"--screenshot={shot}", (quality_dir / REPORT_HTML).as_uri()],
                   check=True, capture_output=True, timeout=90)
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 900)
    # The verdict box on top has a red (#cf222e) border: the page is styled even offline.
    red = sum(1 for r, g, b in image.getdata() if r > 180 and g < 80 and b < 80)
    assert red > 1000
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)
