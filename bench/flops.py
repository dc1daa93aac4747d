"""FLOPs and bytes of one forecast, counted on the exported graph, for the roofline.

``graph_cost(path, history)`` runs the model once with ONNX Runtime's profiler on, reads every
node's input and output shapes from the profile, and counts the matrix products the graph
executes (MatMul, Gemm and their fused and quantized forms, LSTM, the attention ops), 2 FLOPs
per multiply-accumulate. Element-wise work (activations, softmax, normalisation, the scaling
around the model) is not counted: it counts against the achieved rate, as in a GEMM roofline.
Bytes are what a forecast must move at the least: its history in, its outputs out, and the
model's weights read once per batch.

Counted on each variant's own graph: the products of its quantized ops (``QUANTIZED``) are
also given apart (``int8_ops``), so that an INT8 variant's roofline holds them to the int8 GEMM
peak and the rest to the float32 one. (The fp32 graph's count is the family's work: the GEMM-peak
fraction of every variant.)
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

PRODUCTS = {"MatMul", "FusedMatMul", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
GEMMS = {"Gemm", "FusedGemm"}
RECURRENT = {"LSTM", "DynamicQuantizeLSTM"}
ATTENTION = {"Attention", "QAttention"}
QUANTIZED = {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM", "QAttention"}


def graph_cost(path: str | Path, history: np.ndarray) -> dict:
    """``{"flops", "int8_ops", "bytes", "weight_bytes", "by_op"}`` of one run of ``path`` on
    ``history`` (``[batch, time, F]``), per forecast (divided by the batch); ``int8_ops`` is the
    part of ``flops`` done by quantized ops."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = os.path.join(tmp, "cost")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        outputs = session.run(None, {"history": history})
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op: dict[str, int] = {}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        args = event["args"]
        flops = node_flops(args["op_name"], _shapes(args.get("input_type_shape")),
                           _shapes(args.get("output_type_shape")))
        if flops:
            by_op[args["op_name"]] = by_op.get(args["op_name"], 0) + flops
    model = onnx.load(str(path), load_external_data=False)
    weight_bytes = sum(_tensor_bytes(t) for t in model.graph.initializer)
    batch = history.shape[0]
    moved = history.nbytes + sum(o.nbytes for o in outputs) + weight_bytes
    int8 = sum(v for k, v in by_op.items() if k in QUANTIZED)
    return {"flops": sum(by_op.values()) / batch, "int8_ops": int8 / batch, "bytes": moved / batch,
            "weight_bytes": weight_bytes,
            "by_op": {k: v / batch for k, v in by_op.items()}}


def node_flops(op: str, inputs: list[list[int]], outputs: list[list[int]]) -> int:
    """2 x the multiply-accumulates of one node, from its profiled shapes (0 if not a product)."""
    if not inputs or not outputs:
        return 0
    if op in PRODUCTS:
        k = inputs[0][-1]
        return 2 * math.prod(outputs[0]) * k
    if op in GEMMS:  # A holds M x K values whatever its transpose; the output is M x N
        m = outputs[0][0]
        return 2 * math.prod(outputs[0]) * (math.prod(inputs[0]) // max(m, 1))
    # The profiler lists only the inputs that are not prepacked constants: weights are read from
    # the activations' and outputs' shapes instead.
    if op in RECURRENT:  # X [T, B, I]; an output Y [T, D, B, H] or Y_h [D, B, H]
        steps, batch, width = inputs[0]
        directions, hidden = outputs[0][-3], outputs[0][-1]
        return 2 * steps * batch * directions * 4 * hidden * (width + hidden)
    if op in ATTENTION:  # [B, S, D_in] -> [B, S, D]: the q/k/v projection, scores and context
        batch, tokens, width = inputs[0]
        hidden = outputs[0][-1]
        return 2 * batch * tokens * width * 3 * hidden + 2 * 2 * batch * tokens * tokens * hidden
    return 0


def _shapes(entries) -> list[list[int]]:
    """The profiler's ``[{"float": [dims]}, ...]`` as lists of dims."""
    out = []
    for entry in entries or []:
        out.extend([list(dims) for dims in entry.values()])
    return out


def _tensor_bytes(tensor) -> int:
    from onnx import helper

    size = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return size * math.prod(tensor.dims)
