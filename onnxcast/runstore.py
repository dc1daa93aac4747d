"""The run store: where the tasks of one pipeline run hand files to each other.

Airflow may run each task of a DAG run on a different host (Celery workers, Kubernetes
pods), so tasks share nothing but this store. It is a local folder (the embedded
one-machine mode) or an object-store URL: ``s3://bucket/prefix`` (boto3, credentials from
the caller: the ``aws_default`` connection in Airflow) or any other URL Airflow's
``ObjectStoragePath`` understands (fsspec). A run directory in the store looks like a
local one (:class:`onnxcast.pipeline.layout.RunLayout`), plus one commit marker per finished step::

    <root>/<dag_id>/<run_id>/
        config.json, plan.json, data/..., models/<family>/..., report.json
        _steps/<step>.json        {"step", "files": {path: {"sha256", "size"}}, "host", "committed"}

A task never works in the store. It *stages* the committed files it needs into local
scratch (:meth:`RunDir.stage`), works there, and *publishes* what it changed: every file
first, the step's marker last (:meth:`RunDir.publish`). Readers go by the markers only
and check every byte against the marker's sha256, so a task that died half-way through
an upload (a retry, or a second attempt on another host) is never read: its files are
either not listed by any marker yet, or rejected for not matching.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from onnxcast.base import environment
from onnxcast.base.errors import OnnxcastError
from onnxcast.base.files import sha256_bytes, write_bytes_atomic
from onnxcast.base.s3 import (
    ACCESS_DENIED,
    NO_SUCH_BUCKET,
    NO_SUCH_KEY,
    S3Settings,
    make_client,
    s3_error_code,
    s3_error_kind,
    split_s3_uri,
)
from onnxcast.pipeline.layout import RunLayout

log = logging.getLogger(__name__)

STEPS = "_steps"
MARKER_VERSION = 1
_STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class RunStoreError(OnnxcastError):
    """The run store cannot be reached, refuses access, or holds no committed step asked for."""


class IncompleteRunError(RunStoreError):
    """A step's output is missing or differs from its commit marker (being rewritten, or damaged)."""


class Backend(Protocol):
    """Bytes under keys relative to a root (``a/b.json``)."""

    def read(self, key: str) -> bytes: ...  # FileNotFoundError when absent

    def write(self, key: str, data: bytes) -> None: ...  # whole object, atomic for readers

    def list(self, prefix: str) -> list[str]: ...  # keys under prefix ("" = all)

    def url(self, key: str = "") -> str: ...


# --- backends -----------------------------------------------------------------------------

class LocalBackend:
    """A folder; writes go to a temporary name and are renamed into place."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()

    def _path(self, key: str) -> Path:
        return _confined(self.root, key)

    def read(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def write(self, key: str, data: bytes) -> None:
        write_bytes_atomic(self._path(key), data)

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*")
                      if p.is_file() and not p.name.endswith(".tmp"))

    def url(self, key: str = "") -> str:
        return str(self._path(key)) if key else str(self.root)


class S3Backend:
    """An S3 prefix through a boto3 client (bounded timeouts and retries: onnxcast.base.s3)."""

    def __init__(self, bucket: str, prefix: str, client) -> None:
        self.bucket, self.prefix, self.client = bucket, prefix.strip("/"), client

    def _key(self, key: str) -> str:
        _confined(Path("/r"), key)  # no absolute keys or ..
        return f"{self.prefix}/{key}" if self.prefix else key

    def read(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except Exception as exc:  # noqa: BLE001 - botocore errors, classified below
            if s3_error_kind(exc) == NO_SUCH_KEY:
                raise FileNotFoundError(self.url(key)) from None
            raise self._error("read", key, exc) from None

    def write(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except Exception as exc:  # noqa: BLE001
            raise self._error("write", key, exc) from None

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix) if prefix else self.prefix
        start = f"{full}/" if full else ""
        keys: list[str] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start):
                keys += [obj["Key"] for obj in page.get("Contents", [])]
        except Exception as exc:  # noqa: BLE001
            raise self._error("list", prefix, exc) from None
        cut = len(self.prefix) + 1 if self.prefix else 0
        return sorted(k[cut:] for k in keys)

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{self._key(key) if key else self.prefix}".rstrip("/")

    def _error(self, action: str, key: str, exc: Exception) -> RunStoreError:
        code, kind = s3_error_code(exc), s3_error_kind(exc)
        if kind == ACCESS_DENIED:
            return RunStoreError(f"{self.url(key)}: access denied ({action}, {code}); check the aws_default "
                                 "connection's credentials and the bucket policy")
        if kind == NO_SUCH_BUCKET:
            return RunStoreError(f"{self.url(key)}: bucket {self.bucket!r} does not exist")
        return RunStoreError(f"{self.url(key)}: cannot {action} ({code or type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:200]})")


def backend_for(url: str, *, s3_settings: S3Settings | None = None,
                other: Callable[[str], Backend] | None = None) -> Backend:
    """The backend of a run root or run directory URL: a local path (or ``file://``),
    ``s3://`` (a client for ``s3_settings``; None: boto3's chain), or, for any other
    scheme, what ``other`` makes of the URL (in Airflow: an ObjectStoragePath backend)."""
    if url.startswith("s3://"):
        bucket, prefix = split_s3_uri(url)
        return S3Backend(bucket, prefix, make_client(s3_settings))
    if "://" not in url or url.startswith("file://"):
        return LocalBackend(url.removeprefix("file://"))
    if other is None:
        scheme = url.partition("://")[0]
        raise RunStoreError(f"{url}: no filesystem for scheme {scheme!r} outside Airflow; use s3://, a local folder "
                            "(embedded mode), or, in Airflow, a provider that registers this filesystem")
    return other(url)


# --- run directories ----------------------------------------------------------------------

@dataclass
class Staged:
    """What :meth:`RunDir.stage` put into scratch: path -> sha256, to tell changed files apart."""

    folder: Path
    files: dict[str, str] = field(default_factory=dict)


class RunDir:
    """One run directory in the store (``url``): stage committed steps in, publish a step out."""

    def __init__(self, url: str, backend: Backend) -> None:
        self.url = url
        self.backend = backend

    # reading
    def markers(self) -> list[dict]:
        """Every commit marker of the run, oldest first."""
        found = []
        for key in self.backend.list(STEPS):
            if not key.endswith(".json"):
                continue
            try:
                marker = json.loads(self.backend.read(key))
            except FileNotFoundError:
                continue
            except ValueError:
                raise IncompleteRunError(f"{self.backend.url(key)}: commit marker is not JSON") from None
            if not isinstance(marker, dict) or not isinstance(marker.get("files"), dict):
                raise IncompleteRunError(f"{self.backend.url(key)}: commit marker has no 'files' mapping")
            found.append(marker)
        return sorted(found, key=lambda m: (m.get("committed", ""), m.get("step", "")))

    def committed(self, step: str) -> dict | None:
        try:
            return json.loads(self.backend.read(_marker_key(step)))
        except FileNotFoundError:
            return None

    def files(self) -> dict[str, str]:
        """Every committed file of the run: run-relative path -> the step that committed it
        (the newest, when several did). What a task consults to choose ``paths`` to stage."""
        return {relative: meta["step"] for relative, meta in _files_of(self.markers()).items()}

    def stage(self, scratch: str | Path, *, families: Iterable[str] | None = None,
              require: Iterable[str] = (), paths: Iterable[str] | None = None) -> Staged:
        """Download the committed files into ``scratch``, each checked against its marker.

        ``families``: only these families' ``models/<family>/`` files (None: every family).
        ``require``: steps that must have committed (else IncompleteRunError naming them).
        ``paths``: only files under these run-relative prefixes (None: every file), matched
        whole segment by segment (:func:`under_prefix`): a shard task of a fleet stages its
        own shard's files, not the other shards' (design: docs/design/fleet.md 5.3).
        A file listed by several markers comes from the newest one.
        """
        scratch = Path(scratch).resolve()
        markers = self.markers()
        done = {m.get("step") for m in markers}
        missing = [s for s in require if s not in done]
        if missing:
            raise IncompleteRunError(f"{self.url}: step(s) {', '.join(missing)} have not committed; did they "
                                     f"succeed? (committed: {', '.join(sorted(filter(None, done))) or 'none'})")
        wanted = None if families is None else set(families)
        prefixes = None if paths is None else _Prefixes([_checked_prefix(p) for p in paths])
        files = _files_of(markers)
        staged = Staged(scratch)
        layout = RunLayout(scratch)
        for relative, meta in sorted(files.items()):
            family = layout.family_of(relative)
            if wanted is not None and family is not None and family not in wanted:
                continue
            if prefixes is not None and not _wanted(relative, prefixes):
                continue
            target = _confined(scratch, relative)
            try:
                data = self.backend.read(relative)
            except FileNotFoundError:
                raise IncompleteRunError(f"{self.backend.url(relative)}: listed by step {meta['step']!r} but "
                                         "absent from the run store") from None
            digest = sha256_bytes(data)
            if digest != meta.get("sha256"):
                raise IncompleteRunError(f"{self.backend.url(relative)}: sha256 {digest[:12]} differs from "
                                         f"{str(meta.get('sha256'))[:12]} committed by step {meta['step']!r} "
                                         "(being rewritten, or damaged)")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            staged.files[relative] = digest
        log.info("staged %d file(s) of %d step(s) from %s", len(staged.files), len(markers), self.url)
        return staged

    # writing
    def publish(self, step: str, scratch: str | Path, staged: Staged | None = None, *,
                meta: dict | None = None) -> dict:
        """Upload the files of ``scratch`` that are new or changed since ``staged``, then the
        step's commit marker (last). Returns the marker."""
        if not _STEP_NAME.match(step):
            raise RunStoreError(f"step name {step!r}: letters, digits, '.', '_' and '-' only")
        scratch = Path(scratch).resolve()
        before = staged.files if staged else {}
        files: dict[str, dict] = {}
        for path in sorted(p for p in scratch.rglob("*") if p.is_file()):
            relative = path.relative_to(scratch).as_posix()
            if relative.startswith(f"{STEPS}/") or path.name.endswith(".tmp"):
                continue
            if path.is_symlink():
                raise RunStoreError(f"{path}: a symlink in the scratch folder; refusing to publish it")
            data = path.read_bytes()
            digest = sha256_bytes(data)
            if before.get(relative) == digest:
                continue
            self.backend.write(relative, data)
            files[relative] = {"sha256": digest, "size": len(data)}
        now = time.time_ns()
        committed = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now // 10**9)) + f".{now % 10**9:09d}Z"
        marker = {"version": MARKER_VERSION, "step": step, "files": files, "host": _hostname(),
                  "committed": committed, **(meta or {})}
        self.backend.write(_marker_key(step), json.dumps(marker, indent=1, sort_keys=True).encode())
        log.info("published step %s: %d file(s) to %s", step, len(files), self.url)
        return marker


class RunStore:
    """Where run directories live: ``<root>/<dag_id>/<run_id>``. ``s3_settings`` and
    ``other`` go to :func:`backend_for` when a run directory is opened (``other``: the
    backend for a URL of another scheme, in Airflow an ObjectStoragePath one)."""

    def __init__(self, root: str, *, s3_settings: S3Settings | None = None,
                 other: Callable[[str], Backend] | None = None) -> None:
        self.root = root.rstrip("/") if "://" in root else str(Path(root).expanduser().resolve())
        self.s3_settings = s3_settings
        self.other = other

    def run_url(self, dag_id: str, run_id: str) -> str:
        return f"{self.root}/{safe_segment(dag_id)}/{safe_segment(run_id)}"

    def open(self, url: str) -> RunDir:
        """The run directory at ``url`` (a URL :meth:`run_url` made, passed on through XCom)."""
        return RunDir(url, backend_for(url, s3_settings=self.s3_settings, other=self.other))


def safe_segment(value: str) -> str:
    """A DAG or run id as one path segment (run ids may hold ``:`` and ``+``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", value)


def _files_of(markers: list[dict]) -> dict[str, dict]:
    """path -> its marker entry plus ``step``, the newest marker winning (markers oldest first)."""
    files: dict[str, dict] = {}
    for marker in markers:
        for relative, meta in marker["files"].items():
            files[relative] = {**meta, "step": marker.get("step")}
    return files


def under_prefix(relative: str, prefix: str) -> bool:
    """Whether the run-relative file ``relative`` is ``prefix`` or lies under it, segment by
    segment: ``data/shards/001`` holds ``data/shards/001/rows.parquet`` but not
    ``data/shards/0010/...``; a ``*`` segment matches any one segment (``models/*/onnx``)."""
    wanted = [part for part in prefix.split("/") if part]
    parts = relative.split("/")
    if len(parts) < len(wanted):
        return False
    return all(w == "*" or w == p for w, p in zip(wanted, parts, strict=False))


class _Prefixes:
    """Prefixes split into plain ones (a set: a shard task may name thousands of files) and
    ones with a ``*`` segment (matched one by one)."""

    def __init__(self, prefixes: list[str]) -> None:
        self.plain = {"/".join(part for part in p.split("/") if part) for p in prefixes if "*" not in p.split("/")}
        self.wild = [p for p in prefixes if "*" in p.split("/")]


def _wanted(relative: str, prefixes: _Prefixes) -> bool:
    parts = relative.split("/")
    return (any("/".join(parts[:n]) in prefixes.plain for n in range(1, len(parts) + 1))
            or any(under_prefix(relative, p) for p in prefixes.wild))


def _checked_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not prefix.strip("/") or prefix.startswith("/") or ".." in prefix.split("/"):
        raise RunStoreError(f"run store prefix {prefix!r} is not a relative path inside the run directory")
    return prefix


def _marker_key(step: str) -> str:
    return f"{STEPS}/{step}.json"


def _confined(root: Path, relative: str) -> Path:
    """``root / relative`` if it stays inside ``root`` (no absolute paths, no ``..``)."""
    if not relative or relative.startswith(("/", "\\")) or "\x00" in relative:
        raise RunStoreError(f"run store path {relative!r} is not a relative path")
    target = (root / relative).resolve()
    if target == root or not target.is_relative_to(root):
        raise RunStoreError(f"run store path {relative!r} points outside {root}")
    return target


def _hostname() -> str:
    return environment.get("ONNXCAST_WORKER_HOSTNAME") or socket.getfqdn()
