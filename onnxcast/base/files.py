"""Files the pipeline writes for itself: atomic replacement, SHA-256 digests, JSON.

For the run folder and the local run store, which onnxcast owns. Folders a user or an
attacker may hold (a device folder, a local rollout store) are written through their
directory descriptor instead (:mod:`onnxcast.rollout.device`, :mod:`onnxcast.rollout.store`),
and untrusted files are read with :mod:`onnxcast.base.untrusted`. Standard library only:
the device distribution ships this module.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from onnxcast.base import environment

_CHUNK = 1 << 20


def onnxcast_home(home: str | Path | None = None, default: str | Path = ".onnxcast") -> Path:
    """The folder of onnxcast's local state (MLflow's SQLite store, keys, runs, the embedded
    rollout store): ``home``, else ``$ONNXCAST_HOME``, else ``default`` (the working directory's
    ``.onnxcast``; the repository's scripts pass the repository's)."""
    return Path(home or environment.get("ONNXCAST_HOME") or default).resolve()


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; on success it replaces ``path`` in one
    rename (readers see the old file or the whole new one), on failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    with replacing(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: str | Path, value: Any) -> Path:
    """Write JSON atomically (indented, values JSON lacks written as strings)."""
    return write_text_atomic(path, json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")


def json_safe(value: Any) -> Any:
    """``value`` (nested dicts, lists, tuples) with NaN and infinities as None and numpy scalars
    as Python's: what JSON (strict readers, MLflow) takes."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        value = value.item()  # numpy scalars, without importing numpy (the device ships this module)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float, None for NaN or inf (JSON and MLflow take no NaN)."""
    value = float(value)
    return value if math.isfinite(value) else None


def read_json(path: str | Path) -> Any:
    """A JSON file the pipeline wrote itself (untrusted JSON: :func:`onnxcast.base.untrusted.read_json_file`)."""
    return json.loads(Path(path).read_text())


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """The file's SHA-256, read in chunks (models are large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
