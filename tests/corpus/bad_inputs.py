"""A corpus of bad (and good-but-imperfect) inputs, each made by code from real data.

The base is the Victoria hourly electricity demand CSV shipped with statsmodels (``ds,y``,
3600 rows, 2012-01-01 onwards). Each case corrupts it one way and says what the gate must
answer: ``stage`` "reading" means a DataError before any check (no report is written),
"quality" a DataQualityError listing failed checks (the GX report is written). ``expect`` is a
fragment of the one-line error; ``hidden`` are bits of the file that no message or report may
quote. ``settings`` are PipelineConfig overrides, all of which the
CLI can express (see ``cli_args``).

Used by tests/onnxcast/pipeline/test_quality.py (through the one data gate, ``check_in_process``) and tests/test_cli_bad_inputs.py
(through the real CLI).
"""

from __future__ import annotations

import bz2
import gzip
import io
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HEADER = "ds,y"
SHADOW = b"root:*:20228:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\nbin:*:20228:0:99999:7:::\n"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
AWS_ENV = f"AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE\nAWS_SECRET_ACCESS_KEY={AWS_SECRET}\n".encode()
TOKEN = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    build: Callable[[bytes], bytes | None]  # example CSV bytes -> file bytes (None: no file)
    expect: str
    stage: str = "quality"
    settings: dict = field(default_factory=dict)
    suffix: str = ".csv"
    # text of the file that must appear in no message and no report (a secret passed by mistake)
    hidden: tuple[str, ...] = ()

    def write(self, directory: Path, base: bytes) -> Path:
        path = directory / f"{self.name}{self.suffix}"
        data = self.build(base)
        if data is not None:
            path.write_bytes(data)
        return path

    def config(self, data_uri: str, out_dir: str):
        from onnxcast.pipeline.config import PipelineConfig, QualitySettings

        values = dict(self.settings)
        quality = QualitySettings(**values.pop("quality", {}))
        return PipelineConfig(data_uri=data_uri, out_dir=out_dir, quality=quality, **values)

    def cli_args(self) -> list[str]:
        """The settings as ``onnxcast pipeline`` flags."""
        flags = {"time_column": "--time-column", "target_column": "--target-column", "freq": "--freq",
                 "trained_until": "--trained-until", "horizon": "--horizon", "lookback": "--lookback"}
        args = []
        for key, value in self.settings.items():
            if key == "quality":
                if value.get("fill_gaps_max_steps"):
                    args += ["--fill-gaps", str(value["fill_gaps_max_steps"])]
                if value.get("drop_duplicate_timestamps"):
                    args.append("--drop-duplicates")
                unknown = set(value) - {"fill_gaps_max_steps", "drop_duplicate_timestamps"}
                assert not unknown, f"{self.name}: the CLI cannot set {unknown}"
            elif key == "feature_columns":
                args += ["--feature-columns", ",".join(value)]
            else:
                args += [flags[key], str(value)]
        return args


# --- ways to corrupt the base file ----------------------------------------------------------

def rows(base: bytes) -> list[list[str]]:
    """The data rows of the base CSV as [ds, y] text pairs."""
    lines = base.decode().strip().splitlines()
    assert lines[0] == HEADER
    return [line.split(",") for line in lines[1:]]


def csv_bytes(table: list[list[str]], header: str = HEADER) -> bytes:
    return ("\n".join([header, *(",".join(r) for r in table)]) + "\n").encode()


def edit(change: Callable[[list[list[str]]], list[list[str]]], header: str = HEADER):
    """A builder that edits the rows of the base file."""
    return lambda base: csv_bytes(change(rows(base)), header)


def set_values(positions, value: str):
    def change(table):
        for i in positions:
            table[i][1] = value
        return table
    return edit(change)


def scale_values(positions, factor: float):
    def change(table):
        for i in positions:
            table[i][1] = repr(float(table[i][1]) * factor)
        return table
    return edit(change)


def drop_rows(start: int, count: int):
    return edit(lambda t: t[:start] + t[start + count:])


def parquet(base: bytes, truncate: int = 0) -> bytes:
    import pandas as pd

    buffer = io.BytesIO()
    pd.read_csv(io.BytesIO(base)).to_parquet(buffer)
    data = buffer.getvalue()
    return data[: len(data) - truncate] if truncate else data


def zipped(base: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("data.csv", base)
    return buffer.getvalue()


def shuffled_block(table):
    table[500:510] = table[500:510][::-1]
    return table


def duplicated_rows(table):
    return table[:300] + [table[300], table[301]] + table[300:]


def mixed_offsets(table):
    for i in range(1000, 1010):
        table[i][0] = table[i][0] + "+10:00"
    return table


def local_time_with_offsets(base: bytes) -> bytes:
    """The same instants written in Melbourne local time: +11:00, then +10:00 after DST ends."""
    import pandas as pd

    frame = pd.read_csv(io.BytesIO(base))
    local = pd.to_datetime(frame["ds"]).dt.tz_localize("UTC").dt.tz_convert("Australia/Melbourne")
    frame["ds"] = [t.isoformat() for t in local]
    return frame.to_csv(index=False).encode()


def imperfect(table):
    """Three short gaps (4 steps), two duplicated rows, two empty values and two spikes."""
    for i in (1200, 1201):
        table[i][1] = repr(float(table[i][1]) * 50)
    for i in (2000, 2500):
        table[i][1] = ""
    kept = []
    for i, row in enumerate(table):
        if i in (100, 101, 1500, 3000):
            continue
        kept.append(row)
        if i in (700, 900):
            kept.append(list(row))
    return kept


BAD_INPUTS: list[Case] = [
    # --- files that are not a readable table: DataError from onnxcast.pipeline.reading, no report ---
    Case("empty_file", "zero bytes", lambda b: b"", "file is empty", "reading"),
    Case("whitespace_only", "blank lines only", lambda b: b"\n  \n\n", "file is empty", "reading"),
    Case("header_only", "a header and no rows", lambda b: b"ds,y\n", "no data rows", "reading"),
    Case("missing_file", "the path does not exist", lambda b: None, "file not found", "reading"),
    Case("binary_noise", "random bytes with NULs", lambda b: bytes((i * 37 + 11) % 256 for i in range(4096)),
         "binary content", "reading"),
    Case("png_image", "an image saved as .csv", lambda b: b"\x89PNG\r\n\x1a\n" + bytes(64), "a PNG image", "reading"),
    Case("zip_archive", "the CSV inside a ZIP (as Excel .xlsx is)", zipped, "ZIP archive", "reading"),
    Case("gzip_truncated", "a gzip download cut short", lambda b: gzip.compress(b)[:2000], "corrupt gzip", "reading",
         suffix=".csv.gz"),
    Case("semicolon_delimiter", "European export: ';' between fields",
         lambda b: b.replace(b",", b";"), "';' as delimiter", "reading"),
    Case("tab_delimiter", "tab-separated text", lambda b: b.replace(b",", b"\t"), "'\\t' as delimiter", "reading"),
    Case("ragged_rows", "a row with an extra field", edit(lambda t: t[:5] + [[*t[5], "17"]] + t[6:]),
         "Expected 2 fields in line 7, saw 3", "reading"),
    # pandas turned these into an index (one or two extra fields on every row: a MultiIndex that
    # crashed the data check), padded them with NaN, or parsed them without a word
    Case("ragged_every_row_one_more", "a trailing delimiter on every data row but not the header",
         edit(lambda t: [[*r, ""] for r in t]), "line 2 has 3 field(s), the header has 2; 3600 rows in all",
         "reading"),
    Case("ragged_every_row_two_more", "two extra fields on every data row",
         edit(lambda t: [[*r, "1", "2"] for r in t]), "line 2 has 4 field(s), the header has 2; 3600 rows in all",
         "reading"),
    Case("ragged_first_row_more", "the first data row has an extra field",
         edit(lambda t: [[*t[0], "9"], *t[1:]]), "line 2 has 3 field(s), the header has 2", "reading"),
    Case("ragged_short_row", "a row with a field missing", edit(lambda t: t[:9] + [t[9][:1]] + t[10:]),
         "line 11 has 1 field(s), the header has 2", "reading"),
    Case("ragged_header_longer", "a header naming a column no row has",
         lambda b: b.replace(b"ds,y", b"ds,y,temp", 1), "line 2 has 2 field(s), the header has 3", "reading"),
    Case("unclosed_quote", "a quote opened and never closed", lambda b: b.replace(b"2012-01-02 00:00:00", b'"2012-01-02', 1),
         "EOF inside string", "reading"),
    Case("latin1_header", "Latin-1 bytes (a degree sign) in the header",
         lambda b: b.replace(b"ds,y", "ds,y \xb0C".encode("latin-1"), 1), "not UTF-8", "reading"),
    Case("huge_field", "a 200 kB field in a data row",
         lambda b: b.replace(b"7926.529376", b"7" * 200_000, 1), "field of 200000 characters", "reading"),
    Case("html_error_page", "an HTML error page saved instead of the data",
         lambda b: b"<!DOCTYPE html><html><body>403 Forbidden</body></html>", "looks like HTML", "reading"),
    Case("json_records", "JSON records instead of CSV", lambda b: b'[{"ds": "2012-01-01", "y": 1.0}]',
         "looks like JSON", "reading"),
    Case("parquet_truncated", "a Parquet file cut short", lambda b: parquet(b, truncate=100),
         "unreadable Parquet", "reading", suffix=".parquet"),
    # secret files passed as --data by mistake: the first release quoted their first line in the
    # error, the GX report and validation_result.json ("missing ['ds', 'y']; found ['root:*:...']")
    Case("shadow_file", "an /etc/shadow copy", lambda b: SHADOW, "not a table: the first line has no ','",
         "reading", hidden=("root:*", "20228:0:99999", "daemon:")),
    Case("env_file_with_secrets", "AWS credentials as KEY=value lines", lambda b: AWS_ENV,
         "not a table: the first line has no ','", "reading", hidden=("AKIAIOSFODNN7EXAMPLE", AWS_SECRET,
                                                                       "AWS_SECRET_ACCESS_KEY")),
    Case("token_lines", "a token file: one word per line", lambda b: f"{TOKEN}\n{TOKEN[::-1]}\n".encode(),
         "missing ['ds', 'y']", hidden=(TOKEN, TOKEN[::-1], TOKEN[:12])),
    Case("duplicate_header", "the same column name twice", lambda b: b.replace(b"ds,y\n", b"ds,y,y\n", 1).replace(
        b"\n2012", b",0\n2012"), "duplicate column name(s) ['y']", "reading"),
    # --- tables that fail checks: DataQualityError after the GX suite, report written ---
    Case("target_renamed", "the target column is called 'value'", edit(lambda t: t, header="ds,value"),
         "missing ['y']"),
    Case("no_header", "the first row is data, not a header", lambda b: b.split(b"\n", 1)[1],
         "missing ['ds', 'y']; the first line is not a header of column names", hidden=("7926.529376",)),
    Case("feature_missing", "a feature column that the file lacks", lambda b: b, "missing ['temperature']",
         settings={"feature_columns": ("temperature",)}),
    Case("unparseable_timestamps", "words where timestamps belong",
         edit(lambda t: [["not a date" if i in (10, 20, 30) else r[0], r[1]] for i, r in enumerate(t)]),
         "timestamps parse as dates: 3 of 3600 rows, e.g. 'not a date'"),
    Case("empty_timestamps", "timestamps left empty",
         edit(lambda t: [["" if i in (40, 41) else r[0], r[1]] for i, r in enumerate(t)]),
         "'<empty>'"),
    Case("epoch_seconds", "Unix seconds instead of dates",
         edit(lambda t: [[str(1325376000 + 3600 * i), r[1]] for i, r in enumerate(t)]),
         "numbers are not read as timestamps"),
    Case("naive_and_offset_mixed", "ten rows carry +10:00, the rest no offset", edit(mixed_offsets),
         "all with or all without a UTC offset"),
    Case("duplicate_timestamps", "two rows repeated", edit(duplicated_rows), "'ds' timestamps unique"),
    Case("off_grid", "three timestamps moved to half past",
         edit(lambda t: [[r[0].replace(":00:00", ":30:00") if i in (50, 60, 70) else r[0], r[1]]
                         for i, r in enumerate(t)]), "on the regular 'h' grid"),
    Case("wrong_freq_setting", "hourly data declared daily", lambda b: b, "on the regular 'D' grid",
         settings={"freq": "D"}),
    Case("large_gap", "a week of rows missing (4.7% of the grid)", drop_rows(1000, 168),
         "missing timestamps at most 1.00%"),
    Case("gap_without_repair", "three rows missing, no repair asked for", drop_rows(1000, 3),
         "at most 0 steps long (fill_gaps_max_steps): longest 3 steps"),
    Case("gap_longer_than_fill", "a 10-step gap with fill_gaps_max_steps=3", drop_rows(1000, 10),
         "at most 3 steps long (fill_gaps_max_steps): longest 10 steps", settings={"quality": {"fill_gaps_max_steps": 3}}),
    Case("non_numeric_target", "text in the target column", set_values([3, 4, 5], "n/a?"),
         "'y' values numeric: 3 of 3600 rows, e.g. 'n/a?'"),
    Case("many_empty_values", "5% of target values empty", set_values(range(0, 3600, 20), ""),
         "'y' empty values at most 1.00%"),
    Case("empty_value_at_end", "the last value empty; interpolation cannot fill an end",
         set_values([3599], ""), "values present at the first and last timestamp",
         settings={"quality": {"fill_gaps_max_steps": 3}}),
    Case("infinite_values", "inf in the target", set_values([100, 200], "inf"), "finite and within float32 range"),
    Case("float32_overflow", "a value too big for float32", set_values([100], "1e39"), "finite and within float32 range"),
    Case("constant_series", "a stuck meter: one value throughout", edit(lambda t: [[r[0], "42.0"] for r in t]),
         "'y' not constant: 1 distinct value(s)"),
    Case("too_few_rows", "200 rows for lookback 168 + horizon 24", edit(lambda t: t[:200]),
         "rows for lookback 168, horizon 24"),
    Case("trained_until_too_early", "a cutoff that leaves one day", lambda b: b,
         "rows for lookback 168, horizon 24", settings={"trained_until": "2012-01-02T00:00:00"}),
]

# Good data with tolerable issues: passes, with warnings (and repairs only where asked for).
GOOD_INPUTS: list[Case] = [
    Case("imperfect_with_repairs", "three short gaps, two duplicates, two empty values, two spikes",
         edit(imperfect), "", settings={"quality": {"fill_gaps_max_steps": 3, "drop_duplicate_timestamps": True}}),
    Case("local_time_offsets", "Melbourne local time with +11:00 and +10:00 (DST ends)", local_time_with_offsets, ""),
    Case("gzip_csv", "the CSV compressed with gzip", gzip.compress, "", suffix=".csv.gz"),
    Case("bzip2_csv", "the CSV compressed with bzip2", bz2.compress, "", suffix=".csv.bz2"),
    Case("parquet", "the table as Parquet", parquet, "", suffix=".parquet"),
    Case("utf16_bom", "Excel 'Unicode text': UTF-16 with a BOM", lambda b: b.decode().encode("utf-16"), ""),
    Case("spaces_in_header", "' ds , y ' with a UTF-8 BOM", lambda b: b"\xef\xbb\xbf" + b.replace(b"ds,y", b" ds , y ", 1), ""),
    # refused by the one-series gate before issue 31 (changes-31.md 16): sorted, and kept with a warning
    Case("out_of_order", "a block of ten rows reversed", edit(shuffled_block), ""),
    Case("outlier_spikes", "1% of values multiplied by 100", scale_values(range(0, 3600, 100), 100.0), ""),
]


# --- fleets: long tables of many series (`onnxcast pipeline --series-column unique_id`) ------
# Bounded fleet input (issue 30, items 5 to 10): tables that decode far beyond their size,
# series ids that are not ids, options a fleet ignored, folder entries skipped without a word.
# Built in a folder by code, small; run through the real CLI by tests/cli/test_fleet_bad_inputs.py.

FLEET_ARGS = ("--series-column", "unique_id", "--horizon", "6", "--lookback", "12", "--freq", "MS", "--season",
              "12", "--models", "dlinear", "--max-epochs", "1", "--holdout-windows", "1", "--shards", "1")
FLEET_SERIES = 20
FLEET_LENGTH = 60  # months per series
MEGA_ID = 1 << 20  # characters of the long ids (the report had 1 MB ids copied into report.json)


@dataclass(frozen=True)
class FleetCase:
    name: str
    description: str
    build: Callable[[Path], Path]  # folder -> the --data it wrote there
    expect: str  # a fragment of the one-line error
    stage: str = "reading"  # "reading": DataError, nothing written; "quality": the gate failed, quality/ kept
    args: tuple[str, ...] = ()  # more `onnxcast pipeline` options
    env: dict = field(default_factory=dict)  # environment (the limits' variables)
    warnings: tuple[str, ...] = ()  # fragments of warning lines the run must log too


def fleet_frame(ids: list | None = None, length: int = FLEET_LENGTH):
    """A clean monthly fleet: ``FLEET_SERIES`` series ``s000``... of ``length`` months."""
    import numpy as np
    import pandas as pd

    ids = [f"s{i:03d}" for i in range(FLEET_SERIES)] if ids is None else ids
    months = pd.date_range("2000-01-01", periods=length, freq="MS").strftime("%Y-%m-%d")
    rng = np.random.default_rng(0)
    return pd.DataFrame({"unique_id": np.repeat(np.asarray(ids, dtype=object), length),
                         "ds": np.tile(months, len(ids)),
                         "y": (100 + rng.normal(0, 10, len(ids) * length)).round(3)})


def _fleet_file(name: str, frame_of: Callable[[], object]):
    def build(folder: Path) -> Path:
        frame = frame_of()
        path = folder / name
        if name.endswith(".csv"):
            frame.to_csv(path, index=False)
        else:
            frame.to_parquet(path, index=False)
        return path
    return build


def _fleet_ids(bad: str, *, at: int = FLEET_SERIES - 1):
    """The clean fleet with the series ``at`` renamed ``bad``."""
    return lambda: fleet_frame([bad if i == at else f"s{i:03d}" for i in range(FLEET_SERIES)])


def _typed_ids(make: Callable[[str], object]):
    """The clean fleet with its ids turned into another Parquet type by ``make``."""
    def build(folder: Path) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        frame = fleet_frame()
        path = folder / "typed_ids.parquet"
        pq.write_table(pa.table({"unique_id": pa.array([make(s) for s in frame["unique_id"]]),
                                 "ds": frame["ds"], "y": frame["y"]}), path)
        return path
    return build


def hundred_million_rows(folder: Path) -> Path:
    """100 M rows in 20 row groups of 5 M, 218 KB (the report's 1.2 MB file took 12.9 GB to
    decode): one column of nulls, so that building it costs 0.6 s; only the footer is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder / "hundred_million_rows.parquet"
    group = pa.table({"y": pa.nulls(5_000_000, pa.float64())})
    with pq.ParquetWriter(path, group.schema, compression="zstd") as writer:
        for _ in range(20):
            writer.write_table(group, row_group_size=len(group))
    return path


def _parts(folder: Path, frame, name: str = "parts") -> Path:
    root = folder / name
    root.mkdir()
    half = len(frame) // 2
    frame.iloc[:half].to_parquet(root / "part-0.parquet", index=False)
    frame.iloc[half:].to_parquet(root / "part-1.parquet", index=False)
    return root


def _with_one_short_series(frame):
    """``frame`` plus a series of 5 months: excluded (too_short), so with --max-excluded-share 0
    the run fails right after the series checks, saying how many were excluded and why."""
    import pandas as pd

    return pd.concat([frame, fleet_frame(["short"], length=5)], ignore_index=True)


def folder_with_odd_entries(folder: Path) -> Path:
    """Two Parquet parts, and what a folder may also hold: a symlink to a part elsewhere, a
    symlink to /dev/zero, a FIFO, a symlinked subfolder, a character device (where mknod is
    allowed), a README: each skipped, with a warning line saying why."""
    import os

    root = _parts(folder, _with_one_short_series(fleet_frame()))
    elsewhere = folder / "elsewhere"
    elsewhere.mkdir()
    fleet_frame(["other"]).to_parquet(elsewhere / "x.parquet", index=False)
    os.symlink(elsewhere / "x.parquet", root / "linked.parquet")
    os.symlink("/dev/zero", root / "zero.parquet")
    os.symlink(elsewhere, root / "linked-folder")
    os.mkfifo(root / "fifo.parquet")
    try:
        os.mknod(root / "null.parquet", 0o600 | 0o020000, os.makedev(1, 3))
    except OSError:  # not root: the other entries make the point
        pass
    (root / "README.md").write_text("parts of the meter fleet\n")
    return root


def _megabyte_ids(folder: Path) -> Path:
    import pandas as pd

    path = folder / "megabyte_ids.parquet"
    pd.concat([fleet_frame(), fleet_frame([k * MEGA_ID for k in "ABCDE"], length=2)]).to_parquet(path, index=False)
    return path


def _twice(folder: Path) -> Path:
    import pandas as pd

    frame = fleet_frame()
    path = folder / "every_row_twice.csv"
    _with_one_short_series(pd.concat([frame, frame], ignore_index=True)).to_csv(path, index=False)
    return path


FLEET_BAD_INPUTS: list[FleetCase] = [
    # --- sizes, from the Parquet footer or the CSV's lines, before anything is decoded ---
    FleetCase("parquet_100m_rows", "100 M rows of zstd in 218 KB", hundred_million_rows,
              "Parquet file of 100,000,000 rows (by its metadata, 20 row group(s)), over the limit of 20,000,000 "
              "rows (set ONNXCAST_MAX_DATA_ROWS to read more)"),
    FleetCase("parquet_cells_over_limit", "3,600 cells against a limit of 1,000",
              _fleet_file("fleet.parquet", fleet_frame), "Parquet file of 3,600 cells",
              env={"ONNXCAST_MAX_DATA_CELLS": "1000"}),
    FleetCase("csv_lines_over_limit", "1,200 lines against a limit of 1,000 rows",
              _fleet_file("fleet.csv", fleet_frame), "1,200 lines, over the limit of 1,000 rows",
              env={"ONNXCAST_MAX_DATA_ROWS": "1000"}),
    FleetCase("parts_rows_over_limit", "two parts of 600 rows: 1,200 in all against 1,000",
              lambda folder: _parts(folder, fleet_frame()),
              "the Parquet files hold more than the limit of 1,000 rows in all (by their metadata, reached at part",
              env={"ONNXCAST_MAX_DATA_ROWS": "1000"}),
    FleetCase("too_many_series", "20 series against --max-series 10", _fleet_file("fleet.parquet", fleet_frame),
              "20 series in column 'unique_id', more than max_series 10 (--max-series)", args=("--max-series", "10")),
    # --- series ids: the one rule of the pipeline and the device, ids of other types ---
    FleetCase("binary_ids_not_utf8", "ids as bytes that are not UTF-8", _typed_ids(lambda s: s.encode() + b"\xff"),
              "column 'unique_id' holds bytes that are not UTF-8 text (first at row 1); series ids must be text"),
    FleetCase("struct_ids", "ids as structs", _typed_ids(lambda s: {"site": s, "meter": 1}),
              "column 'unique_id' holds struct<site: string, meter: int64> values; series ids must be text or "
              "whole numbers"),
    FleetCase("list_ids", "ids as lists", _typed_ids(lambda s: [s]),
              "column 'unique_id' holds list<element: string> values; series ids must be text or whole numbers"),
    FleetCase("float_ids", "ids as floats", _typed_ids(lambda s: float(s[1:]) + 0.5),
              "column 'unique_id' holds double values; series ids must be text or whole numbers"),
    FleetCase("megabyte_ids", "five ids of 1 MB each (two rows each: 10 MB of ids)", _megabyte_ids,
              f"is {MEGA_ID:,} characters long, more than 100; expected a series id (5 such ids)"),
    FleetCase("id_with_newline", "a quoted id holding a line break", _fleet_file("nl.csv", _fleet_ids("s\n019")),
              "unique_id value 's\\n019' at row 1,141 is not printable"),
    FleetCase("id_with_control", "an id holding BEL", _fleet_file("bel.csv", _fleet_ids("s\x07019")),
              "unique_id value 's\\x07019' at row 1,141 is not printable"),
    FleetCase("id_with_bidi_override", "an id holding U+202E (right-to-left override)",
              _fleet_file("bidi.parquet", _fleet_ids("s\u202e910")),
              "unique_id value 's\\u202e910' at row 1,141 is not printable"),
    FleetCase("id_with_leading_space", "' s019' (CSV strips it; Parquet keeps it)",
              _fleet_file("space.parquet", _fleet_ids(" s019")),
              "unique_id value ' s019' at row 1,141 is not a name without leading or trailing spaces"),
    FleetCase("empty_id", "an id that is the empty string", _fleet_file("empty.parquet", _fleet_ids("")),
              "unique_id value '' at row 1,141 is empty; expected a series id"),
    # --- options and folders ---
    FleetCase("every_row_twice_dropped", "every row twice with --drop-duplicates: the last row is kept", _twice,
              "1 of 21 series (4.8%) were excluded, more than max_excluded_share 0%: too_short 1", "quality",
              args=("--drop-duplicates", "--max-excluded-share", "0")),
    FleetCase("folder_with_odd_entries", "parts among symlinks, a FIFO, a device, a linked folder",
              folder_with_odd_entries, "1 of 21 series (4.8%) were excluded", "quality",
              args=("--max-excluded-share", "0"),
              warnings=("skipped 'fifo.parquet': a FIFO, not a regular file",
                        "skipped 'linked-folder': a symbolic link (to a folder): links are not followed",
                        "skipped 'linked.parquet': a symbolic link (to a file): links are not followed",
                        "skipped 'zero.parquet': a symbolic link (to a character device): links are not followed",
                        "skipped 'README.md': not a *.parquet file")),
]
