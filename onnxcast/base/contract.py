"""The ONNX model contract, checkable without torch: names, signature, metadata.

One input ``history`` float32 ``[batch, time, n_features]`` and the output ``forecast``
float32 ``[batch, horizon]``, batch and time dynamic, ``onnxcast.*`` metadata_props. Models
exported since onnxcast 0.21 have a second output ``quantiles`` float32 ``[batch, horizon, Q]``
(the forecast distribution, ascending along Q, levels in the metadata ``quantile_levels``);
models without it still pass, so consumers that read only ``forecast`` keep working and older
versions stay servable. Used by the exporter (before writing), the promotion (manifest
signature) and the edge client (before serving), so all three agree on what a valid model is.
"""

from __future__ import annotations

from onnxcast.base.errors import ExportError

INPUT_NAME = "history"
OUTPUT_NAME = "forecast"
QUANTILES_NAME = "quantiles"
METADATA_PREFIX = "onnxcast."
REQUIRED_METADATA = ("model_family", "lookback", "horizon", "freq", "target", "features",
                     "precision", "trained_until", "dataset_sha256")
# Optional keys of a global model (fleet mode, docs/design/fleet.md section 3.1): "global" is
# "true", "n_series" the series it was trained on, "series_column" the long table's series id
# column; its "trained_until" is the latest end over those series. Absent on single-series models.
GLOBAL_METADATA = ("global", "n_series", "series_column")
# Optional: "true" when the target was never negative in training and the graph clips the
# forecast and the quantiles at 0 (issue 32); absent (models exported before it) or "false": not clipped
NONNEGATIVE_METADATA = "nonnegative"
# Required with the ``quantiles`` output: its levels, comma-separated, strictly ascending in (0, 1)
QUANTILE_METADATA = "quantile_levels"
DEFAULT_QUANTILE_LEVELS = (0.025, 0.1, 0.5, 0.9, 0.975)
MAX_QUANTILE_LEVELS = 99


def parse_quantile_levels(text: str, where: str = "quantile_levels") -> tuple[float, ...]:
    """``"0.1,0.5,0.9"`` as floats; ValueError naming ``where`` and the value at fault unless
    every level is a number in (0, 1), strictly ascending, at most MAX_QUANTILE_LEVELS."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or parts == [""] or len(parts) > MAX_QUANTILE_LEVELS:
        raise ValueError(f"{where} must list 1 to {MAX_QUANTILE_LEVELS} levels, comma-separated, got {str(text)[:80]!r}")
    levels = []
    for part in parts:
        try:
            level = float(part)
        except ValueError:
            raise ValueError(f"{where}: {part[:40]!r} is not a number") from None
        if not 0.0 < level < 1.0:  # also refuses nan
            raise ValueError(f"{where}: level {part[:40]!r} is not between 0 and 1 (both excluded)")
        if levels and level <= levels[-1]:
            raise ValueError(f"{where} must be strictly ascending: {part[:40]!r} follows {levels[-1]!r}")
        levels.append(level)
    return tuple(levels)


def format_quantile_levels(levels) -> str:
    """The metadata spelling of ``levels``: shortest round-trip floats, comma-separated."""
    return ",".join(repr(float(level)) for level in levels)


def central_intervals(levels) -> list[tuple[int, int, float]]:
    """``(low index, high index, nominal coverage)`` of every central interval the levels hold
    (a level ``a`` and ``1 - a``), widest first: ``0.025,0.1,0.5,0.9,0.975`` -> 95% and 80%."""
    levels = [float(v) for v in levels]
    out = []
    for i, low in enumerate(levels):
        if low >= 0.5:
            break
        for j in range(len(levels) - 1, i, -1):
            if abs(levels[j] - (1.0 - low)) < 1e-9:
                out.append((i, j, round(1.0 - 2.0 * low, 9)))
                break
    return out


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
    """Every difference between a signature and the contract, one phrase each. The outputs
    are ``forecast``, or ``forecast`` then ``quantiles``."""
    problems = []
    allowed = {"inputs": ([INPUT_NAME],), "outputs": ([OUTPUT_NAME], [OUTPUT_NAME, QUANTILES_NAME])}
    shapes = {INPUT_NAME: (3, (0, 1)), OUTPUT_NAME: (2, (0,)), QUANTILES_NAME: (3, (0,))}
    for kind in ("inputs", "outputs"):
        values = sig[kind]
        names = [v["name"] for v in values]
        if names not in allowed[kind]:
            expected = " or ".join(repr(a) if len(a) > 1 else repr(a[0]) for a in allowed[kind])
            problems.append(f"expected {kind} {expected}, found {names}")
            continue
        for value in values:
            name = value["name"]
            rank, dynamic = shapes[name]
            if value["dtype"] != "float32":
                problems.append(f"{name} is {value['dtype']}, expected float32")
            if len(value["shape"]) != rank:
                problems.append(f"{name} has rank {len(value['shape'])}, expected {rank}")
            else:
                problems += [f"{name} axis {a} is fixed at {value['shape'][a]}, expected dynamic"
                             for a in dynamic if isinstance(value["shape"][a], int)]
    return problems


def has_quantiles(sig: dict) -> bool:
    return any(v["name"] == QUANTILES_NAME for v in sig.get("outputs", ()))


def quantile_problems(sig: dict, metadata: dict[str, str]) -> list[str]:
    """With a ``quantiles`` output: its levels must be in the metadata, valid, and as many as
    its last axis holds when that axis is fixed."""
    if not has_quantiles(sig):
        return []
    if QUANTILE_METADATA not in metadata:
        return [f"a {QUANTILES_NAME!r} output needs the metadata {METADATA_PREFIX}{QUANTILE_METADATA}"]
    try:
        levels = parse_quantile_levels(metadata[QUANTILE_METADATA], f"{METADATA_PREFIX}{QUANTILE_METADATA}")
    except ValueError as exc:
        return [str(exc)]
    shape = next(v["shape"] for v in sig["outputs"] if v["name"] == QUANTILES_NAME)
    if len(shape) == 3 and isinstance(shape[2], int) and shape[2] != len(levels):
        return [f"{QUANTILES_NAME} holds {shape[2]} levels, the metadata lists {len(levels)}"]
    return []


def read_metadata(proto) -> dict[str, str]:
    """The ``onnxcast.*`` metadata_props, without the prefix."""
    return {p.key.removeprefix(METADATA_PREFIX): p.value for p in proto.metadata_props
            if p.key.startswith(METADATA_PREFIX)}


def missing_metadata(metadata: dict[str, str]) -> list[str]:
    return [k for k in REQUIRED_METADATA if k not in metadata]


def set_metadata(proto, metadata: dict[str, str]) -> None:
    """Write ``metadata`` as ``onnxcast.*`` metadata_props, replacing existing keys;
    ExportError (nothing written) if a key the contract requires is missing."""
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
