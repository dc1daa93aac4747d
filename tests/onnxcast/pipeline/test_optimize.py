"""Optimised variants stay dynamic and honest; channels are chosen by goals.

Models are untrained but real-size (hidden 64, 2 layers): sizes and graph structure are what
the pipeline ships, and untrained weights are enough to compare variants with each other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnxcast.pipeline.report import select_variants
from onnxcast.pipeline.validate import judge_variants

HORIZON, LOOKBACK, SEASON = 12, 48, 24
# shapes unlike the export's example (batch 2, lookback): batch 1, odd batches, longer
# histories (the contract: any history of at least the lookback)
SHAPES = [(1, LOOKBACK), (5, LOOKBACK + 1), (9, 101), (64, LOOKBACK)]
METADATA = {"model_family": "", "lookback": LOOKBACK, "horizon": HORIZON, "freq": "h", "target": "y",
            "features": "", "precision": "fp32", "trained_until": "2024-01-01T00:00:00Z", "dataset_sha256": "0"}


@pytest.fixture(scope="module", params=["lstm", "transformer", "nhits"])
def variants(request, tmp_path_factory) -> tuple[str, dict[str, Path]]:
    import torch

    from onnxcast.pipeline.export import export_onnx
    from onnxcast.pipeline.models import ModelSpec, build_model
    from onnxcast.pipeline.optimize import make_variants

    family = request.param
    torch.manual_seed(0)
    spec = ModelSpec(family=family, n_features=1, horizon=HORIZON, lookback=LOOKBACK, season=SEASON,
                     seasons=(SEASON, LOOKBACK))
    model = build_model(spec, np.array([100.0]), np.array([10.0])).eval()
    out = tmp_path_factory.mktemp(family)
    fp32 = export_onnx(model, out / "fp32.onnx", n_features=1, lookback=LOOKBACK,
                       metadata={**METADATA, "model_family": family})
    return family, {v.name: v.path for v in make_variants(fp32, out, family)}


def _session(path: Path):
    from onnxcast.pipeline.sessions import onnx_session

    return onnx_session(path, threads=1)


def _history(batch: int, time: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    steps = np.arange(time)
    level = 100.0 + 10.0 * np.sin(2 * np.pi * steps / SEASON)
    return (level[None, :, None] + rng.normal(0, 3.0, (batch, time, 1))).astype(np.float32)


def test_every_variant_runs_at_shapes_unlike_the_export(variants):
    _, paths = variants
    for name, path in paths.items():
        session = _session(path)
        for i, (batch, time) in enumerate(SHAPES):
            out = session.run(["forecast"], {"history": _history(batch, time, i)})[0]
            assert out.shape == (batch, HORIZON), f"{name} at {(batch, time)}"
            assert np.isfinite(out).all(), name


def test_fp32_opt_matches_fp32_within_the_parity_tolerance(variants):
    _, paths = variants
    reference, optimized = _session(paths["fp32"]), _session(paths["fp32-opt"])
    for i, (batch, time) in enumerate(SHAPES):
        x = _history(batch, time, i)
        expected = reference.run(["forecast"], {"history": x})[0].astype(np.float64)
        got = optimized.run(["forecast"], {"history": x})[0]
        assert np.all(np.abs(got - expected) <= 1e-4 + 1e-3 * np.abs(expected)), (batch, time)


def test_transformer_attention_is_fused_and_lstm_outputs_are_trimmed(variants):
    import onnx

    family, paths = variants
    ops = [n.op_type for n in onnx.load(paths["fp32-opt"]).graph.node]
    int8_ops = [n.op_type for n in onnx.load(paths["int8"]).graph.node]
    if family == "nhits":  # every Gemm/MatMul of a weight is int8: 3 blocks x 4 layers (less the last,
        # unused backcast) and the 3 interpolations; the export form's exact products (the
        # anchors' mix, the quantiles' map) stay float
        from onnxcast.pipeline.graph_forms import EXACT_MATRICES

        exact = [n for n in onnx.load(paths["fp32"]).graph.node if n.op_type in ("Gemm", "MatMul")
                 and n.input[1] in EXACT_MATRICES]
        assert int8_ops.count("MatMulInteger") == 14
        assert int8_ops.count("MatMul") + int8_ops.count("Gemm") == len(exact) >= 1
        return
    if family == "transformer":
        assert ops.count("Attention") == 2 and "Softmax" not in ops
        assert int8_ops.count("QAttention") == 2
    else:
        lstms = [n for n in onnx.load(paths["fp32-opt"]).graph.node if n.op_type == "LSTM"]
        assert len(lstms) == 2
        assert [len(n.input) for n in lstms] == [4, 4]  # zero initial states dropped
        assert lstms[1].output[0] == ""  # the last layer's per-step output is not computed
        assert int8_ops.count("DynamicQuantizeLSTM") == 2


def test_int8_is_at_most_30_percent_of_fp32(variants):
    _, paths = variants
    assert paths["int8"].stat().st_size <= 0.30 * paths["fp32"].stat().st_size


# --- selection by goals ---------------------------------------------------------------------

def _variant(name: str, mae: float, b1: float, b64: float, size: int, eligible: bool = True) -> dict:
    """A measured variant; ``eligible=False`` gives it a failed parity gate."""
    gates = {} if eligible else {"parity": {"passed": False, "value": 3.0, "threshold": 1.0}}
    return {"name": name, "holdout": {"mae": mae}, "size_bytes": size, "gates": gates,
            "parity_max_abs_diff": 0.0, "latency_ms": {"batch1_p50": b1, "batch64_p50": b64}}


def _model(family: str, torch_b1: float, torch_b64: float, variants: list[dict], budget: float = 0.01) -> dict:
    """A family's report entry with its gates decided by the validation's own judge_variants."""
    torch_latency = {"batch1_p50": torch_b1, "batch64_p50": torch_b64}
    failures = judge_variants(variants, baseline_mae=1e9, torch_latency=torch_latency, accuracy_budget=budget)
    return {"family": family, "gates_passed": not failures, "failures": failures,
            "fp32_holdout_mae": variants[0]["holdout"]["mae"], "torch": {"latency_ms": torch_latency},
            "variants": variants}


def test_selection_picks_the_fastest_variant_within_the_accuracy_budget_that_beats_torch():
    transformer = _model("transformer", 1.5, 200.0, [
        _variant("fp32", 10.0, 1.0, 100.0, 400),
        _variant("fp32-opt", 10.0, 0.5, 60.0, 300),
        _variant("int8", 10.2, 0.4, 50.0, 100),     # fastest but 2% worse: over budget
        _variant("fp16", 10.0, 0.45, 300.0, 250, eligible=False),  # failed a gate
    ])
    lstm = _model("lstm", 0.8, 10.0, [_variant("fp32", 12.0, 0.1, 5.0, 280)])  # faster but less accurate
    selected, ranking = select_variants([lstm, transformer])
    assert selected == {"edge": {"family": "transformer", "variant": "fp32-opt"},
                        "cloud": {"family": "transformer", "variant": "fp32-opt"}}
    rows = {(r["family"], r["variant"]): r for r in ranking}
    assert rows[("transformer", "fp32-opt")]["chosen_for"] == ["edge", "cloud"]
    assert rows[("transformer", "fp32-opt")]["rank"] == {"edge": 1, "cloud": 1}
    assert rows[("transformer", "fp32")]["rank"] == {"edge": 2, "cloud": 2}
    assert rows[("transformer", "int8")]["within_accuracy_budget"] is False
    assert rows[("transformer", "int8")]["rank"] == {}
    assert rows[("transformer", "fp16")]["beats_torch"] == {"edge": True, "cloud": False}
    assert rows[("transformer", "fp32-opt")]["speedup_vs_torch"]["edge"] == pytest.approx(3.0)


def test_selection_falls_back_when_nothing_beats_torch_and_says_so():
    lstm = _model("lstm", 0.8, 10.0, [_variant("fp32", 12.0, 0.3, 13.0, 280),
                                      _variant("fp32-opt", 12.0, 0.35, 12.0, 200)])
    selected, ranking = select_variants([lstm])
    assert selected["edge"] == {"family": "lstm", "variant": "fp32"}
    assert selected["cloud"] == {"family": "lstm", "variant": "fp32-opt"}  # fastest, though slower than torch
    cloud = next(r for r in ranking if r["variant"] == "fp32-opt")
    assert any("no variant beats PyTorch" in reason for reason in cloud["reasons"])


def test_selection_tries_the_next_family_when_the_most_accurate_cannot_beat_torch():
    slow = _model("transformer", 1.5, 100.0, [_variant("fp32", 10.0, 0.5, 150.0, 400)])
    fast = _model("lstm", 0.8, 10.0, [_variant("fp32", 10.05, 0.3, 8.0, 280)])
    selected, _ = select_variants([slow, fast])
    assert selected == {"edge": {"family": "transformer", "variant": "fp32"},
                        "cloud": {"family": "lstm", "variant": "fp32"}}


def test_selection_is_empty_when_no_family_passed_its_gates():
    failed = {**_model("lstm", 1.0, 10.0, [_variant("fp32", 1.0, 0.5, 5.0, 1)]), "gates_passed": False}
    selected, ranking = select_variants([failed])
    assert selected == {} and len(ranking) == 1


def test_selection_uses_the_accuracy_budget_the_validation_used():
    """Issue 9: validation judged int8 (2% worse) eligible under a 3% budget, and the choice
    re-derived the gate at the default 1%: an eligible variant could never be chosen."""
    variants = [_variant("fp32", 10.0, 1.0, 100.0, 400), _variant("int8", 10.2, 0.4, 50.0, 100)]
    transformer = _model("transformer", 1.5, 200.0, variants, budget=0.03)
    assert variants[1]["eligible"] and variants[1]["gates"]["accuracy_vs_fp32"]["threshold"] == 0.03
    selected, ranking = select_variants([transformer])
    assert selected["edge"] == {"family": "transformer", "variant": "int8"}
    assert next(r for r in ranking if r["variant"] == "int8")["within_accuracy_budget"] is True


def test_a_failed_variant_is_reported_with_unmeasured_figures_as_none():
    variants = [_variant("fp32", 10.0, 1.0, 100.0, 400),
                {"name": "fp16", "holdout": None, "size_bytes": 5, "latency_ms": {}, "parity_max_abs_diff": None,
                 "gates": {"runs_on_cpu": {"passed": False, "value": "NOT_IMPLEMENTED", "threshold": "cpu"}}}]
    model = _model("lstm", 1.5, 200.0, variants)
    assert model["gates_passed"] and not variants[1]["eligible"]
    assert variants[1]["reasons"] == ["runs_on_cpu: NOT_IMPLEMENTED vs threshold cpu"]
    selected, ranking = select_variants([model])
    assert selected["edge"] == {"family": "lstm", "variant": "fp32"}
    assert next(r for r in ranking if r["variant"] == "fp16")["holdout_mae"] is None
