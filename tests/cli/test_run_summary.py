"""The run summary the CLI (and scripts/demo.py) prints after a pipeline run: a fleet run's
series counts and mean MASE per family; a one-series run's summary exactly as before."""

from __future__ import annotations

import json

from fleet_run_fixtures import build_fleet_run

REPORT = {
    "baselines": {"seasonal_naive": {"mae": 451.0, "mae_ci95": [430.0, 470.0], "mase": 1.0},
                  "candidates": {"naive": {"mae": 900.5, "mae_ci95": [850.0, 950.0], "mase": 2.0},
                                 "seasonal_naive_336": {"mae": 451.0, "mae_ci95": [430.0, 470.0], "mase": 1.0}},
                  "best": "seasonal_naive_336", "origins": {"count": 24, "stride": 7}},
    "reference": {"model": "MSTL", "mae": 294.0, "mae_ci95": [280.0, 310.0], "mase": 0.65},
    "models": [{"family": "lstm", "gates_passed": True,
                "torch": {"holdout": {"mae": 300.0, "mae_ci95": [290.0, 310.0]}, "latency_ms": {"batch1_p50": 0.42}},
                "fp32_vs": {"seasonal_naive_336": {"mae_ratio": 0.66, "p_value": 0.0012}},
                "variants": [{"name": "fp32", "holdout": {"mae": 300.1}, "size_bytes": 81920, "eligible": True,
                              "reasons": [], "speedup_vs_torch": {"batch1_p50": 2.5, "batch64_p50": 1.8}},
                             {"name": "int8", "holdout": {"mae": 305.0}, "size_bytes": 20480, "eligible": False,
                              "reasons": ["accuracy 1.6% worse than fp32"],
                              "speedup_vs_torch": {"batch1_p50": 3.1, "batch64_p50": 2.2}}]}],
    "family_choice": {"best": "lstm", "tied_with_best": ["lstm"]},
    "selected": {"edge": {"family": "lstm", "variant": "fp32"}, "cloud": {"family": "lstm", "variant": "fp32"}},
}

SINGLE_SERIES_SUMMARY = """\
report: out/report.json
holdout: 24 forecast origins, one every 7 steps (every phase of the season); MAE with its 95% interval
  naive                MAE 900.5 [850, 950]  MASE 2.000
  seasonal_naive_336   MAE 451 [430, 470]  MASE 1.000  <- the baseline to beat
  reference MSTL: MAE 294 [280, 310]  MASE 0.650
lstm: torch MAE 300 [290, 310], x0.66 of seasonal_naive_336 (p=0.0012), batch1 p50 0.42 ms
  fp32     MAE 300.1  size 80 KiB  b1 x2.50  b64 x1.80  eligible
  int8     MAE 305  size 20 KiB  b1 x3.10  b64 x2.20  not eligible: accuracy 1.6% worse than fp32
selected for edge: lstm fp32
selected for cloud: lstm fp32"""


def test_one_series_summary_is_unchanged():
    from onnxcast.cli import summarize_report

    assert summarize_report(REPORT, "out/") == SINGLE_SERIES_SUMMARY


def test_fleet_summary_names_series_and_judges_each_family_on_mean_mase(tmp_path):
    from onnxcast.cli import summarize_report

    run = build_fleet_run(tmp_path / "run", skills={"nhits": 0.8, "dlinear": 0.95})
    report = json.loads((run / "report.json").read_text())
    lines = summarize_report(report, str(run)).splitlines()
    fleet = report["fleet"]
    assert lines[0] == f"report: {run / 'report.json'}"
    assert lines[1].startswith("fleet: 60 series kept, 2 excluded (1 constant, 1 too_short), 1 padded")
    best, ets = fleet["baselines"]["best_naive"], fleet["reference"]["aggregates"]["AutoETS"]
    assert lines[2].split() == ["best", "naive", "MASE", f"{best['mase_mean']:.4g}",
                                f"[{best['mase_ci95'][0]:.4g},", f"{best['mase_ci95'][1]:.4g}]",
                                "sMAPE", f"{best['smape_mean']:.4g}"]
    assert lines[3].split()[:3] == ["AutoETS", "MASE", f"{ets['mase_mean']:.4g}"]
    nhits = next(line for line in lines if line.startswith("nhits: "))
    fp32 = fleet["families"]["nhits"]["fp32"]
    tests = fleet["tests"]["nhits"]
    assert nhits.startswith(f"nhits: fp32 MASE {fp32['mase_mean']:.4g} [{fp32['mase_ci95'][0]:.4g}, "
                            f"{fp32['mase_ci95'][1]:.4g}], vs best naive {best['mase_mean']:.4g} "
                            f"(x{fp32['mase_mean'] / best['mase_mean']:.2f}, p={tests['vs_best_naive']['p_value']:.2g})"
                            f", vs AutoETS {ets['mase_mean']:.4g}")
    assert nhits.endswith(f"loses to the best naive on {fp32['loses_share']:.0%} of series")
    assert any(line.startswith("  int8     MASE ") and line.endswith("eligible") for line in lines)
    assert lines[-2:] == [f"selected for edge: {report['selected']['edge']['family']} int8",
                          f"selected for cloud: {report['selected']['cloud']['family']} fp32"]
    assert not any("MAE" in line for line in lines)  # a fleet is judged on MASE, never one series' MAE


def with_intervals(report: dict) -> dict:
    """REPORT with the interval figures of forecast distributions (report.json's keys)."""
    report = json.loads(json.dumps(report))
    figures = {"coverage_80": 0.812, "coverage_95": 0.9375, "msis_95": 5.1234, "pinball": 0.3}
    report["baselines"]["seasonal_naive"]["intervals"] = {**figures, "coverage_80": 0.75, "msis_95": 9.87}
    report["reference"]["intervals"] = {**figures, "coverage_95": 0.96, "msis_95": 6.5}
    report["models"][0]["variants"][0]["holdout"]["intervals"] = figures
    return report


def test_one_series_summary_shows_coverage_and_msis_where_the_report_has_them():
    from onnxcast.cli import summarize_report

    lines = summarize_report(with_intervals(REPORT), "out/").splitlines()
    assert lines[3] == ("  seasonal_naive_336   MAE 451 [430, 470]  MASE 1.000  80%/95% cover 75.0%/93.8%  MSIS 9.87"
                        "  <- the baseline to beat")
    assert lines[2] == SINGLE_SERIES_SUMMARY.splitlines()[2]  # naive: no intervals of its own
    assert lines[4] == "  reference MSTL: MAE 294 [280, 310]  MASE 0.650  80%/95% cover 81.2%/96.0%  MSIS 6.5"
    assert lines[6] == ("  fp32     MAE 300.1  80%/95% cover 81.2%/93.8%  MSIS 5.123  size 80 KiB  b1 x2.50  "
                        "b64 x1.80  eligible")
    assert lines[7] == SINGLE_SERIES_SUMMARY.splitlines()[7]  # int8 without figures: as before


def test_fleet_summary_shows_mean_coverage_and_msis_over_series(tmp_path):
    from fleet_run_fixtures import add_intervals

    from onnxcast.cli import summarize_report

    run = add_intervals(build_fleet_run(tmp_path / "run", skills={"nhits": 0.8, "dlinear": 0.95}),
                        {"nhits": 0.8, "dlinear": 0.95})
    report = json.loads((run / "report.json").read_text())
    lines = summarize_report(report, str(run)).splitlines()
    fleet = report["fleet"]

    def bands(figures: dict) -> str:
        return (f"80%/95% cover {figures['coverage_80']:.1%}/{figures['coverage_95']:.1%}  "
                f"MSIS {figures['msis_95']:.4g}")

    assert lines[2].endswith(bands(fleet["baselines"]["best_naive"]["intervals"]))
    assert lines[3].startswith("  AutoETS ") and lines[3].endswith(bands(fleet["reference"]["aggregates"]["AutoETS"]
                                                                         ["intervals"]))
    family = report["selected"]["edge"]["family"]
    start = lines.index(next(line for line in lines if line.startswith(f"{family}: ")))
    int8 = fleet["families"][family]["int8"]
    size = next(m for m in report["models"] if m["family"] == family)["variants"][1]["size_bytes"]
    assert lines[start + 2] == (f"  int8     MASE {int8['mase_mean']:.4g}  {bands(int8['intervals'])}  size "
                                f"{size / 1024:.0f} KiB  eligible")
