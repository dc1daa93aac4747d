"""The rollout store: immutable model versions and movable channel pointers, in a local
directory or under an S3 prefix, with the same layout (a contract,
docs/architecture.md#contract-the-rollout-store):

    <store>/<model>/versions/<version>/manifest.json      written once
    <store>/<model>/versions/<version>/<artifact>.onnx    written once
    <store>/<model>/channels/<channel>.json               moved by compare-and-swap

Two primitives make promotion safe. ``create`` writes a key only if it does not exist
(S3 ``If-None-Match: *``; locally a hard link of a complete temporary file), so a reader
never sees a half-written object and an immutable key is never overwritten.
``replace_pointer`` moves a pointer only from the value the writer read (S3 ``If-Match``
on the ETag; locally a compare under an ``flock``), so two promotions cannot both win.

This module is imported by Airflow operators at task run time: keep top-level imports to
the standard library and onnxcast.base.errors (boto3 is imported when an S3 store is used).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxcast.base.errors import ConfigError, ConflictError, StoreError, VerificationError
from onnxcast.base.files import sha256_bytes
from onnxcast.base.s3 import (
    ACCESS_DENIED,
    NO_SUCH_BUCKET,
    NO_SUCH_KEY,
    S3Settings,
    make_client,
    s3_error_code,
    s3_error_kind,
    s3_error_message,
    s3_status,
    split_s3_uri,
)
from onnxcast.base.untrusted import MAX_METADATA_BYTES, UntrustedInputError, file_kind, loads_json

MANIFEST = "manifest.json"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ROOT_FOLDER = "root"
MODEL_REPOSITORY_FOLDER = "_model_repository"  # the Triton model repository (onnxcast.rollout.repository)
MOVED = "was moved by another promotion"
# Pointers and roots are small (HISTORY_KEPT entries are ~50 KB) and nothing signs their
# length: every reader, device or writer, stops at this many bytes.
MAX_POINTER_BYTES = 1 << 20
MAX_MANIFEST_BYTES = MAX_METADATA_BYTES
# Entries a listing for readers (the rollout page) reads at most: 10 S3 pages of 1,000. The
# names are filtered as they are read, so invalid entries never take the place of valid ones.
MAX_LISTED = 10_000


def open_store(uri: str, s3_settings: S3Settings | None = None) -> RolloutStore:
    """A store for ``uri``: a directory path (or ``file://`` URI) or ``s3://bucket/prefix``.

    ``s3_settings`` apply to an S3 store; None means the environment (``AWS_*`` as boto3 reads
    them, ``ONNXCAST_STORE_SSE``, ``ONNXCAST_STORE_SSE_KMS_KEY_ID``). A local store takes none.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError(f"store URI is empty: {uri!r}")
    if uri.startswith("s3://"):
        try:
            bucket, prefix = split_s3_uri(uri)
        except ValueError:  # no bucket
            bucket, prefix = "", ""
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket):
            raise ConfigError(f"store URI {uri!r}: {bucket!r} is not a valid S3 bucket name")
        return S3Store(bucket, prefix.strip("/"), s3_settings if s3_settings is not None else S3Settings.from_values({}))
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    elif "://" in uri:
        raise ConfigError(f"unsupported store URI {uri!r}: expected a directory path or s3://bucket/prefix")
    if s3_settings is not None:
        raise ConfigError(f"a local store takes no settings, got {s3_settings!r}")
    return LocalStore(Path(uri))


def _valid_name(value: str) -> bool:
    return bool(NAME_PATTERN.fullmatch(value)) and ".." not in value


def check_name(kind: str, value: str) -> str:
    """``value`` if it is a safe path segment (letters, digits, ``._-``), else ConfigError."""
    # fullmatch: with match, "$" also matches before a trailing newline ("7\n" was a version).
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value) or ".." in value:
        raise ConfigError(f"invalid {kind} name {value!r}: use letters, digits, '.', '_' and '-' (max 128)")
    return value


def dump_json(value: Any) -> bytes:
    """The byte form of a manifest or pointer: stable, so equal values give equal bytes."""
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def signed_part(value: dict | None) -> dict | None:
    """The ``signed`` object of a signed envelope (manifest, pointer), else ``value`` itself.
    For writers and people reading the store: a device verifies the envelope instead."""
    if isinstance(value, dict) and isinstance(value.get("signed"), dict):
        return value["signed"]
    return value


@dataclass(frozen=True)
class Listing:
    """What a listing for readers found: the first ``want`` valid names in order, and how
    complete that is. ``truncated`` when more valid names exist than were asked for, or the
    folder holds more entries than the listing reads (``stopped_at``: that many were read);
    ``skipped``: entries read that are not valid names (never shown)."""

    names: list[str]
    truncated: bool
    read: int
    skipped: int
    stopped_at: int | None = None  # set when the listing stopped at its bound with entries left


@dataclass(frozen=True)
class Pointer:
    """A channel pointer as read: its value (the signed fields; None when absent), the token
    to swap from, its raw bytes and the whole parsed envelope (signatures included)."""

    value: dict | None
    token: str | None
    raw: bytes | None = None
    envelope: dict | None = None


class RolloutStore(ABC):
    """The layout and the primitives shared by both backends."""

    uri: str

    # --- layout ---------------------------------------------------------------------------
    def version_key(self, model: str, version: str, name: str = MANIFEST) -> str:
        for kind, value in (("model", model), ("version", version), ("artifact", name)):
            check_name(kind, value)
        return f"{model}/versions/{version}/{name}"

    def channel_key(self, model: str, channel: str) -> str:
        check_name("model", model)
        check_name("channel", channel)
        return f"{model}/channels/{channel}.json"

    def root_key(self, version: int) -> str:
        """Where trust root ``version`` is published (``root/<version>.root.json``)."""
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ConfigError(f"invalid root version {version!r}")
        return f"{ROOT_FOLDER}/{version}.root.json"

    def url(self, key: str) -> str:
        """Where ``key`` lives, for messages."""
        return f"{self.uri.rstrip('/')}/{key}"

    # --- reading --------------------------------------------------------------------------
    def read_manifest(self, model: str, version: str) -> dict | None:
        """The manifest's fields (the signed part), unverified: for writers and readers."""
        key = self.version_key(model, version)
        data = self.read_bounded(key, MAX_MANIFEST_BYTES)
        return None if data is None else signed_part(self._parse(data, key, MAX_MANIFEST_BYTES))

    def read_channel(self, model: str, channel: str) -> Pointer:
        return self.read_pointer(self.channel_key(model, channel))

    def read_bounded(self, key: str, limit: int) -> bytes | None:
        """``read`` of at most ``limit`` bytes (``limit + 1`` transferred); StoreError when longer."""
        data = self.read(key, limit)
        if data is not None and len(data) > limit:
            raise StoreError(f"{self.url(key)}: longer than {limit:,} bytes (stopped reading); refusing it")
        return data

    def _parse(self, data: bytes, key: str, limit: int = MAX_POINTER_BYTES) -> dict:
        """A JSON object of bounded size and depth: one StoreError line, never quoting it."""
        try:
            value = loads_json(data, what=self.url(key), limit=limit)
        except UntrustedInputError as exc:
            raise StoreError(f"{exc}; refusing it") from None
        if not isinstance(value, dict):
            raise StoreError(f"{self.url(key)}: expected a JSON object")
        return value

    def _pointer(self, data: bytes | None, key: str, token: str | None) -> Pointer:
        if data is None:
            return Pointer(None, None)
        if len(data) > MAX_POINTER_BYTES:
            raise StoreError(f"{self.url(key)}: longer than {MAX_POINTER_BYTES:,} bytes (stopped reading); "
                             "refusing it")
        parsed = self._parse(data, key)
        return Pointer(signed_part(parsed), token if token is not None else sha256_bytes(data), data, parsed)

    # --- primitives -----------------------------------------------------------------------
    @abstractmethod
    def read(self, key: str, max_bytes: int | None = None) -> bytes | None:
        """The object's bytes, or None when it does not exist. With ``max_bytes`` at most
        ``max_bytes + 1`` bytes are transferred, so a caller sees that it is too long
        without downloading it (a signed length bounds every download of a device)."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if absent: True when written, False when it already existed
        (nothing written; the caller compares). Readers never see partial bytes."""

    @abstractmethod
    def read_pointer(self, key: str) -> Pointer:
        """The pointer's value and swap token (None/None when absent)."""

    @abstractmethod
    def replace_pointer(self, key: str, value: dict, token: str | None) -> str:
        """Write ``value`` (a signed envelope) if the pointer still has ``token`` (None: must not exist);
        ConflictError naming the pointer otherwise. Returns the new token."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write ``key`` whatever it holds (readers see the old bytes or the new ones). Only for
        derived, rebuildable objects (the model repository's config), never versions or pointers."""

    @abstractmethod
    def list_versions(self, model: str) -> list[str]:
        """Version ids with any object under ``<model>/versions/`` (complete or not)."""

    @abstractmethod
    def list_root_names(self) -> list[str]:
        """The object names under ``root/`` (unchecked: :meth:`list_root_versions` parses them)."""

    # Whether ``_entries`` yields names in sorted order (S3 lists keys in UTF-8 byte order): a
    # sorted listing may stop once it has one valid name more than it needs.
    sorted_entries = False

    @abstractmethod
    def _entries(self, folder: str) -> Iterator[str]:
        """The names directly under ``folder`` (a key prefix without the trailing ``/``; "" is
        the store's top), objects and sub-folders alike, unchecked, read lazily (a page at a
        time): the caller decides how many it reads."""

    def list_folder(self, folder: str, limit: int = 1000) -> list[str]:
        """At most ``limit`` names directly under ``folder``, unchecked, sorted: for readers
        that list what is there."""
        names = []
        with closing(self._entries(folder)) as entries:
            for name in entries:
                if len(names) >= limit:
                    break
                names.append(name)
        return sorted(names)

    def list_names(self, folder: str, name_of: Callable[[str], str | None], want: int,
                   bound: int = MAX_LISTED, ignored: frozenset[str] = frozenset()) -> Listing:
        """The first ``want`` names under ``folder`` that ``name_of`` accepts (it returns the
        name to show, or None to skip the entry), filtered while the entries are read, never
        more than ``bound`` of them: invalid entries cannot hide valid ones, and the answer says
        whether it is complete (the rollout page). Entries in ``ignored`` (onnxcast's own
        folders) are read but neither shown nor counted as skipped."""
        kept: list[str] = []
        read, stopped_at, own = 0, None, 0
        with closing(self._entries(folder)) as entries:
            for entry in entries:
                if read >= bound:
                    stopped_at = read
                    break
                read += 1
                if entry in ignored:
                    own += 1
                    continue
                name = name_of(entry)
                if name is not None:
                    kept.append(name)
                    if self.sorted_entries and len(kept) > want:
                        break  # the rest come after these: the first ``want`` are known
        # entries in the store's order: its first ``want``; else (a folder) the first in name order
        shown = sorted(kept[:want] if self.sorted_entries else sorted(kept)[:want])
        return Listing(shown, truncated=len(kept) > want or stopped_at is not None, read=read,
                       skipped=read - own - len(kept), stopped_at=stopped_at)

    def list_models(self, want: int = 1000, bound: int = MAX_LISTED) -> Listing:
        """The model names at the top of the store (valid names only; ``root`` and the model
        repository are onnxcast's own folders, not models)."""
        return self.list_names("", lambda n: n if _valid_name(n) else None, want, bound,
                               ignored=frozenset({ROOT_FOLDER, MODEL_REPOSITORY_FOLDER}))

    def list_channels(self, model: str, want: int = 1000, bound: int = MAX_LISTED) -> Listing:
        """The channels of ``model`` with a pointer (``channels/<channel>.json``, valid names only)."""

        def channel(entry: str) -> str | None:
            name = entry.removesuffix(".json")
            return name if entry.endswith(".json") and _valid_name(name) else None

        return self.list_names(f"{check_name('model', model)}/channels", channel, want, bound)

    def list_root_versions(self) -> list[int]:
        """The versions of the trust roots published under ``root/`` (``<n>.root.json``), sorted.
        Listed rather than probed, so a root planted past a missing one is seen too."""
        found = set()
        for name in self.list_root_names():
            match = re.fullmatch(r"([1-9][0-9]{0,8})\.root\.json", name)
            if match:
                found.add(int(match.group(1)))
        return sorted(found)


# --- local directory ----------------------------------------------------------------------

class LocalStore(RolloutStore):
    """A directory. Exclusive create by hard-linking a complete temporary file; pointers
    swapped with ``os.replace`` under an ``flock`` (released by the OS if the writer dies).

    No symlink below the root is ever followed: every folder of a key is opened with
    ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's descriptor and every file with
    ``O_NOFOLLOW``, so a symlinked ``versions/<v>`` cannot send a write (or a read) outside
    the store, even if it is swapped in between a check and the write."""

    def __init__(self, root: Path):
        self.root = root.expanduser().absolute()
        self.uri = str(self.root)

    def read(self, key: str, max_bytes: int | None = None) -> bytes | None:
        try:
            with self._folder(key, create=False) as (folder, name):
                if folder is None:
                    return None
                # O_NONBLOCK: a FIFO planted at a key cannot block the open (nor the read:
                # only a regular file is read).
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
                with os.fdopen(fd, "rb") as f:
                    mode = os.fstat(f.fileno()).st_mode
                    if not stat.S_ISREG(mode):
                        raise StoreError(f"{self.url(key)}: not a regular file ({file_kind(mode)}); refusing it")
                    return f.read() if max_bytes is None else f.read(max_bytes + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"{self.url(key)}: cannot read ({_why(exc)})") from None

    def create(self, key: str, data: bytes) -> bool:
        try:
            with self._folder(key, create=True) as (folder, name):
                tmp = f".{name}.{uuid.uuid4().hex}.tmp"
                try:
                    write_new(folder, tmp, data)
                    try:
                        os.link(tmp, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
                    except FileExistsError:
                        return False
                    os.fsync(folder)
                    return True
                finally:
                    unlink_if_present(folder, tmp)
        except OSError as exc:
            raise StoreError(f"{self.url(key)}: cannot write ({_why(exc)})") from None

    def read_pointer(self, key: str) -> Pointer:
        return self._pointer(self.read(key, MAX_POINTER_BYTES), key, None)

    def replace_pointer(self, key: str, value: dict, token: str | None) -> str:
        import fcntl

        data = dump_json(value)
        try:
            with self._folder(key, create=True) as (folder, name):
                lock_fd = os.open(f".{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644, dir_fd=folder)
                with os.fdopen(lock_fd, "a+b") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)  # released on close, or when the process dies
                    current = self.read(key, MAX_POINTER_BYTES)
                    if (None if current is None else sha256_bytes(current)) != token:
                        raise ConflictError(f"{self.url(key)} {MOVED}; nothing changed, re-run to promote over it")
                    replace_at(folder, name, data)
                    os.fsync(folder)
        except OSError as exc:
            raise StoreError(f"{self.url(key)}: cannot write ({_why(exc)})") from None
        return sha256_bytes(data)

    def put(self, key: str, data: bytes) -> None:
        try:
            with self._folder(key, create=True) as (folder, name):
                replace_at(folder, name, data)
        except OSError as exc:
            raise StoreError(f"{self.url(key)}: cannot write ({_why(exc)})") from None

    def list_versions(self, model: str) -> list[str]:
        directory = self.root / check_name("model", model) / "versions"
        if not directory.is_dir() or (self.root / model).is_symlink() or directory.is_symlink():
            return []
        return sorted(p.name for p in directory.iterdir() if p.is_dir() and not p.is_symlink())

    def list_root_names(self) -> list[str]:
        try:
            with self._folder(f"{ROOT_FOLDER}/x", create=False) as (folder, _):
                return [] if folder is None else os.listdir(folder)
        except OSError as exc:
            raise StoreError(f"{self.url(ROOT_FOLDER)}: cannot list ({_why(exc)})") from None

    def _entries(self, folder: str) -> Iterator[str]:
        key = f"{folder}/x" if folder else "x"
        try:
            with self._folder(key, create=False) as (fd, _):
                if fd is None:
                    return
                with os.scandir(fd) as entries:
                    for entry in entries:  # never a symlink: the page reads nothing through one
                        if not entry.name.startswith(".") and not entry.is_symlink():
                            yield entry.name
        except OSError as exc:
            raise StoreError(f"{self.url(folder)}: cannot list ({_why(exc)})") from None

    @contextmanager
    def _folder(self, key: str, *, create: bool) -> Iterator[tuple[int | None, str]]:
        """(descriptor of the key's folder, file name), walking from the root without
        following symlinks; (None, name) when a folder is missing and ``create`` is False."""
        *parts, name = key.split("/")
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            if not create:
                yield None, name
                return
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts:
                if part in ("", ".", ".."):
                    raise StoreError(f"{self.url(key)}: invalid key")
                try:
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        yield None, name
                        return
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise StoreError(f"{self.url(key)}: {part!r} is a symlink or not a folder; "
                                         "the store never follows symlinks") from None
                    raise
                os.close(fd)
                fd = child
            yield fd, name
        finally:
            os.close(fd)


def write_new(folder: int, name: str, data: bytes) -> None:
    """Create ``folder/name`` (never existing, never a symlink) with ``data``, synced."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644,
                 dir_fd=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_at(folder: int, name: str, data: bytes) -> None:
    """Replace ``folder/name`` with ``data``: a new synced temporary file, then one rename (a
    symlink at ``name`` is replaced, never written through); the temporary file never stays."""
    tmp = f".{name}.{uuid.uuid4().hex}.tmp"
    try:
        write_new(folder, tmp, data)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        unlink_if_present(folder, tmp)


def unlink_if_present(folder: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "it is a symlink; the store never follows symlinks"
    return exc.strerror or str(exc)


# --- S3 -----------------------------------------------------------------------------------

class S3Store(RolloutStore):
    """An S3 prefix. Conditional writes (``If-None-Match``/``If-Match``), SHA-256 checksums
    and server-side encryption on every put; 412/409 become ConflictError, 403 a StoreError,
    and throttling/5xx are retried with backoff by botocore's standard retry mode."""

    def __init__(self, bucket: str, prefix: str, settings: S3Settings):
        self.bucket, self.prefix, self.settings = bucket, prefix, settings
        self.uri = f"s3://{bucket}/{prefix}".rstrip("/")
        self._client = None
        self._client_lock = threading.Lock()

    @property
    def client(self):
        """The boto3 S3 client, built on first use (boto3 clients are thread-safe)."""
        with self._client_lock:
            if self._client is None:
                self._client = make_client(self.settings)
            return self._client

    def read(self, key: str, max_bytes: int | None = None) -> bytes | None:
        found = self._get(key, max_bytes)
        return None if found is None else found[0]

    def create(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._put(key, data, IfNoneMatch="*")
            return True
        except ClientError as exc:
            if s3_status(exc) in (409, 412):  # exists (412) or a concurrent create (409)
                return False
            raise self._error(exc, "PutObject", key) from None

    def read_pointer(self, key: str) -> Pointer:
        found = self._get(key, MAX_POINTER_BYTES)
        return Pointer(None, None) if found is None else self._pointer(found[0], key, found[1])

    def replace_pointer(self, key: str, value: dict, token: str | None) -> str:
        from botocore.exceptions import ClientError

        data = dump_json(value)
        condition = {"IfMatch": token} if token else {"IfNoneMatch": "*"}
        try:
            return self._put(key, data, **condition)["ETag"]
        except ClientError as exc:
            if s3_status(exc) not in (404, 409, 412):
                raise self._error(exc, "PutObject", key) from None
        # A retried put whose first attempt landed also fails its condition: check for our bytes.
        now = self._get(key, MAX_POINTER_BYTES)
        if now is not None and now[0] == data:
            return now[1]
        raise ConflictError(f"{self.url(key)} {MOVED}; nothing changed, re-run to promote over it")

    def put(self, key: str, data: bytes) -> None:
        from botocore.exceptions import ClientError

        try:
            self._put(key, data)
        except ClientError as exc:
            raise self._error(exc, "PutObject", key) from None

    def list_versions(self, model: str) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        prefix = self._key(f"{check_name('model', model)}/versions/")
        found: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix, Delimiter="/")
            for page in pages:
                found += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        except ClientError as exc:
            raise self._error(exc, "ListObjectsV2", f"{model}/versions/") from None
        except BotoCoreError as exc:
            raise StoreError(f"{self.url(model)}: cannot reach S3 ({exc})") from None
        return sorted(found)

    sorted_entries = True  # ListObjectsV2 returns keys (and common prefixes) in UTF-8 byte order

    def _entries(self, folder: str) -> Iterator[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        prefix = self._key(f"{folder}/") if folder else (f"{self.prefix}/" if self.prefix else "")
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix, Delimiter="/", PaginationConfig={"PageSize": 1000})
            for page in pages:  # one request a page, made when the caller reads on
                found = [p["Prefix"][len(prefix):] for p in page.get("CommonPrefixes", [])]
                found += [o["Key"][len(prefix):] for o in page.get("Contents", [])]
                # in S3's order (code point order is UTF-8 byte order): a page's prefixes and keys
                # interleave, pages follow each other
                yield from (key.removesuffix("/") for key in sorted(found) if key.removesuffix("/"))
        except ClientError as exc:
            raise self._error(exc, "ListObjectsV2", f"{folder}/") from None
        except BotoCoreError as exc:
            raise StoreError(f"{self.url(folder)}: cannot reach S3 ({exc})") from None

    def list_root_names(self) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        prefix = self._key(f"{ROOT_FOLDER}/")
        found: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix, Delimiter="/")
            for page in pages:
                found += [item["Key"][len(prefix):] for item in page.get("Contents", [])]
        except ClientError as exc:
            raise self._error(exc, "ListObjectsV2", f"{ROOT_FOLDER}/") from None
        except BotoCoreError as exc:
            raise StoreError(f"{self.url(ROOT_FOLDER)}: cannot reach S3 ({exc})") from None
        return found

    # --- helpers --------------------------------------------------------------------------
    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError

        # A ranged GET transfers at most max_bytes + 1 bytes, however long the object is.
        limit = {"Range": f"bytes=0-{max_bytes}"} if max_bytes is not None else {"ChecksumMode": "ENABLED"}
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key), **limit)
            body = response["Body"]
            data = body.read() if max_bytes is None else body.read(max_bytes + 1)
            body.close()
            return data, response["ETag"]
        except ClientError as exc:
            if s3_error_kind(exc) == NO_SUCH_KEY:
                return None
            if s3_error_code(exc) == "InvalidRange":  # a ranged GET of an empty object
                return b"", ""
            raise self._error(exc, "GetObject", key) from None
        except FlexibleChecksumError as exc:
            raise VerificationError(f"{self.url(key)}: bytes received do not match the checksum S3 stored ({exc})") from None
        except BotoCoreError as exc:
            raise StoreError(f"{self.url(key)}: cannot read from S3 ({exc})") from None

    def _put(self, key: str, data: bytes, **condition: str) -> dict:
        from botocore.exceptions import BotoCoreError

        encryption = {"ServerSideEncryption": self.settings.sse}
        if self.settings.sse_kms_key_id:
            encryption["SSEKMSKeyId"] = self.settings.sse_kms_key_id
        content_type = "application/json" if key.endswith(".json") else "application/octet-stream"
        try:
            return self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                                          ContentType=content_type, ChecksumAlgorithm="SHA256",
                                          **encryption, **condition)
        except BotoCoreError as exc:
            raise StoreError(f"{self.url(key)}: cannot write to S3 ({exc})") from None

    def _error(self, exc, action: str, key: str) -> StoreError:
        code, message, kind = s3_error_code(exc) or "error", s3_error_message(exc), s3_error_kind(exc)
        if kind == ACCESS_DENIED:
            return StoreError(f"{self.url(key)}: access denied ({action} 403 {code}); "
                              "check the credentials, the IAM policy and the bucket policy")
        if kind == NO_SUCH_BUCKET:
            return StoreError(f"{self.url(key)}: bucket {self.bucket!r} does not exist")
        detail = f"{code}: {message}" if message else code
        return StoreError(f"{self.url(key)}: {action} failed ({detail})")
