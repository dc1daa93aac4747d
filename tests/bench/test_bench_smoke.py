"""`bench/run.py --quick` end to end: trains for seconds, measures every candidate, writes both files."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_bench_writes_rows_for_every_candidate(tmp_path):
    results, markdown = tmp_path / "results.json", tmp_path / "results.md"
    subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--threads", "1",
                    "--out-dir", str(tmp_path / "run"), "--results", str(results), "--markdown", str(markdown)],
                   check=True, capture_output=True, text=True, timeout=360)  # five families, OpenVINO rows too
    report = json.loads(results.read_text())
    cells = {(r["family"], r["variant"], r["batch"]) for r in report["rows"]}
    for family in ("lstm", "transformer", "nhits", "dlinear"):
        for variant in ("torch", "fp32", "fp32-opt", "int8", "fp16"):
            assert {(family, variant, 1), (family, variant, 64), (family, variant, 1024)} <= cells
        if importlib.util.find_spec("openvino") is not None:  # the openvino target, timed against ORT's fp32
            assert {(family, "openvino-fp32", b) for b in (1, 64, 1024)} <= cells
        cost = report["cost_per_forecast"][family]["1024"]
        assert cost["flops"] > 0 and cost["bytes"] > 0
    for row in report["rows"]:
        assert row["p50_ms"] > 0 and row["p95_ms"] >= row["p50_ms"] and row["throughput_per_s"] > 0
        assert row["size_bytes"] > 0 and row["holdout_mae"] > 0
        assert row["roofline_ms"] > 0 and row["x_roofline"] > 0 and row["roofline_bound"] in ("compute", "memory")
        # an INT8 variant's quantized products are held to the int8 peak, the others' to float32
        assert (row["int8_ops_per_forecast"] > 0) == (row["variant"] == "int8"), row
    assert report["gemm_peak_gflops"] > 0 and report["machine"]
    assert report["memory_bandwidth_gbs_by_threads"]["1"] > 0 and report["int8_gemm_peak_gops_by_threads"]["1"] > 0
    load = report["load_average"]
    assert load["disturbed"] == (load["before"] > 0.5 or load["after"] > 1.5)
    # training throughput of every family, then and now, at the example's and a fleet's shapes
    training = {(r["family"], r["data"], r["variant"]) for r in report["training"]}
    for family in ("lstm", "transformer", "nhits", "dlinear"):
        assert {(family, data, v) for data in ("series", "fleet") for v in ("before", "after")} <= training
    assert sum(g["goal"].startswith("training (") for g in report["goals"]) == 2
    assert set(report["selected"]) in ({"edge", "cloud"}, set())
    for family, judged in report["gates"].items():  # the pipeline's own gates, baseline included
        assert judged["passed"] == (not judged["failures"])
        for variant, gates in judged["variants"].items():
            assert "beats_seasonal_naive" in gates and "accuracy_vs_fp32" in gates, (family, variant)
    assert "| family | variant |" in markdown.read_text()
    if importlib.util.find_spec("openvino") is not None:
        assert "| family | threads | batch | ONNX Runtime p50 ms | OpenVINO p50 ms | ORT / OpenVINO |" \
            in markdown.read_text()
    # the ensemble of the four, timed against its members in the same run
    ensemble = report["ensemble"]
    assert ensemble["members"] and set(ensemble["members"]) <= {"lstm", "transformer", "nhits", "dlinear"}
    assert {("fp32", b) for b in (1, 64, 1024)} <= {(c["variant"], c["batch"]) for c in ensemble["cells"]}
    assert all(c["ensemble_p50_ms"] > 0 and c["members_sum_p50_ms"] >= c["slowest_member_p50_ms"] > 0
               for c in ensemble["cells"])
    assert "The ensemble of" in markdown.read_text()


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("onnxcast_bench_run", REPO / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_judges_with_the_pipeline_gates_and_unmeasured_parity_fails():
    """Issue 9: the benchmark hard-coded ``gates_passed: True``, skipped the baseline gate and
    crashed formatting a parity that was never measured (None)."""
    from onnxcast.pipeline.config import PipelineConfig

    bench = _bench_module()
    cfg = PipelineConfig(data_uri="x", out_dir="o", accuracy_budget=0.01)

    def candidate(variant, mae, parity):
        return bench.Candidate(family="lstm", variant=variant, size_bytes=100, make=None, probe=[],
                               holdout_mae=mae, parity=parity)

    candidates = [candidate("torch", 10.0, None), candidate("fp32", 10.0, 0.5), candidate("fp32-opt", 10.0, None),
                  candidate("int8", 10.5, None)]
    rows = [{"variant": c.variant, "threads": 1, "batch": b, "p50_ms": 1.0, "p95_ms": 1.2}
            for c in candidates for b in (1, 64)]
    entry = bench._selection_entry("lstm", rows, candidates, cfg, 1, baseline_mae=9.0)
    assert entry["gates_passed"] is False
    assert any("fp32-opt parity" in f and "not measured" in f for f in entry["failures"])
    assert any("does not beat the best baseline (seasonal naive) 9" in f for f in entry["failures"])
    by_name = {v["name"]: v for v in entry["variants"]}
    assert by_name["int8"]["gates"]["accuracy_vs_fp32"]["passed"] is False
    assert not any(v["eligible"] for v in entry["variants"])
