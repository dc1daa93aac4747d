"""Export a trained forecaster to ONNX with dynamic ``batch`` and ``time`` axes.

The ONNX contract: one input ``history`` float32 ``[batch, time, n_features]``, the output
``forecast`` float32 ``[batch, horizon]`` and, for a calibrated model, ``quantiles`` float32
``[batch, horizon, Q]`` (onnxcast.pipeline.intervals), ``metadata_props`` describing the model. The
dynamo exporter is used with ``torch.export.Dim`` objects (``dynamic_axes`` alone kept the
batch fixed), and an example batch of 2 so no optimizer can specialise batch to 1.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

from onnxcast.base.contract import (
    INPUT_NAME,
    NONNEGATIVE_METADATA,
    OUTPUT_NAME,
    QUANTILES_NAME,
    contract_problems,
    opset_of,
    quantile_problems,
    read_metadata,
    set_metadata,
    signature,
)
from onnxcast.base.errors import ExportError
from onnxcast.base.files import replacing

log = logging.getLogger(__name__)

# By the model's core, never by a name: a fetched champion runs as the task "champion".
# nn.LSTM goes through the TorchScript exporter: the dynamo exporter fixed its time axis after a
# first export in the process (torch 2.13; tests/onnxcast/pipeline/test_export.py) and failed to
# decompose the export form of one (a second LSTM run against an LSTM champion, 2026-12-02).
EXPORTER = {"LSTMCore": "torchscript"}
TORCHSCRIPT_OPSET = 17


def export_onnx(model: torch.nn.Module, path: str | Path, *, n_features: int, lookback: int,
                metadata: dict[str, str], opset: int | None = None, exporter: str | None = None,
                as_written: bool = False) -> Path:
    """Export ``model`` to ``path`` (written atomically), check it, and return the path. A
    model with quantile offsets (``has_quantiles``) gets the ``quantiles`` output too; its
    ``metadata`` must then name the ``quantile_levels``.

    What is traced is the model's export form (onnxcast.pipeline.graph_forms: the same function
    in fewer, cheaper ONNX ops); ``as_written`` traces the module as it is (the benchmark's
    comparison). The metadata gets ``nonnegative`` ("true": the forecast and quantiles are
    clipped at 0 in the graph, the target was never negative in training; absent in models
    exported before it: not clipped)."""
    from onnxcast.pipeline.graph_forms import graph_form
    from onnxcast.pipeline.models import WithQuantiles

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.eval()
    example = torch.zeros(2, lookback, n_features)
    example[:, :, 0] = torch.linspace(0.0, 1.0, lookback)  # non-constant, like real data
    window = getattr(model, "min_history", None)  # window families read the newest ``lookback`` steps
    quantiles = bool(getattr(model, "has_quantiles", False))
    outputs = [OUTPUT_NAME, QUANTILES_NAME] if quantiles else [OUTPUT_NAME]
    name = type(model.core).__name__
    # an ensemble's members are its core: the TorchScript exporter if any member needs it
    cores = [type(m.core).__name__ for m in model.core] if isinstance(model.core, torch.nn.ModuleList) else [name]
    exporter = exporter or next((EXPORTER[c] for c in cores if c in EXPORTER), "dynamo")
    try:
        traced = (WithQuantiles(model) if quantiles else model) if as_written else graph_form(model)
    except (TypeError, ValueError) as exc:
        raise ExportError(f"no export form for {name}: {exc}") from exc
    _quiet_torchvision_registry()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            proto = (_export_dynamo(traced.eval(), example, min_time=window or 2, outputs=outputs)
                     if exporter == "dynamo" else _export_torchscript(traced.eval(), example, outputs=outputs))
    except Exception as exc:  # torch.export raises many types; report them as one
        raise ExportError(f"torch.onnx.export failed for {name}: {str(exc).splitlines()[0]}") from exc
    if window:
        slice_window_from_the_end(proto, window)
    if opset is not None:
        proto = convert_opset(proto, opset)
    # the clip at 0 of a never-negative target is in the graph (graph_forms); the metadata says so
    set_metadata(proto, {**metadata, NONNEGATIVE_METADATA: str(bool(getattr(model, "nonnegative", False))).lower()})
    proto = check_model(proto, str(path))
    # value_info stays: the exporter's symbolic shapes are what attention fusion reads
    strip_annotations(proto, keep_value_info=True)
    with replacing(path) as tmp:
        onnx.save_model(proto, tmp)
    log.info("exported %s (%d bytes, opset %d)", path, path.stat().st_size, opset_of(proto))
    return path


def _export_dynamo(model: torch.nn.Module, example: torch.Tensor, min_time: int = 2,
                   outputs: list[str] | None = None) -> onnx.ModelProto:
    # a window family reads the last ``lookback`` steps: its time axis starts there
    batch, time = torch.export.Dim("batch", min=1), torch.export.Dim("time", min=max(2, min_time))
    program = torch.onnx.export(
        model, (example,), dynamo=True, input_names=[INPUT_NAME], output_names=outputs or [OUTPUT_NAME],
        dynamic_shapes={"history": {0: batch, 1: time}}, optimize=True, verbose=False,
    )
    return program.model_proto


def slice_window_from_the_end(proto: onnx.ModelProto, lookback: int) -> int:
    """Read the window of a window family as ``history[:, -lookback:]``; returns the Slices changed.

    The model slices ``history[:, time - lookback:]`` and the exporter writes the start as
    ``Sub(Shape(history)[1], lookback)``. torch.export knew ``time >= lookback`` (the Dim's
    min), ONNX has no way to say so, and ONNX Runtime's symbolic shape inference (int8's
    pre-processing) warned "Cannot determine if time - 168 < 0" on every window-family run.
    A start of ``-lookback`` is the same slice for every history the contract allows (at least
    ``lookback`` steps) and has a static length, so nothing is left to determine.
    """
    graph = proto.graph
    producer = {out: node for node in graph.node for out in node.output}
    constants = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer}
    changed = 0
    for node in graph.node:
        if node.op_type != "Slice" or len(node.input) < 4 or node.input[0] != INPUT_NAME:
            continue
        if constants.get(node.input[3]) is None or constants[node.input[3]].tolist() not in ([1], 1):
            continue  # not the time axis
        chain = _start_chain(producer, node.input[1])
        if chain is None or constants.get(chain[1].input[1]) is None or int(constants[chain[1].input[1]]) != lookback:
            continue
        name = f"{node.name or 'slice'}_start_from_end"
        graph.initializer.append(onnx.numpy_helper.from_array(np.array([-lookback], dtype=np.int64), name))
        node.input[1] = name
        changed += 1
    if changed:
        _drop_unused_nodes(graph)
    return changed


def _start_chain(producer: dict, name: str):
    """``(Reshape, Sub, Squeeze, Shape)`` computing ``history.shape[1] - c`` into ``name``, or None."""
    reshape = producer.get(name)
    sub = producer.get(reshape.input[0]) if reshape is not None and reshape.op_type == "Reshape" else None
    squeeze = producer.get(sub.input[0]) if sub is not None and sub.op_type == "Sub" else None
    shape = producer.get(squeeze.input[0]) if squeeze is not None and squeeze.op_type == "Squeeze" else None
    if shape is None or shape.op_type != "Shape" or shape.input[0] != INPUT_NAME:
        return None
    span = {a.name: onnx.helper.get_attribute_value(a) for a in shape.attribute}
    if (span.get("start"), span.get("end")) != (1, 2):
        return None
    return reshape, sub, squeeze, shape


def _drop_unused_nodes(graph: onnx.GraphProto) -> None:
    """Remove nodes (and initializers) nothing reads any more, until none is left."""
    outputs = {o.name for o in graph.output}
    while True:
        used = {i for node in graph.node for i in node.input} | outputs
        dead = [node for node in graph.node if not any(o in used for o in node.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    used = {i for node in graph.node for i in node.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)


def _quiet_torchvision_registry() -> None:
    """Drop torch's four "torchvision is not installed. Skipping torchvision::nms" (roi_align,
    roi_pool, deform_conv2d) warnings, printed on every dynamo export: its ONNX registry
    offers torchvision's ops, which no onnxcast model uses and onnxcast does not install.
    Only that message of that logger; anything else it says still shows."""
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    if not any(isinstance(f, _TorchvisionAbsent) for f in registry.filters):
        registry.addFilter(_TorchvisionAbsent())


class _TorchvisionAbsent(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "torchvision is not installed. Skipping %s"
                    and str(record.args[0] if record.args else "").startswith("torchvision::"))


def _export_torchscript(model: torch.nn.Module, example: torch.Tensor,
                        outputs: list[str] | None = None) -> onnx.ModelProto:
    import io

    outputs = outputs or [OUTPUT_NAME]
    buffer = io.BytesIO()
    torch.onnx.export(
        model, (example,), buffer, dynamo=False, input_names=[INPUT_NAME], output_names=outputs,
        dynamic_axes={INPUT_NAME: {0: "batch", 1: "time"}, **{name: {0: "batch"} for name in outputs}},
        opset_version=TORCHSCRIPT_OPSET, do_constant_folding=True,
    )
    return onnx.load_from_string(buffer.getvalue())


def check_model(proto: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """onnx.checker (full) and strict shape inference; then the I/O contract. Returns the
    shape-inferred model."""
    try:
        onnx.checker.check_model(proto, full_check=True)
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"{name}: ONNX check failed: {str(exc).splitlines()[0]}") from exc
    problems = (io_contract_problems(inferred) + quantile_problems(signature(inferred), read_metadata(inferred))
                + static_axis_problems(signature(inferred)))
    if problems:
        raise ExportError(f"{name}: " + "; ".join(problems))
    return inferred


def strip_annotations(model: onnx.ModelProto, keep_value_info: bool = False) -> None:
    """Drop what only describes the graph: inferred value_info (ORT infers shapes itself),
    per-node exporter annotations (stack traces, ~1 KB a node) and doc strings. On small
    models they were a tenth of the file and more, which edge devices download for nothing."""
    if not keep_value_info:
        del model.graph.value_info[:]
    for node in model.graph.node:
        node.doc_string = ""
        del node.metadata_props[:]


def static_axis_problems(sig: dict) -> list[str]:
    """An exported model's outputs have a fixed size on every axis but the batch: the horizon,
    and the levels of ``quantiles`` (what the manifest's signature, the device's level check and
    the Triton config are written from; a Reshape to ``-1`` once left them symbolic)."""
    return [f"output {o['name']!r} has shape {o['shape']}: every axis but the batch must be fixed"
            for o in sig["outputs"] if not all(isinstance(d, int) for d in o["shape"][1:])]


def io_contract_problems(proto: onnx.ModelProto) -> list[str]:
    """Differences between the model's inputs/outputs and the ONNX contract."""
    return contract_problems(signature(proto))


def convert_opset(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """Convert to ``opset`` with onnx's version converter; ExportError if it cannot."""
    from onnx import version_converter

    if opset_of(proto) == opset:
        return proto
    try:
        return version_converter.convert_version(proto, opset)
    except Exception as exc:  # the converter raises RuntimeError/ValueError/C++ errors
        raise ExportError(f"cannot convert from opset {opset_of(proto)} to {opset}: {str(exc).splitlines()[0]}") from exc
