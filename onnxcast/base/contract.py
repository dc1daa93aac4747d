"""The ONNX model contract, checkable without torch: names, signature, metadata.

One input ``history`` float32 ``[batch, time, n_features]`` and one output ``forecast``
float32 ``[batch, horizon]``, batch and time dynamic, ``onnxcast.*`` metadata_props. Used by
the exporter (before writing), the promotion (manifest signature) and the edge client
(before serving), so all three agree on what a valid model is.
"""

from __future__ import annotations

INPUT_NAME = "history"
OUTPUT_NAME = "forecast"
METADATA_PREFIX = "onnxcast."
REQUIRED_METADATA = ("model_family", "lookback", "horizon", "freq", "target", "features",
                     "precision", "trained_until", "dataset_sha256")
# Optional keys of a global model (fleet mode, docs/design/fleet.md section 3.1): "global" is
# "true", "n_series" the series it was trained on, "series_column" the long table's series id
# column; its "trained_until" is the latest end over those series. Absent on single-series models.
GLOBAL_METADATA = ("global", "n_series", "series_column")


def signature(proto) -> dict:
    """``{"inputs": [{name, dtype, shape}], "outputs": [...]}``; symbolic dims by name."""
    import onnx

    def describe(values) -> list[dict]:
        out = []
        for v in values:
            t = v.type.tensor_type
            shape = [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in t.shape.dim]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "undefined"
            out.append({"name": v.name, "dtype": dtype, "shape": shape})
        return out

    initializers = {t.name for t in proto.graph.initializer}
    return {"inputs": describe([i for i in proto.graph.input if i.name not in initializers]),
            "outputs": describe(proto.graph.output)}


def contract_problems(sig: dict) -> list[str]:
    """Every difference between a signature and the contract, one phrase each."""
    problems = []
    for kind, name, rank, dynamic in (("inputs", INPUT_NAME, 3, (0, 1)), ("outputs", OUTPUT_NAME, 2, (0,))):
        values = sig[kind]
        if [v["name"] for v in values] != [name]:
            problems.append(f"expected one {kind[:-1]} {name!r}, found {[v['name'] for v in values]}")
            continue
        value = values[0]
        if value["dtype"] != "float32":
            problems.append(f"{name} is {value['dtype']}, expected float32")
        if len(value["shape"]) != rank:
            problems.append(f"{name} has rank {len(value['shape'])}, expected {rank}")
        else:
            problems += [f"{name} axis {a} is fixed at {value['shape'][a]}, expected dynamic"
                         for a in dynamic if isinstance(value["shape"][a], int)]
    return problems


def read_metadata(proto) -> dict[str, str]:
    """The ``onnxcast.*`` metadata_props, without the prefix."""
    return {p.key.removeprefix(METADATA_PREFIX): p.value for p in proto.metadata_props
            if p.key.startswith(METADATA_PREFIX)}


def missing_metadata(metadata: dict[str, str]) -> list[str]:
    return [k for k in REQUIRED_METADATA if k not in metadata]


def set_metadata(proto, metadata: dict[str, str]) -> None:
    """Write ``metadata`` as ``onnxcast.*`` metadata_props, replacing existing keys;
    ExportError (nothing written) if a key the contract requires is missing."""
    from onnxcast.base.errors import ExportError

    missing = missing_metadata(metadata)
    if missing:
        raise ExportError(f"missing ONNX metadata: {missing}")
    existing = {p.key: p for p in proto.metadata_props}
    for key, value in metadata.items():
        full = key if key.startswith(METADATA_PREFIX) else METADATA_PREFIX + key
        if full in existing:
            existing[full].value = str(value)
        else:
            proto.metadata_props.add(key=full, value=str(value))


def opset_of(proto) -> int:
    """The default-domain opset version."""
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
