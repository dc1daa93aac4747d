"""Export a trained forecaster to ONNX with dynamic ``batch`` and ``time`` axes.

The ONNX contract: one input ``history`` float32 ``[batch, time, n_features]``, one output
``forecast`` float32 ``[batch, horizon]``, ``metadata_props`` describing the model. The
dynamo exporter is used with ``torch.export.Dim`` objects (``dynamic_axes`` alone kept the
batch fixed), and an example batch of 2 so no optimizer can specialise batch to 1.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import onnx
import torch

from onnxcast.contract import (  # noqa: F401  (re-exported: the exporter's view of the contract)
    INPUT_NAME,
    OUTPUT_NAME,
    REQUIRED_METADATA,
    contract_problems,
    missing_metadata,
    opset_of,
    read_metadata,
    signature,
)
from onnxcast.contract import set_metadata as write_metadata
from onnxcast.errors import ExportError

log = logging.getLogger(__name__)

EXPORTER = {"lstm": "torchscript", "transformer": "dynamo"}
TORCHSCRIPT_OPSET = 17


def export_onnx(model: torch.nn.Module, path: str | Path, *, n_features: int, lookback: int,
                metadata: dict[str, str], opset: int | None = None, exporter: str | None = None) -> Path:
    """Export ``model`` to ``path`` (written atomically), check it, and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.eval()
    example = torch.zeros(2, lookback, n_features)
    example[:, :, 0] = torch.linspace(0.0, 1.0, lookback)  # non-constant, like real data
    exporter = exporter or EXPORTER.get(str(metadata.get("model_family")), "dynamo")
    tmp = path.with_suffix(".tmp.onnx")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            proto = (_export_dynamo(model, example, min_time=getattr(model, "min_history", 2)) if exporter == "dynamo"
                     else _export_torchscript(model, example))
    except Exception as exc:  # torch.export raises many types; report them as one
        raise ExportError(f"torch.onnx.export failed for {type(model.core).__name__}: {str(exc).splitlines()[0]}") from exc
    if opset is not None:
        proto = convert_opset(proto, opset)
    set_metadata(proto, metadata)
    proto = check_model(proto, str(path))
    # value_info stays: the exporter's symbolic shapes are what attention fusion reads
    strip_annotations(proto, keep_value_info=True)
    onnx.save_model(proto, tmp)
    os.replace(tmp, path)
    log.info("exported %s (%d bytes, opset %d)", path, path.stat().st_size, opset_of(proto))
    return path


def _export_dynamo(model: torch.nn.Module, example: torch.Tensor, min_time: int = 2) -> onnx.ModelProto:
    # a window family reads the last ``lookback`` steps: its time axis starts there
    batch, time = torch.export.Dim("batch", min=1), torch.export.Dim("time", min=max(2, min_time))
    program = torch.onnx.export(
        model, (example,), dynamo=True, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
        dynamic_shapes={"history": {0: batch, 1: time}}, optimize=True, verbose=False,
    )
    return program.model_proto


def _export_torchscript(model: torch.nn.Module, example: torch.Tensor) -> onnx.ModelProto:
    import io

    buffer = io.BytesIO()
    torch.onnx.export(
        model, (example,), buffer, dynamo=False, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
        dynamic_axes={INPUT_NAME: {0: "batch", 1: "time"}, OUTPUT_NAME: {0: "batch"}},
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
    problems = io_contract_problems(inferred)
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


def io_contract_problems(proto: onnx.ModelProto) -> list[str]:
    """Differences between the model's inputs/outputs and the ONNX contract."""
    return contract_problems(signature(proto))


def set_metadata(proto: onnx.ModelProto, metadata: dict[str, str]) -> None:
    """Write the contract's metadata; ExportError if a required key is missing."""
    missing = missing_metadata(metadata)
    if missing:
        raise ExportError(f"missing ONNX metadata: {missing}")
    write_metadata(proto, metadata)


def convert_opset(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """Convert to ``opset`` with onnx's version converter; ExportError if it cannot."""
    from onnx import version_converter

    if opset_of(proto) == opset:
        return proto
    try:
        return version_converter.convert_version(proto, opset)
    except Exception as exc:  # the converter raises RuntimeError/ValueError/C++ errors
        raise ExportError(f"cannot convert from opset {opset_of(proto)} to {opset}: {str(exc).splitlines()[0]}") from exc
