"""Read a table (CSV or Parquet) from a local path or ``s3://`` URI into a pandas DataFrame.

The file's bytes are read once, hashed (sha256 of the bytes as stored, recorded in the report
and the ONNX metadata) and parsed from memory, so the hash always describes what was parsed.

What is accepted, decided by content and never by the file name:

- Parquet (``PAR1`` magic at both ends).
- CSV with a header row and ``,`` as delimiter, in UTF-8 (a BOM is dropped) or UTF-16 with
  a BOM (Excel's "Unicode text"). Other encodings are refused, naming the first bad byte.
- Either of them compressed with gzip, bzip2 or xz: decompressed by magic bytes, up to
  ``MAX_TABLE_BYTES``. ZIP archives (including Excel .xlsx) and zstd are refused.
- Column names lose surrounding whitespace; duplicate column names are refused.

Everything else (empty, header only, binary, HTML or JSON, another delimiter, ragged rows,
fields over ``MAX_FIELD_CHARS``, corrupt Parquet) raises DataError with one line naming
the file. Timestamps and values are checked later, in onnxcast.pipeline.quality.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import gzip
import io
import lzma
import os
import re
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

from onnxcast.base.errors import DataError
from onnxcast.base.files import sha256_bytes
from onnxcast.base.s3 import S3Settings
from onnxcast.base.untrusted import UntrustedInputError, quote, read_regular_file

MAX_TABLE_BYTES = 2 * 1024**3  # after decompression; a bigger series belongs in Parquet on S3
# The largest data file read as stored (the whole file is held in memory, hashed and parsed:
# about 3x its size at the peak). ONNXCAST_MAX_DATA_BYTES raises or lowers it.
MAX_DATA_BYTES = 2 * 1024**3
MAX_DATA_BYTES_ENV = "ONNXCAST_MAX_DATA_BYTES"
MAX_DATASET_FILES = 10_000  # Parquet parts of one data set (a folder or an s3:// prefix)
MAX_FIELD_CHARS = 100_000  # no timestamp or number is this long: the file is not a table
OTHER_DELIMITERS = (";", "\t", "|")
MAX_NAME_CHARS = 60  # a longer header field is not a column name someone types
_COLUMN_NAME = re.compile(r"[^\W\d][\w .()\[\]/%#°+-]*")

_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
_REFUSED = {
    b"PK\x03\x04": "a ZIP archive or an Excel .xlsx workbook",
    b"(\xb5/\xfd": "zstd-compressed (gzip, bzip2 and xz are read)",
    b"\x89PNG": "a PNG image",
    b"%PDF": "a PDF document",
    b"\xd0\xcf\x11\xe0": "an old Excel/Office document",
    b"SQLite format 3": "an SQLite database",
}


@dataclass(frozen=True)
class RawTable:
    frame: object  # pandas.DataFrame; typed loosely to keep pandas out of import time
    source: str
    sha256: str
    n_bytes: int


def read_table(uri: str, *, s3_settings: S3Settings | None = None) -> RawTable:
    """Read CSV or Parquet bytes from ``uri`` and parse them; raise DataError naming the file.
    ``s3_settings``: for an ``s3://`` URI (None: boto3's chain, the ``AWS_*`` environment)."""
    data = read_bytes(uri, s3_settings=s3_settings)
    digest = sha256_bytes(data)
    frame = parse_table(data, uri)
    return RawTable(frame=frame, source=uri, sha256=digest, n_bytes=len(data))


def read_bytes(uri: str, *, s3_settings: S3Settings | None = None) -> bytes:
    if uri.startswith("s3://"):
        from onnxcast.base.s3 import get_object_bytes

        return get_object_bytes(uri, max_data_bytes(), s3_settings)
    path = Path(uri.removeprefix("file://"))
    limit = max_data_bytes()
    try:
        # /dev/zero made pandas read 21.7 GB before the kernel killed the run, and a FIFO
        # blocked forever: only a regular file of at most ``limit`` bytes is read (the type and
        # size are checked on the open descriptor, opened without blocking)
        return read_regular_file(path, what="data file", limit=limit)
    except UntrustedInputError as error:
        raise DataError(_refusal(uri, path, limit, str(error))) from None


def max_data_bytes() -> int:
    """The size limit of a data file: ``MAX_DATA_BYTES`` unless ONNXCAST_MAX_DATA_BYTES says otherwise."""
    value = os.environ.get(MAX_DATA_BYTES_ENV, "").strip()
    if not value:
        return MAX_DATA_BYTES
    try:
        limit = int(value)
    except ValueError:
        raise DataError(f"{MAX_DATA_BYTES_ENV} must be a number of bytes, got {quote(value)}") from None
    if limit < 1:
        raise DataError(f"{MAX_DATA_BYTES_ENV} must be a positive number of bytes, got {limit}")
    return limit


def _refusal(uri: str, path: Path, limit: int, reason: str) -> str:
    """Why ``path`` was not read (``reason``: the refusal's own words), naming ``uri``."""
    import stat

    try:
        info = path.stat()
    except FileNotFoundError:
        return f"{uri}: file not found"
    except OSError as exc:
        return f"{uri}: cannot read ({exc.strerror or exc})"
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        return f"{uri}: is a directory, expected a CSV or Parquet file"
    if stat.S_ISREG(mode) and "cannot be read: " in reason:  # permission denied, I/O error
        return f"{uri}: cannot read ({reason.rpartition('cannot be read: ')[2]})"
    if stat.S_ISREG(mode):
        return (f"{uri}: is {info.st_size:,} bytes, over the limit of {limit:,} bytes for a data file "
                f"(set {MAX_DATA_BYTES_ENV} to read larger files)")
    kind = next((name for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                                         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
                 if test(mode)), "not a regular file")
    return f"{uri}: is {kind}, not a regular file; expected a CSV or Parquet file"


def parse_table(data: bytes, source: str, *, dtype: dict | None = None):
    """Parse CSV or Parquet bytes (maybe compressed) into a DataFrame with string column names.
    ``dtype``: CSV column types (a fleet's series ids stay text: '007' is not 7)."""
    data = decompress(data, source)
    if not data.strip():
        raise DataError(f"{source}: file is empty")
    if data[:4] == b"PAR1" or data[-4:] == b"PAR1":
        frame = _parse_parquet(data, source)
    else:
        frame = _parse_csv(_decode(data, source), source, dtype=dtype)
    frame.columns = [str(c).strip() for c in frame.columns]
    if frame.empty:
        raise DataError(f"{source}: no data rows (columns: {describe_names(list(frame.columns))})")
    return frame


def decompress(data: bytes, source: str) -> bytes:
    """Undo gzip, bzip2 or xz compression found by magic bytes; refuse other non-table files."""
    for magic, what in _REFUSED.items():
        if data.startswith(magic):
            raise DataError(f"{source}: file is {what}; expected CSV or Parquet")
    kind = next((name for magic, name in _COMPRESSED.items() if data.startswith(magic)), None)
    if kind is None:
        return data
    opener = {"gzip": gzip.open, "bzip2": bz2.open, "xz": lzma.open}[kind]
    try:
        with opener(io.BytesIO(data)) as stream:
            out = stream.read(MAX_TABLE_BYTES + 1)
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
        raise DataError(f"{source}: corrupt {kind} data ({_first_line(exc)})") from None
    if len(out) > MAX_TABLE_BYTES:
        raise DataError(f"{source}: {kind} data expands to more than {MAX_TABLE_BYTES} bytes")
    return out


def _parse_parquet(data: bytes, source: str):
    import pandas as pd

    try:
        frame = pd.read_parquet(io.BytesIO(data))
    except Exception as exc:  # pyarrow raises many types; name the file and the cause
        raise DataError(f"{source}: unreadable Parquet file ({_first_line(exc)})") from None
    if not isinstance(frame.index, pd.RangeIndex):  # pandas wrote its index: those are columns too
        frame = frame.reset_index()
    return frame


def _decode(data: bytes, source: str) -> str:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise DataError(f"{source}: invalid UTF-16 at byte {exc.start}") from None
    head = data[:8192]
    if b"\x00" in head:
        raise DataError(f"{source}: binary content (NUL bytes), expected CSV or Parquet")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{source}: not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} (line {line}); "
            "save the file as UTF-8"
        ) from None
    start = text.lstrip()[:20].lower()
    if start.startswith(("<!doctype", "<html", "<?xml")):
        raise DataError(f"{source}: looks like HTML/XML, not CSV")
    if start.startswith(("{", "[")):
        raise DataError(f"{source}: looks like JSON, not CSV")
    return text


def _text_columns(header: list[str], dtype: dict) -> dict:
    """read_csv arguments that type the ``dtype`` columns as asked and read their fields as
    written: an id ``NA`` (North America, Namibia), ``None`` or ``null`` stays an id, not a
    missing value (an empty field is one), while the other columns keep pandas' missing-value
    words. Keyed by the
    header's own spelling (read_csv strips only leading spaces), so ``meter ,ds`` still types
    ``meter``: ids 007 and 7 are two series, never one number."""
    from pandas._libs.parsers import STR_NA_VALUES

    raw = [h.lstrip() for h in header]
    typed = {r: dtype[r.strip()] for r in raw if r.strip() in dtype}
    missing = {r: sorted(STR_NA_VALUES) for r in raw if r not in typed}
    return {"dtype": typed, "keep_default_na": False, "na_values": {**missing, **{r: [""] for r in typed}}}


def _parse_csv(text: str, source: str, *, dtype: dict | None = None):
    import pandas as pd

    try:
        header = next(csv.reader(io.StringIO(text)), [])
    except csv.Error as exc:
        raise DataError(f"{source}: cannot parse the CSV header ({_first_line(exc)})") from None
    names = [h.strip() for h in header]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise DataError(f"{source}: duplicate column name(s) {describe_names(duplicated, alone=True)} in the header")
    if len(names) == 1:
        # One field per line. A column name ('ds' alone) is a table of one column, which the
        # checks name as lacking columns; anything else (/etc/shadow's 'root:*:...', a
        # 'KEY=secret' line, a token) is not a table, refused without quoting a byte of it.
        guess = max(OTHER_DELIMITERS, key=header[0].count)
        if header[0].count(guess):
            parts = [p.strip() for p in header[0].split(guess)]
            found = f" {quote(header[0].strip())}" if all(map(plausible_column_name, parts)) else ""
            raise DataError(
                f"{source}: found one column{found}; the file seems to use {guess!r} as delimiter, expected ','")
        if not plausible_column_name(names[0]):
            raise DataError(f"{source}: not a table: the first line has no ',' between fields and is not a "
                            "column name (expected a header such as 'ds,y', then one row per timestamp)")
    try:
        with warnings.catch_warnings():  # rows longer than the header: refused just below
            warnings.simplefilter("ignore", pd.errors.ParserWarning)
            if dtype:
                frame = pd.read_csv(io.StringIO(text), skipinitialspace=True, index_col=False,
                                    **_text_columns(header, dtype))
            else:
                frame = pd.read_csv(io.StringIO(text), skipinitialspace=True, index_col=False)
    except pd.errors.EmptyDataError:
        raise DataError(f"{source}: file is empty") from None
    except (pd.errors.ParserError, ValueError) as exc:
        raise DataError(f"{source}: cannot parse as CSV ({_first_line(exc)})") from None
    for position, column in enumerate(frame.columns):
        values = frame[column]
        if values.dtype.kind in "OSUT":
            lengths = values.astype("string").str.len().fillna(0).to_numpy()
            if len(lengths) and lengths.max() > MAX_FIELD_CHARS:
                row = int(lengths.argmax())
                raise DataError(
                    f"{source}: field of {int(lengths[row])} characters in column {_column_label(str(column), position, len(frame.columns))} "
                    f"at row {row + 1} (limit {MAX_FIELD_CHARS})"
                )
    _check_field_counts(text, len(header), source)
    return frame


def _check_field_counts(text: str, expected: int, source: str) -> None:
    """Every data row has as many fields as the header, or one DataError names the first that has not.

    pandas copes with ragged rows in ways that hide them: rows with more fields than the header
    turn the first columns into a (Multi)Index, rows with fewer are padded with NaN, and only
    a later longer row is an error. One pass of the csv module sees every shape alike.
    """
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    next(reader, None)  # the header
    first, bad = None, 0
    try:
        for row in reader:
            if len(row) == expected or not row or (len(row) == 1 and not row[0].strip()):
                continue  # a blank line: pandas skips it too
            bad += 1
            if first is None:
                first = (reader.line_num, len(row))
    except csv.Error as exc:
        raise DataError(f"{source}: cannot parse as CSV at line {reader.line_num} ({_first_line(exc)})") from None
    if first is not None:
        line, fields = first
        more = f"; {bad} rows in all" if bad > 1 else ""
        raise DataError(f"{source}: line {line} has {fields} field(s), the header has {expected}{more} "
                        "(ragged rows: a missing or extra delimiter)")


# --- long tables (fleet mode) ---------------------------------------------------------------

def read_long_table(uri: str, *, columns: list[str], series_column: str,
                    s3_settings: S3Settings | None = None) -> RawTable:
    """A long table of many series: a CSV or Parquet file as :func:`read_table` reads it, or a
    folder / ``s3://`` prefix (ending in ``/``) of Parquet parts (:func:`read_parquet_dataset`).

    The series ids are read as text and kept as a pandas ``category``: codes instead of one
    Python string per row (a 10 M-row table holds 40 MB of int32 codes, not 600 MB of str).
    Only ``columns`` are kept when the source has them all; otherwise every column is kept
    so that the checks can name what is missing and what was found."""
    if _is_dataset(uri):
        raw = read_parquet_dataset(uri, columns=columns, s3_settings=s3_settings)
    else:
        data = read_bytes(uri, s3_settings=s3_settings)
        raw = RawTable(frame=parse_table(data, uri, dtype={series_column: "string"}), source=uri,
                       sha256=sha256_bytes(data), n_bytes=len(data))
        del data
    frame = raw.frame
    if all(c in frame.columns for c in columns):
        frame = frame[list(columns)]
    if series_column in frame.columns:
        frame = frame.copy(deep=False)
        ids = frame[series_column]
        if ids.dtype.name != "category":
            ids = ids.astype("string")
        frame[series_column] = ids.astype("category")
    return RawTable(frame=frame, source=raw.source, sha256=raw.sha256, n_bytes=raw.n_bytes)


def _is_dataset(uri: str) -> bool:
    """A folder, or an ``s3://`` prefix written with a trailing ``/``."""
    if uri.startswith("s3://"):
        return uri.endswith("/")
    return Path(uri.removeprefix("file://")).is_dir()


def list_parquet_parts(uri: str, s3_settings: S3Settings | None = None) -> list[tuple[str, int]]:
    """Sorted ``(relative name, size)`` of the ``*.parquet`` files under a folder or ``s3://``
    prefix, recursively; hidden and ``_``-prefixed names (``_SUCCESS``, ``_common_metadata``)
    are skipped. DataError when there is none, more than MAX_DATASET_FILES, or their sizes sum
    past the data-size limit (:func:`max_data_bytes`, the same limit as one file)."""
    parts = _list_s3_parts(uri, s3_settings) if uri.startswith("s3://") else _list_local_parts(uri)
    if not parts:
        raise DataError(f"{uri}: no *.parquet files in this folder")
    if len(parts) > MAX_DATASET_FILES:
        raise DataError(f"{uri}: {len(parts):,} Parquet files, more than the limit of {MAX_DATASET_FILES:,}")
    total, limit = sum(size for _, size in parts), max_data_bytes()
    if total > limit:
        raise DataError(f"{uri}: {len(parts)} Parquet files of {total:,} bytes in all, over the limit of "
                        f"{limit:,} bytes for a data set (set {MAX_DATA_BYTES_ENV} to read larger ones)")
    return sorted(parts)


def read_parquet_dataset(uri: str, *, columns: list[str], s3_settings: S3Settings | None = None) -> RawTable:
    """Every Parquet part under ``uri`` as one table; ``sha256`` is the dataset digest: sha256
    of the JSON list ``[[relative name, sha256 of its bytes], ...]`` in name order, so a
    renamed, added, removed or changed part changes it (docs/data-quality.md)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = list_parquet_parts(uri, s3_settings)
    tables, digests, schema, first = [], [], None, None
    budget = max_data_bytes()
    for name, _ in parts:
        location = uri.rstrip("/") + "/" + name
        if uri.startswith("s3://"):
            from onnxcast.base.s3 import get_object_bytes

            data = get_object_bytes(location, budget, s3_settings)
        else:
            data = read_bytes(location)
        budget -= len(data)  # the sum is bounded by what arrives, not only by what was listed
        if budget < 0:
            raise DataError(f"{uri}: the Parquet files are over the limit of {max_data_bytes():,} bytes in all")
        digests.append([name, sha256_bytes(data)])
        try:
            parquet = pq.ParquetFile(io.BytesIO(data))
            present = [c for c in columns if c in parquet.schema_arrow.names]
            table = parquet.read(columns=present if len(present) == len(columns) else None)
        except Exception as exc:  # pyarrow raises many types; name the part and the cause
            raise DataError(f"{location}: unreadable Parquet file ({_first_line(exc)})") from None
        if schema is None:
            schema, first = table.schema, name
        elif not table.schema.equals(schema):
            raise DataError(f"{location}: columns {_schema_words(table.schema)} differ from those of the first "
                            f"part {first} ({_schema_words(schema)})")
        tables.append(table)
        del data
    frame = pa.concat_tables(tables, promote_options="default").to_pandas()
    frame.columns = [str(c).strip() for c in frame.columns]
    if frame.empty:
        raise DataError(f"{uri}: no data rows (columns: {describe_names(list(frame.columns))})")
    digest = sha256_bytes(json.dumps(digests).encode())
    return RawTable(frame=frame, source=uri, sha256=digest, n_bytes=sum(size for _, size in parts))


def _list_local_parts(uri: str) -> list[tuple[str, int]]:
    root = Path(uri.removeprefix("file://"))
    found = []
    for path in root.rglob("*.parquet"):
        relative = path.relative_to(root)
        if any(p.startswith((".", "_")) for p in relative.parts) or not path.is_file() or path.is_symlink():
            continue
        found.append((relative.as_posix(), path.stat().st_size))
    return found


def _list_s3_parts(uri: str, s3_settings: S3Settings | None) -> list[tuple[str, int]]:
    from botocore.exceptions import BotoCoreError, ClientError

    from onnxcast.base.s3 import make_client, s3_error_code, split_s3_uri

    bucket, prefix = split_s3_uri(uri)
    found = []
    try:
        for page in make_client(s3_settings).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                relative = item["Key"][len(prefix):]
                if not relative.endswith(".parquet") or any(p.startswith((".", "_")) for p in relative.split("/")):
                    continue
                found.append((relative, int(item["Size"])))
                if len(found) > MAX_DATASET_FILES:
                    return found
    except ClientError as exc:
        raise DataError(f"{uri}: cannot list from S3 ({s3_error_code(exc) or 'error'})") from None
    except BotoCoreError as exc:
        raise DataError(f"{uri}: cannot reach S3 ({_first_line(exc)})") from None
    return found


def _schema_words(schema) -> str:
    return "[" + ", ".join(f"{name}: {kind}" for name, kind in zip(schema.names, schema.types, strict=True)) + "]"


def plausible_column_name(name: str) -> bool:
    """Whether a header field reads as a column name, which an error or a report may quote.

    Short, starting with a letter or '_', made of letters, digits, spaces and ``_ - . ( ) [ ]
    / % # ° +``: not a number or a timestamp (a first line of data), nor a ``KEY=value`` or
    ``root:*:...`` line of a secret file that was passed by mistake."""
    return 0 < len(name) <= MAX_NAME_CHARS and _COLUMN_NAME.fullmatch(name) is not None


def describe_names(names: list[str], limit: int = 12, *, alone: bool = False) -> str:
    """``['ds', 'y']`` (each capped, at most ``limit``) when every name is plausible, else how
    many there are and how many look like data; never a quoted field that looks like data.

    A header of one field is not shown unless ``alone`` (a name picked out of a longer
    header): a lone plausible word may as well be a token file passed by mistake."""
    names = [str(n) for n in names]
    if len(names) == 1 and not alone:
        return "1 field, not shown (one field per line: not a delimited table)"
    if names and all(map(plausible_column_name, names)):
        shown = ", ".join(quote(n) for n in names[:limit])
        more = f", ... {len(names) - limit} more" if len(names) > limit else ""
        return f"[{shown}{more}]"
    odd = sum(not plausible_column_name(n) for n in names)
    return f"{len(names)} field(s), {odd} of them not column names (data or other text: not shown)"


def _column_label(name: str, position: int, count: int) -> str:
    """A column named for an error: its quoted name if it may be shown, else its number."""
    return quote(name) if count > 1 and plausible_column_name(name) else f"number {position + 1}"


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return _clip(text[0], 200) if text else type(exc).__name__
