"""The edge client: pull a channel's model from the rollout store, verify it, swap it in
atomically, and run it with ONNX Runtime and numpy only.

A device folder ``DEST`` looks like this::

    DEST/trust/root.json, state.json           (onnxcast.rollout.trust)
    DEST/versions/<version>/manifest.json, <artifact>.onnx, pulled.json
    DEST/current  -> versions/<version>       (symlink, swapped with os.replace)
    DEST/previous -> versions/<older>         (kept for a manual fallback)

``pull`` first brings the trust root up to date (the store's root chain), then reads the
channel pointer and checks its signatures, expiry and counter before it reads anything
else; the manifest is downloaded up to the length the pointer signs and checked against
its signed digest and its own signatures, the artifact up to the length the manifest
signs. It refuses (RefusedError/VerificationError, one line, nothing changed, the old
model keeps serving) whatever does not verify, a model whose ONNX I/O differs from the
contract or the manifest, or one that references external data (CVE-2024-27318). This
module must not import torch or pandas: devices do not have them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from onnxcast.errors import (
    ConfigError,
    DataError,
    OnnxcastError,
    RefusedError,
    StoreError,
    VerificationError,
)
from onnxcast.rollout.contract import (
    INPUT_NAME,
    METADATA_PREFIX,
    OUTPUT_NAME,
    contract_problems,
    opset_of,
    read_metadata,
    signature,
)
from onnxcast.rollout.store import MANIFEST, check_name, open_store, sha256_hex
from onnxcast.rollout.trust import MAX_POINTER_BYTES, DeviceTrust

log = logging.getLogger(__name__)

PREDICT_METADATA = ("target", "features", "lookback", "horizon")
PULLED = "pulled.json"


@dataclass(frozen=True)
class PullResult:
    """What a pull did: ``changed`` is False when DEST/current already was the channel's model."""

    model: str
    channel: str
    version: str
    changed: bool
    path: Path
    previous: str | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What the edge checks in an ONNX file, and what promotion records in the manifest."""

    signature: dict
    opset: int
    metadata: dict[str, str]


def pull(store_uri: str, model: str, channel: str, dest: str | Path, *, trust: str | Path | None = None,
         **settings: Any) -> PullResult:
    """Install the model ``channel`` points to under ``dest/current`` if it verifies
    against the device's trust root (``trust``, ``$ONNXCAST_TRUST`` or ``dest/trust``).

    Raises StoreError when the store cannot be read or has no such channel, RefusedError
    when the release metadata or a file is not what the release keys signed, and
    VerificationError when the model fails the device's checks; ``dest/current`` is
    unchanged then and the message says which version keeps serving.
    """
    check_name("model", model)
    check_name("channel", channel)
    store = open_store(store_uri, **settings)
    dest = Path(dest).absolute()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{dest}: cannot use as the device folder ({exc.strerror})") from None
    with _locked(dest / ".pull.lock"):
        current = _installed(dest / "current")
        try:
            return _pull_locked(store, model, channel, dest, trust, current)
        except VerificationError as exc:  # RefusedError included
            serving = f"still serving version {current['version']}" if current else "nothing installed"
            raise type(exc)(f"{exc} ({serving})") from None


def _pull_locked(store, model: str, channel: str, dest: Path, trust_file, current: dict | None) -> PullResult:
    trust = DeviceTrust(dest, trust_file)
    key = store.channel_key(model, channel)
    where = store.url(key)
    data = store.read(key, MAX_POINTER_BYTES)
    if data is None:
        raise StoreError(f"{where}: no such channel for model {model!r}")
    if len(data) > MAX_POINTER_BYTES:
        raise RefusedError(f"{where}: longer than {MAX_POINTER_BYTES} bytes; refusing it")
    try:
        envelope = json.loads(data)
    except ValueError:
        raise RefusedError(f"{where}: not JSON; refusing it") from None
    # The root comes first: the pointer may be signed by keys of a newer root it names.
    trust.update_root(store, _root_hint(envelope))
    signed = trust.verify_pointer(envelope, model, channel, where)
    want = _pointer_fields(signed, where)
    if current and current.get("version") == want["version"] and current.get("sha256") == want["sha256"] \
            and _file_sha(dest / "current" / want["artifact"]) == want["sha256"]:
        trust.record(model, channel, signed)
        return PullResult(model, channel, want["version"], False, dest / "current")
    staging = dest / f".staging-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        _download(store, trust, model, channel, want, staging)
        installed = _install(dest, staging, want["version"])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    trust.record(model, channel, signed)
    previous = current.get("version") if current else None
    log.info("installed %s version %s (channel %s) at %s", model, want["version"], channel, installed)
    return PullResult(model, channel, want["version"], True, dest / "current", previous)


def watch(store_uri: str, model: str, channel: str, dest: str | Path, *, interval: float = 60.0,
          max_polls: int | None = None, on_poll: Callable[[str], None] = log.info,
          sleep: Callable[[float], None] = time.sleep, trust: str | Path | None = None, **settings: Any) -> int:
    """Poll the channel every ``interval`` seconds (``max_polls`` times, or forever) and pull
    what it names. A poll that fails keeps the current model. Returns the failed polls."""
    if interval < 0:
        raise ConfigError(f"interval must be >= 0 seconds, got {interval}")
    failures = polls = 0
    while max_polls is None or polls < max_polls:
        if polls:
            sleep(interval)
        polls += 1
        try:
            result = pull(store_uri, model, channel, dest, trust=trust, **settings)
            on_poll(f"poll {polls}: {'installed' if result.changed else 'unchanged at'} version {result.version}")
        except RefusedError as exc:
            failures += 1
            on_poll(f"poll {polls}: refused, keeping the current model: {exc}")
        except OnnxcastError as exc:
            failures += 1
            on_poll(f"poll {polls}: failed, keeping the current model: {exc}")
    return failures


def predict(model_dir: str | Path, input_csv: str | Path, out: TextIO | None = None,
            threads: int = 1) -> np.ndarray:
    """Forecast from the last ``lookback`` rows of ``input_csv`` with ``model_dir/current``;
    write ``step,forecast`` CSV to ``out`` (stdout by default) and return the forecast."""
    import onnxruntime as ort

    model_path = installed_model(model_dir)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    meta = _prefixed(session.get_modelmeta().custom_metadata_map)
    missing = [k for k in PREDICT_METADATA if k not in meta]
    if missing:
        raise VerificationError(f"{model_path}: ONNX metadata lacks onnxcast.{', onnxcast.'.join(missing)}")
    columns = [meta["target"], *[c for c in meta["features"].split(",") if c]]
    history = read_window(input_csv, columns, int(meta["lookback"]))
    forecast = session.run([OUTPUT_NAME], {INPUT_NAME: history[None]})[0][0]
    out = out or sys.stdout
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", "forecast"])
    for step, value in enumerate(forecast, start=1):
        writer.writerow([step, np.format_float_positional(np.float32(value), unique=True, trim="-")])
    return forecast


def installed_model(model_dir: str | Path) -> Path:
    """The ONNX file ``model_dir/current`` serves, after checking its sha256."""
    current = Path(model_dir) / "current"
    info = _installed(current)
    if info is None:
        raise ConfigError(f"{current}: no model installed; run 'onnxcast edge pull' first")
    path = current / check_name("artifact", info["artifact"])
    if _file_sha(path) != info.get("sha256"):
        raise VerificationError(f"{path}: sha256 does not match the pulled manifest; pull again")
    return path


def read_window(path: str | Path, columns: list[str], lookback: int) -> np.ndarray:
    """The last ``lookback`` rows of ``columns`` in CSV ``path`` as float32 ``[lookback, n]``."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise DataError(f"{path}: missing column(s) {missing}; found {reader.fieldnames or []}")
            rows = list(reader)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None
    if len(rows) < lookback:
        raise DataError(f"{path}: {len(rows)} row(s), the model needs the last {lookback}")
    first = len(rows) - lookback
    window = np.empty((lookback, len(columns)), dtype=np.float32)
    for i, row in enumerate(rows[first:]):
        for j, column in enumerate(columns):
            try:
                window[i, j] = float(row[column])
            except (TypeError, ValueError):
                raise DataError(f"{path}: column {column!r} has non-numeric value {row[column]!r} "
                                f"at data row {first + i + 1}") from None
    if not np.isfinite(window).all():
        i, j = np.argwhere(~np.isfinite(window))[0]
        raise DataError(f"{path}: column {columns[j]!r} is not finite at data row {first + i + 1}")
    return window


def inspect_model(path: str | Path, expected_signature: dict | None = None) -> ModelInfo:
    """Check an ONNX file as a device would before serving it; VerificationError listing
    every problem: parse, external data, I/O contract, metadata, signature, ORT load.

    With the ``onnx`` package (the full install) the file is read with it; a light device
    install has no ``onnx``, so the same checks run on the protobuf wire format and on an
    ONNX Runtime session (:func:`_inspect_with_ort`)."""
    try:
        import onnx
    except ImportError:
        return _inspect_with_ort(Path(path), expected_signature)

    path = Path(path)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf decode errors have no common public type
        raise VerificationError(f"{path}: not a readable ONNX model ({type(exc).__name__})") from None
    problems = external_data_problems(proto, path.parent)
    found = signature(proto)
    problems += contract_problems(found)
    metadata = read_metadata(proto)
    problems += [f"metadata lacks onnxcast.{k}" for k in PREDICT_METADATA if k not in metadata]
    if expected_signature is not None and found != expected_signature:
        problems.append(f"I/O signature {found} differs from the manifest's {expected_signature}")
    if not problems:
        problems += _ort_load_problems(path)
    if problems:
        raise VerificationError(f"{path}: " + "; ".join(problems))
    return ModelInfo(found, opset_of(proto), metadata)


def external_data_problems(proto, folder: Path) -> list[str]:
    """Every tensor stored outside the file. Devices download one self-contained file, so
    each is a problem; those resolving outside ``folder`` are named as such."""
    import onnx

    problems = []
    root = folder.resolve()
    for tensor in _all_tensors(proto.graph, proto):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (root / location).resolve()
        where = "outside the model folder" if os.path.isabs(location) or not target.is_relative_to(root) \
            else "not in the manifest"
        problems.append(f"tensor {tensor.name!r} references external data {location!r} ({where})")
    return problems


# --- helpers ------------------------------------------------------------------------------

def _root_hint(envelope: object) -> int:
    """The root version an (as yet unverified) pointer names; 0 when it names none."""
    signed = envelope.get("signed") if isinstance(envelope, dict) else None
    hint = signed.get("root_version") if isinstance(signed, dict) else None
    return hint if isinstance(hint, int) and not isinstance(hint, bool) and hint > 0 else 0


def _pointer_fields(value: dict, where: str) -> dict:
    try:
        want = {k: value[k] for k in ("version", "artifact", "sha256", "length", "counter")}
        manifest = value["manifest"]
        want["manifest_sha256"], want["manifest_length"] = manifest["sha256"], manifest["length"]
        check_name("version", want["version"])
        check_name("artifact", want["artifact"])
        for name in ("length", "manifest_length"):
            if not isinstance(want[name], int) or isinstance(want[name], bool) or want[name] < 0:
                raise RefusedError(f"{name} is not a byte count")
    except (KeyError, TypeError, OnnxcastError) as exc:
        raise RefusedError(f"{where}: malformed channel pointer ({exc}); refusing it") from None
    return want


def _read_signed_length(store, key: str, length: int, sha256: str, what: str, version: str) -> bytes:
    """Download ``key``, never more than ``length`` + 1 bytes, and check it is exactly the
    signed length and digest."""
    where = store.url(key)
    data = store.read(key, length)
    if data is None:
        raise RefusedError(f"{where}: {what} missing; refusing version {version}")
    if len(data) > length:
        raise RefusedError(f"{where}: longer than its signed length of {length} bytes (stopped reading); "
                           f"refusing version {version}")
    if len(data) != length or sha256_hex(data) != sha256:
        raise RefusedError(f"{where}: sha256 {sha256_hex(data)[:12]} ({len(data)} bytes) does not match the signed "
                           f"{sha256[:12]} ({length} bytes); refusing version {version}")
    return data


def _download(store, trust: DeviceTrust, model: str, channel: str, want: dict, staging: Path) -> None:
    """Fetch and check the manifest and the artifact into ``staging``."""
    version, artifact = want["version"], want["artifact"]
    manifest_key = store.version_key(model, version)
    data = _read_signed_length(store, manifest_key, want["manifest_length"], want["manifest_sha256"],
                               "manifest", version)
    try:
        envelope = json.loads(data)
    except ValueError:
        raise RefusedError(f"{store.url(manifest_key)}: not JSON; refusing version {version}") from None
    manifest = trust.verify_manifest(envelope, model, version, store.url(manifest_key))
    entry = (manifest.get("artifacts") or {}).get(artifact) or {}
    if (manifest.get("channels") or {}).get(channel, {}).get("artifact") != artifact \
            or entry.get("sha256") != want["sha256"] or entry.get("size_bytes") != want["length"]:
        raise RefusedError(f"{store.url(manifest_key)}: does not list {artifact} with the pointer's sha256 and "
                           f"length for channel {channel!r}; refusing version {version}")
    blob = _read_signed_length(store, store.version_key(model, version, artifact), want["length"], want["sha256"],
                               "artifact", version)
    (staging / MANIFEST).write_bytes(data)
    (staging / artifact).write_bytes(blob)
    inspect_model(staging / artifact, expected_signature=entry.get("signature"))
    pulled = {"model": model, "channel": channel, "store": store.uri, **want,
              "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (staging / PULLED).write_text(json.dumps(pulled, indent=2) + "\n")
    for name in (MANIFEST, artifact, PULLED):
        with open(staging / name, "rb") as f:
            os.fsync(f.fileno())


def _install(dest: Path, staging: Path, version: str) -> Path:
    """Move ``staging`` to ``dest/versions/<version>``, then swap the symlinks; keep the
    previous version and remove older ones."""
    versions = dest / "versions"
    versions.mkdir(exist_ok=True)
    current = dest / "current"
    old = current.resolve() if current.is_symlink() else None
    target = versions / version
    if target.exists() and target.resolve() == old:  # same version re-pulled over a corrupt copy
        target = versions / f"{version}.{uuid.uuid4().hex[:8]}"
    elif target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    if old is not None and old != target:
        _swap_link(dest / "previous", old.relative_to(dest))
    _swap_link(current, target.relative_to(dest))
    keep = {target, old, (dest / "previous").resolve()}
    for entry in versions.iterdir():
        if entry.resolve() not in keep:
            shutil.rmtree(entry, ignore_errors=True)
    return target


def _swap_link(link: Path, target: Path) -> None:
    tmp = link.with_name(f".{link.name}.{uuid.uuid4().hex}")
    os.symlink(target, tmp)
    os.replace(tmp, link)  # atomic: readers see the old link or the new one


def _installed(current: Path) -> dict | None:
    try:
        return json.loads((current / PULLED).read_text())
    except (OSError, ValueError):
        return None


def _file_sha(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def _prefixed(metadata: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix(METADATA_PREFIX): v for k, v in metadata.items() if k.startswith(METADATA_PREFIX)}


_ORT_TYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
              "tensor(bfloat16)": "bfloat16", "tensor(int64)": "int64", "tensor(int32)": "int32",
              "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(bool)": "bool", "tensor(string)": "object"}


def _inspect_with_ort(path: Path, expected_signature: dict | None) -> ModelInfo:
    """inspect_model without the ``onnx`` package: external data and opset from the
    protobuf wire format (checked before ONNX Runtime opens the file), then the I/O
    signature and metadata from an ORT session."""
    import onnxruntime as ort

    try:
        scan = scan_model_bytes(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise VerificationError(f"{path}: not a readable ONNX model ({type(exc).__name__})") from None
    root = path.parent.resolve()
    problems = []
    for name, location in scan["external"]:
        target = (root / location).resolve()
        where = "outside the model folder" if os.path.isabs(location) or not target.is_relative_to(root) \
            else "not in the manifest"
        problems.append(f"tensor {name!r} references external data {location!r} ({where})")
    if problems:
        raise VerificationError(f"{path}: " + "; ".join(problems))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
        raise VerificationError(f"{path}: onnxruntime {ort.__version__} cannot load it: "
                                f"{str(exc).splitlines()[0]}") from None

    def describe(values) -> list[dict]:
        return [{"name": v.name, "dtype": _ORT_TYPES.get(v.type, v.type),
                 "shape": [d if isinstance(d, int) or d is None else str(d) for d in v.shape]} for v in values]

    found = {"inputs": describe(session.get_inputs()), "outputs": describe(session.get_outputs())}
    problems = contract_problems(found)
    metadata = _prefixed(session.get_modelmeta().custom_metadata_map)
    problems += [f"metadata lacks onnxcast.{k}" for k in PREDICT_METADATA if k not in metadata]
    if expected_signature is not None and found != expected_signature:
        problems.append(f"I/O signature {found} differs from the manifest's {expected_signature}")
    if problems:
        raise VerificationError(f"{path}: " + "; ".join(problems))
    return ModelInfo(found, scan["opset"], metadata)


def scan_model_bytes(data: bytes) -> dict:
    """``{"opset": default-domain opset, "external": [(tensor name, location)]}`` read from
    ONNX ModelProto bytes on the protobuf wire format: every tensor of the graph, its
    subgraphs, sparse initializers and model-local functions. ValueError if malformed."""
    external: list[tuple[str, str]] = []
    opset = 0
    # field numbers from onnx.proto: which fields of which message hold what
    model_graph, model_opset, model_functions = 7, 8, 25
    graph_node, graph_initializer, graph_sparse = 1, 5, 15
    node_attribute, function_node = 5, 7
    attr_tensor, attr_graph, attr_tensors, attr_graphs, attr_sparse, attr_sparses = 5, 6, 10, 11, 22, 23

    def tensor(buf: bytes) -> None:
        name, location, is_external = "", "", False
        for field, wire, value in _fields(buf):
            if field == 8 and wire == 2:
                name = value.decode(errors="replace")
            elif field == 14 and wire == 0 and value == 1:  # data_location = EXTERNAL
                is_external = True
            elif field == 13 and wire == 2:
                entry = {f: v for f, w, v in _fields(value) if w == 2}
                if entry.get(1) == b"location":
                    location = entry.get(2, b"").decode(errors="replace")
        if is_external or location:
            external.append((name, location))

    def sparse(buf: bytes) -> None:
        for field, wire, value in _fields(buf):
            if field in (1, 2) and wire == 2:
                tensor(value)

    def node(buf: bytes) -> None:
        for field, wire, value in _fields(buf):
            if field == node_attribute and wire == 2:
                for f, w, v in _fields(value):
                    if w != 2:
                        continue
                    if f in (attr_tensor, attr_tensors):
                        tensor(v)
                    elif f in (attr_graph, attr_graphs):
                        graph(v)
                    elif f in (attr_sparse, attr_sparses):
                        sparse(v)

    def graph(buf: bytes) -> None:
        for field, wire, value in _fields(buf):
            if wire != 2:
                continue
            if field == graph_node:
                node(value)
            elif field == graph_initializer:
                tensor(value)
            elif field == graph_sparse:
                sparse(value)

    for field, wire, value in _fields(data):
        if wire != 2:
            continue
        if field == model_graph:
            graph(value)
        elif field == model_opset:
            entry = {f: v for f, _, v in _fields(value)}
            if entry.get(1, b"") in (b"", b"ai.onnx") and isinstance(entry.get(2), int):
                opset = entry[2]
        elif field == model_functions:
            for f, w, v in _fields(value):
                if f == function_node and w == 2:
                    node(v)
    return {"opset": opset, "external": external}


def _fields(buf: bytes):
    """(field number, wire type, value) of each field of one protobuf message: varints as
    int, length-delimited fields as bytes; fixed-width fields skipped. ValueError when the
    bytes are not a protobuf message."""
    i, end = 0, len(buf)

    def varint() -> int:
        nonlocal i
        result = shift = 0
        while True:
            if i >= end or shift > 63:
                raise ValueError("truncated varint")
            byte = buf[i]
            i += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    while i < end:
        key = varint()
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ValueError("field number 0")
        if wire == 0:
            yield field, wire, varint()
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            size = varint()
            if i + size > end:
                raise ValueError("truncated field")
            yield field, wire, buf[i:i + size]
            i += size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if i > end:
            raise ValueError("truncated field")


def _ort_load_problems(path: Path) -> list[str]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
        return [f"onnxruntime {ort.__version__} cannot load it: {str(exc).splitlines()[0]}"]
    return []


def _all_tensors(graph, model=None):
    """Every TensorProto in ``graph``: initializers, sparse initializers, node attributes,
    and the same in subgraphs and (for the top graph) model-local functions."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    nodes = list(graph.node) + ([n for f in model.functions for n in f.node] if model is not None else [])
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for sub in attr.graphs:
                yield from _all_tensors(sub)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (one pull at a time per folder; freed if we die)."""
    import fcntl

    with open(path, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
