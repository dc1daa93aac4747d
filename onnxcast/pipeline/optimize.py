"""Optimised variants of an exported model: ``fp32-opt``, ``int8`` and ``fp16``.

Every transformation is followed by the ONNX checks, and every variant is validated on
its own afterwards (onnxcast.pipeline.validate): simplifiers and quantizers have turned dynamic
shapes static and changed numbers before.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from onnxcast.base.contract import read_metadata, set_metadata
from onnxcast.base.files import replacing
from onnxcast.pipeline.export import check_model, strip_annotations

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class QuantSettings:
    """What dynamic INT8 quantizes in a family, and how."""

    op_types: tuple[str, ...]
    # per-channel scales cost 4 bytes per output channel; for the LSTM (1,024 gate rows) that
    # was 5% of the int8 file and holdout MAE moved < 0.05% either way, so per-tensor there
    per_channel: bool
    # 7-bit weights: U8S8 kernels without VNNI (AVX2, AVX-512F) can saturate otherwise, and
    # the file must stay portable to whichever edge CPU pulls it (ORT quantization docs)
    reduce_range: bool = True


# The Transformer keeps attention's activation-by-activation products in float: after fusion
# they are inside (Q)Attention, which quantizes only the packed q/k/v projection (quantizing
# the products cost accuracy, docs/architecture.md#optimization-and-quantization).
QUANTIZATION = {
    "lstm": QuantSettings(("LSTM", "MatMul", "Gemm"), per_channel=False),
    "transformer": QuantSettings(("MatMul", "Gemm", "Attention"), per_channel=True),
    # MLP weights (N-HiTS: 1-1.5M in Gemm/MatMul at the defaults) are nearly all of the file
    "nhits": QuantSettings(("MatMul", "Gemm"), per_channel=True),
    "dlinear": QuantSettings(("MatMul", "Gemm"), per_channel=True),
    "base": QuantSettings(("MatMul", "Gemm"), per_channel=True),
}


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
    if "fp16" in variants and read_metadata(onnx.load(fp32_path, load_external_data=False)).get("global") == "true":
        # A global model computes in raw units (no folded scaler): ORT's float16 converter passes
        # every tensor between ops as float16, even around blocked ops, and the window variance of
        # M3 levels (about 2e4 squared) overflows it: fp16 forecast inf on 138 of 150 M3 series.
        log.info("variant fp16: not built for a global model (raw units overflow float16)")
        variants = tuple(v for v in variants if v != "fp16")
    for name in variants:
        target = out_dir / f"{name}.onnx"
        note = builders[name](fp32_path, target, family=family)
        made.append(Variant(name, target, note))
        log.info("variant %s: %s (%d bytes) %s", name, target, target.stat().st_size, note)
    return made


# ORT fusions that made these models slower on CPU (onnxruntime 1.32, measured with
# bench/run.py): SkipLayerNormalization took 4-5x as long as the Add + LayerNormalization it
# replaces ([batch, 168, 64]: 59 vs 14 us at batch 1, 3.4 vs 0.7 ms at batch 64).
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


def optimize_graph(source: Path, target: Path, *, family: str) -> str:
    """Attention fusion (Transformer), onnxslim, then ORT offline optimisation at the portable
    EXTENDED level (SkipLayerNormalization, BiasGelu, FusedMatMul; no CPU-specific layouts)."""
    import onnxruntime as ort
    import onnxslim

    model = onnx.load(source)
    metadata = read_metadata(model)
    notes = []
    model, notes = _restructure(model, family)
    slimmed = onnxslim.slim(model)
    with tempfile.TemporaryDirectory() as tmp:
        slim_path = Path(tmp) / "slim.onnx"
        onnx.save_model(slimmed, slim_path)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        ort.InferenceSession(str(slim_path), options, providers=["CPUExecutionProvider"],
                             disabled_optimizers=DISABLED_OPTIMIZERS)
        optimized = onnx.load(options.optimized_model_filepath)
    _finish(optimized, target, metadata, "fp32")
    return " + ".join([*notes, "onnxslim", "ORT_ENABLE_EXTENDED"])


def _restructure(model: onnx.ModelProto, family: str) -> tuple[onnx.ModelProto, list[str]]:
    """The family-specific graph rewrites shared by fp32-opt and int8."""
    if family == "transformer":
        model, fused = fuse_attention(model, ATTENTION_KIND)
        return model, [f"{fused} attention blocks -> com.microsoft.{ATTENTION_KIND}"]
    if family == "lstm":
        model, changes = simplify_lstm(model)
        return model, [f"LSTM clean-up ({len(changes)} changes)"] if changes else []
    return model, []


def quantize_dynamic_int8(source: Path, target: Path, *, family: str) -> str:
    """Dynamic INT8 (weights int8, activations quantized at run time) after quant_pre_process.

    The Transformer is quantized after attention fusion, so its packed q/k/v projection is
    one int8 GEMM and attention itself runs in the fused float kernel.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = onnx.load(source)
    metadata = read_metadata(model)
    settings = QUANTIZATION.get(family, QuantSettings(("MatMul", "Gemm"), per_channel=True))
    model, notes = _restructure(model, family)
    with tempfile.TemporaryDirectory() as tmp:
        fused_path, pre, quantized = Path(tmp) / "fused.onnx", Path(tmp) / "pre.onnx", Path(tmp) / "int8.onnx"
        onnx.save_model(model, fused_path)
        quant_pre_process(str(fused_path), str(pre), skip_symbolic_shape=False)
        quantize_dynamic(str(pre), str(quantized), weight_type=QuantType.QInt8, per_channel=settings.per_channel,
                         reduce_range=settings.reduce_range, op_types_to_quantize=list(settings.op_types),
                         nodes_to_exclude=exact_products(onnx.load(str(pre), load_external_data=False)))
        model = onnx.load(quantized)
    _finish(model, target, metadata, "int8")
    scales = "per-channel" if settings.per_channel else "per-tensor"
    range_note = ", reduce_range" if settings.reduce_range else ""
    return " + ".join([*notes, f"dynamic int8 of {','.join(settings.op_types)}, {scales}{range_note}"])


def exact_products(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes that multiply by one of the export form's exact matrices (anchor
    selection and mix, the quantiles' map: onnxcast.pipeline.graph_forms.EXACT_MATRICES).
    Dynamic INT8 would round their activations to 256 levels of the window's range: the
    seasonal-naive anchors would be off by up to half a percent of it."""
    from onnxcast.pipeline.graph_forms import EXACT_MATRICES

    names = []
    for node in model.graph.node:
        # an ensemble's members' matrices are named "forms.<i>.<name>" (graph_forms.EnsembleForm)
        if (node.op_type in ("MatMul", "Gemm") and len(node.input) > 1
                and node.input[1].rsplit(".", 1)[-1] in EXACT_MATRICES):
            # the quantizer splits a Gemm into "<name>_MatMul" + Add before it reads the
            # exclusions (onnxruntime 1.32: a MatMul+Add fused by quant_pre_process was quantized)
            names += [node.name, f"{node.name}_MatMul"] if node.op_type == "Gemm" else [node.name]
    return names


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
    model = check_model(model, str(target))
    strip_annotations(model)
    compact_names(model)
    with replacing(target) as tmp:
        onnx.save_model(model, tmp)


def compact_names(model: onnx.ModelProto) -> None:
    """Rename intermediate tensors and nodes to short ids (the graph's inputs and outputs keep
    their contract names). Exporter and quantizer names ("/layers.0/query/MatMul_output_0_quantized")
    were ~12% of a small int8 file; a device gains nothing from them. Graphs with subgraphs
    (If/Loop/Scan) are left alone: their names resolve across scopes."""
    graph = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return
    keep = {v.name for v in graph.input} | {v.name for v in graph.output}
    renamed: dict[str, str] = {}

    def short(name: str) -> str:
        if not name or name in keep:
            return name
        return renamed.setdefault(name, f"t{len(renamed)}")

    for tensor in graph.initializer:
        tensor.name = short(tensor.name)
    for index, node in enumerate(graph.node):
        node.name = f"n{index}"
        node.input[:] = [short(n) for n in node.input]
        node.output[:] = [short(n) for n in node.output]
    for value in graph.value_info:
        value.name = short(value.name)


# --- attention fusion -------------------------------------------------------------------------
#
# The exported EncoderLayer attention is 16 nodes per layer (3 x MatMul+Add+Reshape+Transpose
# for q/k/v, MatMul, Div, Softmax, MatMul, Transpose, Reshape). ORT's transformer optimizer
# (model_type "bert") fused only the second layer here: its BERT pattern wants the layer's
# input to come from a LayerNormalization, while the first layer reads embedding + position.
# The rewrite below matches the pattern our own EncoderLayer exports (and nothing looser),
# and replaces it with a com.microsoft attention op (q/k/v weights packed into one GEMM).

# Attention: one node with the q/k/v weights packed into one GEMM (quantizable as
# QAttention). MultiHeadAttention: a packed MatMul, a Split and the op, which runs MLAS flash
# attention on CPU. Measured on the example model (1 thread, same run, p50): Attention
# 0.59 ms at batch 1 and 54 ms at 64, MultiHeadAttention 0.68 ms and 46 ms, unfused 0.90
# and 70 ms. Attention is chosen: batch 1 is the harder goal and QAttention makes the
# int8 variant the fastest at batch 64.
ATTENTION_KIND = "Attention"
_Q_PERM = [0, 2, 1, 3]  # [batch, time, heads, head_dim] -> [batch, heads, time, head_dim]
_K_PERM = [0, 2, 3, 1]  # k transposed for q @ k^T


def fuse_attention(model: onnx.ModelProto, kind: str = ATTENTION_KIND) -> tuple[onnx.ModelProto, int]:
    """Replace each exported scaled-dot-product attention block with a com.microsoft op.

    ``kind`` "Attention": one node with packed q/k/v weights. "MultiHeadAttention": one
    MatMul with the packed weights, a Split, and MultiHeadAttention (which adds the biases).

    Returns the model and how many blocks were fused. A block that deviates from the exact
    pattern is left alone (the variant is validated either way).
    """
    from onnx import helper

    graph = model.graph
    index = _GraphIndex(graph)
    fused, remove, replacement, new_inits = 0, set(), {}, []
    for softmax in [n for n in graph.node if n.op_type == "Softmax"]:
        block = _match_attention(index, softmax)
        if block is None:
            continue
        nodes, initializers = _fused_attention_nodes(block, f"fused_attention_{fused}", kind)
        replacement[id(block.output_node)] = nodes
        new_inits += initializers
        remove.update(id(node) for node in block.nodes)
        fused += 1
    if not fused:
        return model, 0
    _replace_nodes(graph, replacement, remove)
    graph.initializer.extend(new_inits)
    # the removed Reshapes' shape computations (Shape -> Gather -> Concat) are dead now; ORT
    # would still run them (the int8 variant is not simplified by onnxslim afterwards)
    _remove_dead_nodes(graph)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    del graph.value_info[:]  # stale for the removed tensors; check_model re-infers
    return model, fused


class _GraphIndex:
    """Who produces and who consumes each tensor of a graph, its constants and known shapes,
    as the graph was when indexed."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.producer = {out: node for node in graph.node for out in node.output if out}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.initializers = {t.name: t for t in graph.initializer}
        self.shapes = {v.name: v.type.tensor_type.shape for v in graph.value_info}

    def const(self, name: str):
        from onnx import numpy_helper

        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def parent(self, name: str, op_type: str) -> onnx.NodeProto | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def only_child(self, name: str, op_type: str) -> onnx.NodeProto | None:
        children = self.consumers.get(name, [])
        return children[0] if len(children) == 1 and children[0].op_type == op_type else None


@dataclass(frozen=True)
class _Projection:
    """One head input: Transpose <- Reshape <- Add(bias) <- MatMul(x, W)."""

    x: str
    weight: np.ndarray
    bias: np.ndarray
    reshape: onnx.NodeProto
    nodes: list[onnx.NodeProto]


@dataclass(frozen=True)
class _AttentionBlock:
    q: _Projection
    k: _Projection
    v: _Projection
    num_heads: int
    scale: float
    output_node: onnx.NodeProto  # the block's final Reshape: the fused nodes take its place
    nodes: list[onnx.NodeProto]  # every node of the block, removed when it is fused


def _perm(node: onnx.NodeProto | None) -> list[int] | None:
    if node is None:
        return None
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _projection(index: _GraphIndex, head_input: str, expected_perm: list[int]) -> _Projection | None:
    transpose = index.parent(head_input, "Transpose")
    if _perm(transpose) != expected_perm:
        return None
    reshape = index.parent(transpose.input[0], "Reshape")
    add = reshape and index.parent(reshape.input[0], "Add")
    if add is None:
        return None
    matmul = index.parent(add.input[0], "MatMul")
    bias_name = add.input[1]
    if matmul is None:
        matmul, bias_name = index.parent(add.input[1], "MatMul"), add.input[0]
    if matmul is None:
        return None
    weight, bias = index.const(matmul.input[1]), index.const(bias_name)
    if weight is None or bias is None or weight.ndim != 2 or bias.ndim != 1:
        return None
    return _Projection(matmul.input[0], weight, bias, reshape, [transpose, reshape, add, matmul])


def _match_attention(index: _GraphIndex, softmax: onnx.NodeProto) -> _AttentionBlock | None:
    """The attention block around ``softmax``, or None when it deviates from the exact pattern:
    softmax(q @ k^T scaled by a constant) @ v, heads transposed back and reshaped."""
    scale_node = index.producer.get(softmax.input[0])
    if scale_node is None or scale_node.op_type not in ("Div", "Mul"):
        return None
    factor = index.const(scale_node.input[1])
    qk = index.parent(scale_node.input[0], "MatMul")
    av = index.only_child(softmax.output[0], "MatMul")
    if factor is None or factor.size != 1 or qk is None or av is None or av.input[0] != softmax.output[0]:
        return None
    scale = float(1.0 / factor.item()) if scale_node.op_type == "Div" else float(factor.item())
    q, k = _projection(index, qk.input[0], _Q_PERM), _projection(index, qk.input[1], _K_PERM)
    v = _projection(index, av.input[1], _Q_PERM)
    out_t = index.only_child(av.output[0], "Transpose")
    out_r = out_t and index.only_child(out_t.output[0], "Reshape")
    if not (q and k and v and out_r) or _perm(out_t) != _Q_PERM or not (q.x == k.x == v.x):
        return None
    head_shape = index.shapes.get(q.reshape.output[0])
    if head_shape is None or len(head_shape.dim) != 4 or not head_shape.dim[2].HasField("dim_value"):
        return None
    nodes = [*q.nodes, *k.nodes, *v.nodes, qk, scale_node, softmax, av, out_t, out_r]
    return _AttentionBlock(q, k, v, head_shape.dim[2].dim_value, scale, out_r, nodes)


def _fused_attention_nodes(block: _AttentionBlock, prefix: str,
                           kind: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The com.microsoft nodes that compute ``block`` (named ``prefix``...), and their packed
    q/k/v weights and biases."""
    from onnx import helper, numpy_helper

    q, k, v = block.q, block.k, block.v
    weight = np.concatenate([q.weight, k.weight, v.weight], axis=1).astype(np.float32)
    bias = np.concatenate([q.bias, k.bias, v.bias]).astype(np.float32)
    initializers = [numpy_helper.from_array(weight, f"{prefix}_qkv_weight"),
                    numpy_helper.from_array(bias, f"{prefix}_qkv_bias")]
    output, heads = block.output_node.output[0], block.num_heads
    if kind == "Attention":
        return [helper.make_node(
            "Attention", [q.x, f"{prefix}_qkv_weight", f"{prefix}_qkv_bias"], [output],
            name=prefix, domain="com.microsoft", num_heads=heads, scale=block.scale)], initializers
    d = q.weight.shape[1]
    initializers.append(numpy_helper.from_array(np.array([d, d, d], dtype=np.int64), f"{prefix}_split"))
    return [
        helper.make_node("MatMul", [q.x, f"{prefix}_qkv_weight"], [f"{prefix}_qkv_mm"], name=f"{prefix}_mm"),
        helper.make_node("Split", [f"{prefix}_qkv_mm", f"{prefix}_split"], [f"{prefix}_q", f"{prefix}_k", f"{prefix}_v"],
                         name=f"{prefix}_sp", axis=-1),
        helper.make_node("MultiHeadAttention", [f"{prefix}_q", f"{prefix}_k", f"{prefix}_v", f"{prefix}_qkv_bias"],
                         [output], name=prefix, domain="com.microsoft", num_heads=heads, scale=block.scale),
    ], initializers


def _replace_nodes(graph: onnx.GraphProto, replacement: dict[int, list[onnx.NodeProto]], remove: set[int]) -> None:
    """Drop the nodes in ``remove`` (ids) and put each ``replacement`` where the node of that id
    was: the fused nodes keep the graph in topological order."""
    nodes = []
    for node in graph.node:
        if id(node) in replacement:
            nodes.extend(replacement[id(node)])
        elif id(node) not in remove:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


# --- LSTM clean-up ---------------------------------------------------------------------------
#
# The exported nn.LSTM feeds each ONNX LSTM op zero initial states built at run time
# (Shape -> Concat -> ConstantOfShape -> Slice) and concatenates both layers' Y_h only to
# pick the last one. Zero is the op's default for absent initial states, and an absent
# output is not computed: at batch 64 the last layer's per-step output Y alone is
# [168, 64, 64] floats written for nothing.

_PASS_THROUGH = {"Slice", "Split", "Expand", "Reshape", "Squeeze", "Unsqueeze", "Identity"}


def simplify_lstm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Drop zero initial states and unused outputs of LSTM ops; read a single layer's Y_h
    directly instead of through Concat + Gather. Returns the model and what changed."""
    graph = model.graph
    index = _GraphIndex(graph)
    graph_outputs = {o.name for o in graph.output}
    lstms = _lstm_nodes(graph)
    changes = _drop_zero_initial_states(index, lstms)
    changes += _read_single_layer_yh(index, graph, lstms)
    _remove_dead_nodes(graph)  # rebuilds graph.node: look the LSTM nodes up again
    changes += _drop_unused_lstm_outputs(graph, _lstm_nodes(graph), graph_outputs)
    _remove_dead_nodes(graph)
    del graph.value_info[:]
    return model, changes


def _lstm_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    return [n for n in graph.node if n.op_type == "LSTM" and n.domain in ("", "ai.onnx")]


def _drop_zero_initial_states(index: _GraphIndex, lstms: list[onnx.NodeProto]) -> list[str]:
    """An initial_h or initial_c that is all zeros is ONNX's default: leave the input out."""
    changes = []
    for node in lstms:
        for at in (5, 6):  # initial_h, initial_c
            if len(node.input) > at and node.input[at] and _is_zeros(index, node.input[at]):
                node.input[at] = ""
                changes.append(f"{node.name}: zero {'initial_h' if at == 5 else 'initial_c'} dropped")
        while node.input and not node.input[-1]:
            node.input.pop()
    return changes


def _read_single_layer_yh(index: _GraphIndex, graph: onnx.GraphProto, lstms: list[onnx.NodeProto]) -> list[str]:
    """Gather(Concat(Y_h of single-direction LSTMs), const index, axis 0) -> Squeeze(that Y_h)."""
    from onnx import helper, numpy_helper

    lstm_yh = {n.output[1] for n in lstms if len(n.output) > 1 and n.output[1]
               and next((a.s for a in n.attribute if a.name == "direction"), b"forward") != b"bidirectional"}
    changes = []
    for gather in [n for n in graph.node if n.op_type == "Gather"]:
        concat = index.producer.get(gather.input[0])
        at = _constant_value(index, gather.input[1])
        axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)
        if (concat is None or concat.op_type != "Concat" or at is None or at.ndim != 0 or axis != 0
                or next((a.i for a in concat.attribute if a.name == "axis"), None) != 0
                or not all(i in lstm_yh for i in concat.input)):
            continue
        chosen = concat.input[int(at)]
        axes = f"{gather.name or gather.output[0]}_axes"
        graph.initializer.append(numpy_helper.from_array(np.array([0], dtype=np.int64), axes))
        squeeze = helper.make_node("Squeeze", [chosen, axes], list(gather.output), name=f"{gather.name}_squeeze")
        graph.node.insert(list(graph.node).index(gather), squeeze)
        graph.node.remove(gather)
        changes.append(f"{gather.name}: last layer's Y_h read directly")
    return changes


def _drop_unused_lstm_outputs(graph: onnx.GraphProto, lstms: list[onnx.NodeProto],
                              graph_outputs: set[str]) -> list[str]:
    """An LSTM output nobody reads (Y, Y_h or Y_c) is not computed."""
    changes = []
    for node in lstms:
        for at, output in enumerate(node.output):
            if output and output not in graph_outputs and not any(output in n.input for n in graph.node):
                node.output[at] = ""
                changes.append(f"{node.name}: unused output {('Y', 'Y_h', 'Y_c')[at]} not computed")
        while node.output and not node.output[-1]:
            node.output.pop()
    return changes


def _constant_value(index: _GraphIndex, name: str):
    """The value of an initializer or a Constant node's ``value``; None for anything else."""
    from onnx import numpy_helper

    if name in index.initializers:
        return numpy_helper.to_array(index.initializers[name])
    node = index.producer.get(name)
    if node is not None and node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def _is_zeros(index: _GraphIndex, name: str) -> bool:
    """``name`` is all zeros: a zero constant, or ConstantOfShape(0), through shape-only ops."""
    from onnx import numpy_helper

    for _ in range(8):
        value = _constant_value(index, name)
        if value is not None:
            return not np.any(value)
        node = index.producer.get(name)
        if node is None:
            return False
        if node.op_type == "ConstantOfShape":
            fill = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"), None)
            return fill is None or not np.any(fill)
        if node.op_type not in _PASS_THROUGH:
            return False
        name = node.input[0]
    return False


def _remove_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove nodes none of whose outputs is used, then initializers nothing reads."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(list(graph.node)):
        if any(o and o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    used = {i for n in graph.node for i in n.input} | needed
    live = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(live)
