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
import logging
import lzma
import os
import re
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

from onnxcast.base import environment
from onnxcast.base.errors import DataError
from onnxcast.base.files import sha256_bytes
from onnxcast.base.s3 import S3Settings, get_object_bytes, make_client, s3_error_code, split_s3_uri
from onnxcast.base.untrusted import (
    UntrustedInputError,
    file_kind,
    quote,
    read_regular_file,
    series_id_problem,
)

log = logging.getLogger(__name__)

MAX_TABLE_BYTES = 2 * 1024**3  # after decompression; a bigger series belongs in Parquet on S3


@dataclass(frozen=True)
class DataLimit:
    """A limit on what the data of one run may hold, and the environment variable that moves it."""

    env: str
    default: int
    unit: str  # as the error line counts: "bytes", "rows", "cells"

    def value(self) -> int:
        """The limit in force: the environment variable's, else the default (onnxcast.base.environment)."""
        return environment.value(self.env)


# The limits of a data file or data set, declared once (docs/data-quality.md, stage 1).
# Bytes as stored: the whole file is held in memory, hashed and parsed (about 3x its size at the
# peak). Rows and cells as decoded, checked BEFORE decoding (Parquet metadata, CSV line count):
# 1.2 MB of zstd Parquet holding 100 M repeated rows took 12.9 GB before its error. A
# 100,000-series monthly fleet is 11.7 M rows, 35 M cells (bench/fleet.py scale).
DATA_BYTES = DataLimit("ONNXCAST_MAX_DATA_BYTES", environment.default("ONNXCAST_MAX_DATA_BYTES"), "bytes")
DATA_ROWS = DataLimit("ONNXCAST_MAX_DATA_ROWS", environment.default("ONNXCAST_MAX_DATA_ROWS"), "rows")
DATA_CELLS = DataLimit("ONNXCAST_MAX_DATA_CELLS", environment.default("ONNXCAST_MAX_DATA_CELLS"), "cells")
DATA_LIMITS = (DATA_BYTES, DATA_ROWS, DATA_CELLS)
MAX_DATA_BYTES, MAX_DATA_BYTES_ENV = DATA_BYTES.default, DATA_BYTES.env
MAX_DATASET_FILES = 10_000  # Parquet parts of one data set (a folder or an s3:// prefix)
MAX_DATASET_ENTRIES = 10 * MAX_DATASET_FILES  # entries of a folder looked at, parts or not
MAX_SKIPPED_LOGGED = 20  # entries of a folder skipped, one warning line each; the rest counted
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
    skipped: tuple[tuple[str, str], ...] = ()  # entries of a folder not read: (name clipped, why)


def read_table(uri: str, *, s3_settings: S3Settings | None = None) -> RawTable:
    """Read CSV or Parquet bytes from ``uri`` and parse them; raise DataError naming the file.
    ``s3_settings``: for an ``s3://`` URI (None: boto3's chain, the ``AWS_*`` environment)."""
    data = read_bytes(uri, s3_settings=s3_settings)
    digest = sha256_bytes(data)
    frame = parse_table(data, uri)
    return RawTable(frame=frame, source=uri, sha256=digest, n_bytes=len(data))


def read_bytes(uri: str, *, s3_settings: S3Settings | None = None) -> bytes:
    if uri.startswith("s3://"):

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
    return DATA_BYTES.value()


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


def parse_table(data: bytes, source: str, *, dtype: dict | None = None, series_column: str | None = None):
    """Parse CSV or Parquet bytes (maybe compressed) into a DataFrame with string column names.
    ``dtype``: CSV column types (a fleet's series ids stay text: '007' is not 7);
    ``series_column``: a Parquet column of series ids, read as a categorical of text."""
    data = decompress(data, source)
    if not data.strip():
        raise DataError(f"{source}: file is empty")
    if data[:4] == b"PAR1" or data[-4:] == b"PAR1":
        frame = _parse_parquet(data, source, series_column=series_column)
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


def _parse_parquet(data: bytes, source: str, *, series_column: str | None = None):
    import pandas as pd

    parquet = open_parquet(data, source)
    selected = parquet.schema_arrow.names
    check_parquet_size(parquet, selected, source, DecodeBudget.from_limits())
    frame = read_parquet(data, parquet, selected, source, series_column=series_column).to_pandas()
    if not isinstance(frame.index, pd.RangeIndex):  # pandas wrote its index: those are columns too
        frame = frame.reset_index()
    return frame


# --- Parquet, bounded: counted from its metadata before a value is decoded -----------------

@dataclass
class DecodeBudget:
    """What the data of one read may still decode to: rows and cells (DATA_ROWS, DATA_CELLS), and
    bytes after decompression (MAX_TABLE_BYTES). The parts of a data set share one."""

    rows: int
    cells: int
    raw_bytes: int

    @classmethod
    def from_limits(cls) -> DecodeBudget:
        return cls(rows=DATA_ROWS.value(), cells=DATA_CELLS.value(), raw_bytes=MAX_TABLE_BYTES)


def open_parquet(data: bytes, source: str):
    """The ``pyarrow.parquet.ParquetFile`` of ``data``: its footer only, nothing decoded yet."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(io.BytesIO(data))
        parquet.schema_arrow  # noqa: B018 - a footer whose schema pyarrow cannot map is unreadable
    except Exception as exc:  # pyarrow raises many types; name the file and the cause
        raise DataError(f"{source}: unreadable Parquet file ({_first_line(exc)})") from None
    return parquet


def parquet_counts(parquet, selected: list[str]) -> tuple[int, int, int, int]:
    """(rows, cells, bytes after decompression, row groups) of the columns ``selected``, from the
    footer: rows of every row group, values of every column chunk (a list column's elements
    count one by one), the chunks' uncompressed sizes."""
    meta = parquet.metadata
    leaves = _leaf_columns(parquet.schema_arrow, set(selected), meta.num_columns)
    rows = cells = raw = 0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        rows += group.num_rows
        for j in leaves:
            chunk = group.column(j)
            cells += max(chunk.num_values, group.num_rows)
            raw += chunk.total_uncompressed_size
    return max(rows, meta.num_rows), cells, raw, meta.num_row_groups


def _leaf_columns(schema, selected: set[str], n_leaves: int) -> list[int]:
    """Positions of the Parquet leaf columns under the top-level fields ``selected`` (a struct
    or list field has several or nested leaves, in the schema's depth-first order)."""
    import pyarrow as pa

    def count(kind) -> int:
        if pa.types.is_struct(kind):
            return sum(count(kind.field(i).type) for i in range(kind.num_fields))
        if pa.types.is_map(kind):
            return count(kind.key_type) + count(kind.item_type)
        if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            return count(kind.value_type)
        return 1

    spans, at = [], 0
    for field in schema:
        width = count(field.type)
        spans.append((field.name, range(at, at + width)))
        at += width
    if at != n_leaves:  # a layout this count does not know: count every column
        return list(range(n_leaves))
    return [j for name, span in spans if name in selected for j in span]


def check_parquet_size(parquet, selected: list[str], source: str, budget: DecodeBudget, *,
                       data_set: str | None = None) -> None:
    """Refuse, before decoding, a Parquet file whose footer says it holds more rows, cells or
    decompressed bytes than ``budget`` has left, and take them from it. ``data_set``: the folder
    or prefix whose part ``source`` is (its parts share one budget)."""
    rows, cells, raw, groups = parquet_counts(parquet, selected)
    raw_limit = DataLimit("", MAX_TABLE_BYTES, "bytes once decompressed")
    for count, left, limit in ((rows, budget.rows, DATA_ROWS), (cells, budget.cells, DATA_CELLS),
                               (raw, budget.raw_bytes, raw_limit)):
        if count <= left:
            continue
        value = limit.value() if limit.env else limit.default
        remedy = f" (set {limit.env} to read more)" if limit.env else ""
        if data_set:
            raise DataError(f"{data_set}: the Parquet files hold more than the limit of {value:,} {limit.unit} in all "
                            f"(by their metadata, reached at part {quote(source)}){remedy}")
        raise DataError(f"{source}: Parquet file of {count:,} {limit.unit} (by its metadata, {groups:,} row "
                        f"group(s)), over the limit of {value:,} {limit.unit}{remedy}")
    budget.rows, budget.cells, budget.raw_bytes = budget.rows - rows, budget.cells - cells, budget.raw_bytes - raw


def read_parquet(data: bytes, parquet, selected: list[str], source: str, *, series_column: str | None = None):
    """The columns ``selected`` of a Parquet file whose size ``check_parquet_size`` accepted, as a
    pyarrow Table. Text columns are read dictionary-encoded, so that a long value repeated on
    every row is held once while its decoded size is counted (MAX_TABLE_BYTES); then decoded,
    except ``series_column``, which stays a dictionary of text (ids_as_text)."""
    import pyarrow.parquet as pq

    schema = parquet.schema_arrow
    text = [name for name in selected if _is_text(schema.field(name).type)]
    everything = list(selected) == list(schema.names)
    try:
        table = pq.ParquetFile(io.BytesIO(data), read_dictionary=text).read(columns=None if everything else selected)
    except Exception as exc:  # pyarrow raises many types; name the file and the cause
        raise DataError(f"{source}: unreadable Parquet file ({_first_line(exc)})") from None
    decoded = 0
    for name in text:
        decoded += _decoded_text_bytes(table.column(name))
        if decoded > MAX_TABLE_BYTES:
            raise DataError(f"{source}: its text columns decode to more than {MAX_TABLE_BYTES:,} bytes (column "
                            f"{quote(name)}: the same long values repeated); expected a table of series")
    for name in text:
        if name != series_column:
            at = table.schema.get_field_index(name)
            column = table.column(at)
            table = table.set_column(at, table.field(at).with_type(column.type.value_type),
                                     column.cast(column.type.value_type))
    if series_column is not None and series_column in table.column_names:
        table = ids_as_text(table, series_column, source)
    return table


def _is_text(kind) -> bool:
    import pyarrow as pa

    return any(test(kind) for test in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                        pa.types.is_large_binary))


def _decoded_text_bytes(column) -> int:
    """Bytes of text a dictionary-encoded column holds once every row has its own value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total = 0
    for chunk in column.chunks:
        if not pa.types.is_dictionary(chunk.type):
            total += pc.sum(pc.binary_length(chunk)).as_py() or 0
            continue
        lengths = pc.binary_length(chunk.dictionary).cast(pa.int64())
        total += pc.sum(lengths.take(chunk.indices)).as_py() or 0
    return total


def ids_as_text(table, column: str, source: str):
    """``table`` with its series-id ``column`` as a dictionary of text: text as it is, binary when
    it is UTF-8, whole numbers written out ("7"); anything else (binary that is not UTF-8,
    floats, structs, lists ...) refused in one line naming the file and the column."""
    import pyarrow as pa

    at = table.schema.get_field_index(column)
    ids = table.column(at)
    kind = ids.type.value_type if pa.types.is_dictionary(ids.type) else ids.type
    text = pa.dictionary(pa.int32(), pa.string())
    if pa.types.is_integer(kind):
        ids = ids.cast(kind).cast(pa.string())
    elif not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
              or pa.types.is_large_binary(kind)):
        raise DataError(f"{source}: column {quote(column)} holds {quote(str(kind), 60)[1:-1]} values; series ids "
                        "must be text or whole numbers")
    try:
        ids = ids.cast(text) if pa.types.is_dictionary(ids.type) else ids.cast(pa.string()).dictionary_encode()
    except pa.ArrowInvalid:  # binary that is not UTF-8
        raise DataError(f"{source}: column {quote(column)} holds bytes that are not UTF-8 text (first at row "
                        f"{_first_not_utf8(ids) + 1:,}); series ids must be text") from None
    if ids.type != text:
        ids = ids.cast(text)
    return table.set_column(at, pa.field(column, text), ids)


def _first_not_utf8(column) -> int:
    """The row of the first value of a binary ``column`` that is not UTF-8."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offset = 0
    for chunk in column.chunks:
        values = chunk.dictionary if pa.types.is_dictionary(chunk.type) else chunk
        for k, value in enumerate(values.to_pylist()):
            try:
                (value or b"").decode("utf-8")
            except UnicodeDecodeError:
                at = pc.index(chunk.indices, k).as_py() if pa.types.is_dictionary(chunk.type) else k
                if at >= 0:
                    return offset + at
        offset += len(chunk)
    return 0


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
    _check_csv_size(text, len(header), source)
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


def _check_csv_size(text: str, fields: int, source: str) -> None:
    """Refuse, before parsing, a CSV text of more lines (rows at most) or lines x header fields
    (cells at most) than DATA_ROWS and DATA_CELLS allow."""
    lines = text.count("\n") + (not text.endswith("\n")) - 1  # the header is not a row
    for count, limit in ((lines, DATA_ROWS), (lines * max(fields, 1), DATA_CELLS)):
        if count > limit.value():
            unit = "lines" if limit is DATA_ROWS else "cells (lines x header fields)"
            raise DataError(f"{source}: {count:,} {unit}, over the limit of {limit.value():,} {limit.unit} for a "
                            f"data set (set {limit.env} to read more)")


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
    Every distinct id is checked by the one series-id rule (:func:`check_series_ids`).
    Only ``columns`` are kept when the source has them all; otherwise every column is kept
    so that the checks can name what is missing and what was found."""
    if _is_dataset(uri):
        raw = read_parquet_dataset(uri, columns=columns, s3_settings=s3_settings, series_column=series_column)
    else:
        data = read_bytes(uri, s3_settings=s3_settings)
        raw = RawTable(frame=parse_table(data, uri, dtype={series_column: "string"}, series_column=series_column),
                       source=uri, sha256=sha256_bytes(data), n_bytes=len(data))
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
        check_series_ids(frame[series_column], series_column, raw.source)
    return RawTable(frame=frame, source=raw.source, sha256=raw.sha256, n_bytes=raw.n_bytes, skipped=raw.skipped)


def check_series_ids(ids, series_column: str, source: str) -> None:
    """Every distinct series id (a pandas categorical) by the one rule of the pipeline and the
    device (onnxcast.base.untrusted.series_id_problem), else one DataError naming the first bad
    id (clipped), its row and how many there are: an id is copied into report.json, shards.json,
    the fleet file and the quality pages, and quoted in error lines."""
    import numpy as np

    categories = ids.cat.categories
    bad = [(k, why) for k, value in enumerate(categories) if (why := series_id_problem(str(value)))]
    if not bad:
        return
    k, why = bad[0]
    row = int(np.argmax(ids.cat.codes.to_numpy() == k))
    more = f" ({len(bad):,} such ids)" if len(bad) > 1 else ""
    raise DataError(f"{source}: {series_column} value {quote(str(categories[k]))} at row {row + 1:,} is {why}; "
                    f"expected a series id{more}")


def _is_dataset(uri: str) -> bool:
    """A folder, or an ``s3://`` prefix written with a trailing ``/``."""
    if uri.startswith("s3://"):
        return uri.endswith("/")
    return Path(uri.removeprefix("file://")).is_dir()


@dataclass(frozen=True)
class PartListing:
    """The Parquet parts of a data set, ``(relative name, size)`` sorted, and the entries of the
    folder that were skipped, ``(relative name clipped, why)``."""

    parts: list[tuple[str, int]]
    skipped: list[tuple[str, str]]


def list_parquet_parts(uri: str, s3_settings: S3Settings | None = None) -> list[tuple[str, int]]:
    """Sorted ``(relative name, size)`` of the ``*.parquet`` files under a folder or ``s3://``
    prefix, recursively (:func:`scan_parquet_parts`)."""
    return scan_parquet_parts(uri, s3_settings).parts


def scan_parquet_parts(uri: str, s3_settings: S3Settings | None = None) -> PartListing:
    """The ``*.parquet`` regular files under a folder or ``s3://`` prefix, recursively; hidden and
    ``_``-prefixed names (``_SUCCESS``, ``_common_metadata``) are skipped as Spark and Hive write
    them. In a folder, every other entry that is not read (a symbolic link, to a file or a
    folder, a FIFO, a device, a socket, a file not named ``*.parquet``) is skipped with a
    warning line naming it and why, and listed in the quality report. DataError when there is
    no part, more than MAX_DATASET_FILES, or their sizes sum past the data-size limit
    (:func:`max_data_bytes`, the same limit as one file)."""
    if uri.startswith("s3://"):
        listing = PartListing(_list_s3_parts(uri, s3_settings), [])
    else:
        listing = _list_local_parts(uri)
    listing = PartListing(sorted(listing.parts), sorted(listing.skipped))
    for name, why in listing.skipped[:MAX_SKIPPED_LOGGED]:
        log.warning("%s: skipped %s: %s", uri, name, why)
    if len(listing.skipped) > MAX_SKIPPED_LOGGED:
        log.warning("%s: skipped %d more entries that are not Parquet files (%d in all; the quality report lists "
                    "them)", uri, len(listing.skipped) - MAX_SKIPPED_LOGGED, len(listing.skipped))
    parts = listing.parts
    if not parts:
        skipped = f" ({len(listing.skipped):,} other entries skipped)" if listing.skipped else ""
        raise DataError(f"{uri}: no *.parquet files in this folder{skipped}")
    if len(parts) > MAX_DATASET_FILES:
        raise DataError(f"{uri}: {len(parts):,} Parquet files, more than the limit of {MAX_DATASET_FILES:,}")
    total, limit = sum(size for _, size in parts), max_data_bytes()
    if total > limit:
        raise DataError(f"{uri}: {len(parts)} Parquet files of {total:,} bytes in all, over the limit of "
                        f"{limit:,} bytes for a data set (set {MAX_DATA_BYTES_ENV} to read larger ones)")
    return listing


def read_parquet_dataset(uri: str, *, columns: list[str], s3_settings: S3Settings | None = None,
                         series_column: str | None = None) -> RawTable:
    """Every Parquet part under ``uri`` as one table; ``sha256`` is the dataset digest: sha256
    of the JSON list ``[[relative name, sha256 of its bytes], ...]`` in name order, so a
    renamed, added, removed or changed part changes it (docs/data-quality.md). The parts share
    one decode budget (rows, cells: :class:`DecodeBudget`), checked on each part's footer
    before it is decoded."""
    import json

    import pyarrow as pa

    listing = scan_parquet_parts(uri, s3_settings)
    tables, digests, schema, first = [], [], None, None
    budget, decode = max_data_bytes(), DecodeBudget.from_limits()
    for name, _ in listing.parts:
        location = uri.rstrip("/") + "/" + name
        if uri.startswith("s3://"):

            data = get_object_bytes(location, budget, s3_settings)
        else:
            data = read_bytes(location)
        budget -= len(data)  # the sum is bounded by what arrives, not only by what was listed
        if budget < 0:
            raise DataError(f"{uri}: the Parquet files are over the limit of {max_data_bytes():,} bytes in all")
        digests.append([name, sha256_bytes(data)])
        parquet = open_parquet(data, location)
        names = parquet.schema_arrow.names
        selected = list(columns) if all(c in names for c in columns) else names
        part_schema = pa.schema([parquet.schema_arrow.field(c) for c in selected])
        if schema is None:
            schema, first = part_schema, name
        elif not part_schema.equals(schema):
            raise DataError(f"{location}: columns {_schema_words(part_schema)} differ from those of the first "
                            f"part {first} ({_schema_words(schema)})")
        check_parquet_size(parquet, selected, location, decode, data_set=uri)
        tables.append(read_parquet(data, parquet, selected, location, series_column=series_column))
        del data, parquet
    frame = pa.concat_tables(tables, promote_options="default").to_pandas()
    frame.columns = [str(c).strip() for c in frame.columns]
    if frame.empty:
        raise DataError(f"{uri}: no data rows (columns: {describe_names(list(frame.columns))})")
    digest = sha256_bytes(json.dumps(digests).encode())
    return RawTable(frame=frame, source=uri, sha256=digest, n_bytes=sum(size for _, size in listing.parts),
                    skipped=tuple(listing.skipped))


def _list_local_parts(uri: str) -> PartListing:
    """Walk the folder without following a symbolic link (a linked folder could be anywhere, and
    a link to /dev/zero is no part): regular ``*.parquet`` files are parts; every other entry
    whose name is not hidden is skipped, with why."""
    import stat

    root = Path(uri.removeprefix("file://"))
    found: list[tuple[str, int]] = []
    skipped: list[tuple[str, str]] = []
    pending, seen = [""], 0
    while pending:
        folder = pending.pop()
        try:
            entries = os.scandir(root / folder) if folder else os.scandir(root)
        except OSError as error:
            skipped.append((quote(folder), f"a folder that cannot be listed ({error.strerror})"))
            continue
        with entries:
            for entry in entries:
                seen += 1
                if seen > MAX_DATASET_ENTRIES:
                    raise DataError(f"{uri}: more than {MAX_DATASET_ENTRIES:,} entries in this folder and its "
                                    f"subfolders; expected a folder of Parquet parts")
                if entry.name.startswith((".", "_")):
                    continue
                relative = f"{folder}/{entry.name}" if folder else entry.name
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError as error:
                    skipped.append((quote(relative), f"cannot be read ({error.strerror})"))
                    continue
                if stat.S_ISDIR(mode):
                    pending.append(relative)
                elif stat.S_ISREG(mode) and entry.name.endswith(".parquet"):
                    found.append((relative, entry.stat(follow_symlinks=False).st_size))
                else:
                    skipped.append((quote(relative), _skip_reason(entry, mode)))
    return PartListing(found, skipped)


def _skip_reason(entry: os.DirEntry, mode: int) -> str:
    import stat

    if stat.S_ISLNK(mode):
        try:
            pointed = os.stat(entry.path).st_mode
            target = "a folder" if stat.S_ISDIR(pointed) else "a file" if stat.S_ISREG(pointed) else file_kind(pointed)
        except OSError:
            target = "nothing readable"
        return f"a symbolic link (to {target}): links are not followed"
    if stat.S_ISREG(mode):
        return "not a *.parquet file"
    return f"{file_kind(mode)}, not a regular file"


def _list_s3_parts(uri: str, s3_settings: S3Settings | None) -> list[tuple[str, int]]:
    from botocore.exceptions import BotoCoreError, ClientError


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
