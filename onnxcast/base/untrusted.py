"""Reading input nobody vouches for: only regular files, never more than a limit, JSON of a
bounded depth.

Everything a user, a store writer or a device folder hands onnxcast goes through here before
it is parsed: a path may name ``/dev/zero`` (pandas read 21.7 GB of it before the kernel killed
the run), a FIFO (a read blocks forever), or a symlink planted in a folder onnxcast owns; a
JSON document may be 100,000 nested ``[`` (``json.loads`` raises RecursionError). Stdlib only:
the device distribution ships this module.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

# Deeper than any manifest, pointer, report or request onnxcast writes or accepts (they nest
# 6 levels at most); orjson stops at 1,024 and json.loads recurses past Python's limit.
MAX_JSON_DEPTH = 64
# Metadata (pointers, manifests, trust roots, model.json) is a few KB; 8 MiB is generous.
MAX_METADATA_BYTES = 8 * 1024 * 1024
# A pipeline's report.json (a fleet's holds aggregates, its per-series tables are Parquet files).
MAX_REPORT_BYTES = 64 * 1024**2
# Longest name quoted in an error message (column names, series ids, values).
MAX_QUOTED = 60
# A series id (a fleet's series column) is written back in outputs (report.json, shards.json,
# the fleet file, the device's forecast CSV) and quoted in error lines: at most this long.
MAX_SERIES_ID = 100


class UntrustedInputError(ValueError):
    """Input refused before parsing: not a regular file, too large, or nested too deep.

    Callers re-raise it as their own typed error (DataError, FetchError, RefusedError ...)."""


def regular_file_size(path: str | Path, *, what: str, limit: int, follow_symlinks: bool = True) -> int:
    """The size of ``path`` if it is a regular file of at most ``limit`` bytes, else refuse.

    For files parsed by a library that opens them itself (pandas, onnx): checked first, so
    a device, a FIFO or a socket is never opened for reading."""
    try:
        info = os.stat(path, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        raise UntrustedInputError(f"{what} {str(path)!r} does not exist") from None
    except OSError as error:
        raise UntrustedInputError(f"{what} {str(path)!r} cannot be read: {error.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise UntrustedInputError(f"{what} {str(path)!r} is a symbolic link: refused")
    if not stat.S_ISREG(info.st_mode):
        raise UntrustedInputError(f"{what} {str(path)!r} is not a regular file ({file_kind(info.st_mode)})")
    if info.st_size > limit:
        raise UntrustedInputError(
            f"{what} {str(path)!r} is {info.st_size:,} bytes, over the limit of {limit:,}")
    return info.st_size


def read_regular_file(path: str | Path, *, what: str, limit: int = MAX_METADATA_BYTES,
                      follow_symlinks: bool = True, dir_fd: int | None = None) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    Opened with ``O_NONBLOCK`` (a FIFO cannot block the open) and, unless
    ``follow_symlinks``, ``O_NOFOLLOW``; the type and size are checked on the open
    descriptor, and at most ``limit + 1`` bytes are read, so a file that grows is refused too."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise UntrustedInputError(f"{what} {str(path)!r} does not exist") from None
    except OSError as error:
        if not follow_symlinks and error.errno in (40, 20):  # ELOOP, ENOTDIR: a symlink
            raise UntrustedInputError(f"{what} {str(path)!r} is a symbolic link: refused") from None
        raise UntrustedInputError(f"{what} {str(path)!r} cannot be read: {error.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedInputError(f"{what} {str(path)!r} is not a regular file ({file_kind(info.st_mode)})")
        if info.st_size > limit:
            raise UntrustedInputError(
                f"{what} {str(path)!r} is {info.st_size:,} bytes, over the limit of {limit:,}")
        chunks, total = [], 0
        while total <= limit:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            except OSError as error:  # /proc/self/mem and other "regular" files that refuse reads
                raise UntrustedInputError(f"{what} {str(path)!r} cannot be read: {error.strerror}") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise UntrustedInputError(f"{what} {str(path)!r} is over the limit of {limit:,} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def loads_json(data: bytes | str, *, what: str, limit: int = MAX_METADATA_BYTES,
               max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON of at most ``limit`` bytes nested at most ``max_depth`` levels.

    The depth is measured by one linear scan before parsing, so no input can make the parser
    recurse; any fault is one UntrustedInputError line that never quotes the input."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) > limit:
        raise UntrustedInputError(f"{what} is {len(data):,} bytes, over the limit of {limit:,}")
    # Fast path: fewer brackets than the limit cannot nest deeper than it.
    if data.count(b"[") + data.count(b"{") > max_depth and json_depth(data) > max_depth:
        raise UntrustedInputError(f"{what} is nested deeper than {max_depth} levels")
    try:
        value = json.loads(data, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant,
                           parse_int=_bounded_int, parse_float=_finite_float)
    except json.JSONDecodeError as error:
        raise UntrustedInputError(f"{what} is not valid JSON at byte {error.pos}") from None
    except UntrustedInputError as error:
        raise UntrustedInputError(f"{what} {error}") from None
    except (UnicodeDecodeError, ValueError):
        raise UntrustedInputError(f"{what} is not valid JSON (not UTF-8, or a value out of range)") from None
    if _has_lone_surrogate(value):
        # "\ud800" parses, then fails wherever the text is encoded again (canonical signing bytes)
        raise UntrustedInputError(f"{what} holds an escaped lone surrogate, which is not text")
    return value


def read_json_file(path: str | Path, *, what: str, limit: int = MAX_METADATA_BYTES,
                   follow_symlinks: bool = True, dir_fd: int | None = None) -> Any:
    """``loads_json`` of ``read_regular_file``: a metadata file from a folder or a store."""
    data = read_regular_file(path, what=what, limit=limit, follow_symlinks=follow_symlinks, dir_fd=dir_fd)
    return loads_json(data, what=f"{what} {str(path)!r}", limit=limit)


# Counters, sizes and versions fit in 20 digits; Python refuses past 4,300 with a bare ValueError.
MAX_INT_DIGITS = 40


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise UntrustedInputError(f"has the key {quote(duplicate)} twice")
    return value


def _no_constant(name: str) -> Any:
    raise UntrustedInputError(f"holds {name}, which JSON does not allow")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise UntrustedInputError(f"holds an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise UntrustedInputError(f"holds a number out of range ({quote(text, 24)})")
    return value


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def json_depth(data: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in ``data``, brackets inside strings not counted."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def quote(value: object, limit: int = MAX_QUOTED) -> str:
    """``repr(value)`` capped at ``limit`` characters, for naming a value in an error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def series_id_problem(value: str) -> str | None:
    """Why ``value`` is not a series id, in words for an error line, or None when it is one.

    ONE rule for the pipeline's data gate (onnxcast.pipeline.reading) and the device's fleet
    input (onnxcast.rollout.edge): a non-empty printable name of at most MAX_SERIES_ID
    characters without leading or trailing spaces. ``str.isprintable`` refuses line breaks,
    control characters and the format characters (bidi overrides such as U+202E, zero-width
    spaces) that make an id read differently from what it is."""
    if not value:
        return "empty"
    if len(value) > MAX_SERIES_ID:
        return f"{len(value):,} characters long, more than {MAX_SERIES_ID}"
    if not value.isprintable():
        return "not printable (a line break, control, format or bidi character)"
    if value != value.strip():
        return "not a name without leading or trailing spaces"
    return None


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words, for an error line."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a file"
