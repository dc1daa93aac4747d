"""A corpus of bad (and good-but-imperfect) inputs, each made by code from real data.

The base is the Victoria hourly electricity demand CSV shipped with statsmodels (``ds,y``,
3600 rows, 2012-01-01 onwards). Each case corrupts it one way and says what the gate must
answer: ``stage`` "reading" means a DataError before any check (no report is written),
"quality" a DataQualityError listing failed checks (the GX report is written). ``expect`` is a
fragment of the one-line error; ``hidden`` are bits of the file that no message or report may
quote. ``settings`` are PipelineConfig overrides, all of which the
CLI can express (see ``cli_args``).

Used by tests/onnxcast/pipeline/test_quality.py (through ``check_data``) and tests/test_cli_bad_inputs.py
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
    Case("out_of_order", "a block of ten rows reversed", edit(shuffled_block), "timestamps in increasing order"),
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
    Case("outlier_spikes", "1% of values multiplied by 100", scale_values(range(0, 3600, 100), 100.0),
         "'y' outliers at most 0.10%"),
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
]
