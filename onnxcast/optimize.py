"""Optimised variants of an exported model: ``fp32-opt``, ``int8`` and ``fp16``.

Every transformation is followed by the ONNX checks, and every variant is validated on
its own afterwards (onnxcast.validate): simplifiers and quantizers have turned dynamic
shapes static and changed numbers before.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx

from onnxcast.errors import ExportError
from onnxcast.export import check_model, read_metadata, set_metadata

log = logging.getLogger(__name__)

# Per family, the op types dynamic INT8 quantizes. Attention's activation-by-activation
# MatMuls stay float in the Transformer (quantizing them cost accuracy, PITFALLS.md).
QUANTIZED_OPS = {"lstm": ["LSTM", "MatMul", "Gemm"], "transformer": ["MatMul", "Gemm"]}


@dataclass(frozen=True)
class Variant:
    name: str
    path: Path
    note: str = ""


def make_variants(fp32_path: str | Path, out_dir: str | Path, family: str,
                  variants: tuple[str, ...] = ("fp32-opt", "int8", "fp16")) -> list[Variant]:
    """Build the requested variants of ``fp32_path`` into ``out_dir``; fp32 is listed first."""
    fp32_path, out_dir = Path(fp32_path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    made = [Variant("fp32", fp32_path)]
    builders = {"fp32-opt": optimize_graph, "int8": quantize_dynamic_int8, "fp16": convert_fp16}
    for name in variants:
        target = out_dir / f"{name}.onnx"
        note = builders[name](fp32_path, target, family=family)
        made.append(Variant(name, target, note))
        log.info("variant %s: %s (%d bytes) %s", name, target, target.stat().st_size, note)
    return made


def optimize_graph(source: Path, target: Path, *, family: str) -> str:
    """onnxslim, then ORT offline optimisation at the portable EXTENDED level."""
    import onnxruntime as ort
    import onnxslim

    model = onnx.load(source)
    metadata = read_metadata(model)
    slimmed = onnxslim.slim(model)
    with tempfile.TemporaryDirectory() as tmp:
        slim_path = Path(tmp) / "slim.onnx"
        onnx.save_model(slimmed, slim_path)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        ort.InferenceSession(str(slim_path), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
    _finish(optimized, target, metadata, "fp32")
    return "onnxslim + ORT_ENABLE_EXTENDED"


def quantize_dynamic_int8(source: Path, target: Path, *, family: str) -> str:
    """Dynamic INT8 (weights int8, activations quantized at run time) after quant_pre_process."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    metadata = read_metadata(onnx.load(source))
    op_types = QUANTIZED_OPS.get(family, ["MatMul", "Gemm"])
    with tempfile.TemporaryDirectory() as tmp:
        pre = Path(tmp) / "pre.onnx"
        quantized = Path(tmp) / "int8.onnx"
        quant_pre_process(str(source), str(pre), skip_symbolic_shape=False)
        quantize_dynamic(str(pre), str(quantized), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=True, op_types_to_quantize=op_types)
        model = onnx.load(quantized)
    _finish(model, target, metadata, "int8")
    return f"dynamic int8 of {','.join(op_types)}, per-channel, reduce_range"


def convert_fp16(source: Path, target: Path, *, family: str) -> str:
    """Float16 weights and compute with float32 I/O (the contract's input stays float32)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(source)
    metadata = read_metadata(model)
    half = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False)
    _finish(_topologically_sorted(half), target, metadata, "fp16")
    return "float16 compute, float32 I/O"


def _topologically_sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    # The float16 converter appends the input Casts after their consumers.
    import onnx_ir as ir

    del model.graph.value_info[:]  # stale float32 types; shape inference recomputes them
    graph_model = ir.from_proto(model)
    graph_model.graph.sort()
    return ir.to_proto(graph_model)


def _finish(model: onnx.ModelProto, target: Path, metadata: dict[str, str], precision: str) -> None:
    set_metadata(model, {**metadata, "precision": precision})
    try:
        model = check_model(model, str(target))
    except ExportError:
        raise
    tmp = target.with_suffix(".tmp.onnx")
    onnx.save_model(model, tmp)
    os.replace(tmp, target)
