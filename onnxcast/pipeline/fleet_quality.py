"""The one data gate, for any number of series, in three steps that Airflow maps.

A table without ``series_column`` is one series (a fleet of one, named by its target column):
one shard of one series, the same checks, repairs and files. How long a series must be follows
how the run will be judged (``fleet_data.judging_for`` the table's series).

- :func:`check_fleet_table` (one task): read the table (a CSV or Parquet file, or a folder /
  ``s3://`` prefix of Parquet files), run the TABLE suite (required columns, series ids
  present, timestamps parse, values numeric, one frequency): a fault there fails the run with
  the usual one-line DataQualityError. Assign the series to shards (``data/shards.json``) and
  write each shard's raw rows (``data/shards/<k>/rows.parquet``).
- :func:`check_fleet_shard` (one mapped task per shard): the SERIES suite on the shard's
  series table (one row per series, computed with numpy): a bad series (too short, gaps,
  mostly missing, constant, duplicated times, off the grid, outliers) is EXCLUDED with its
  reason; the kept series are repaired and laid on the grid (``data/shards/<k>/``, a
  FleetData), the GX results go to ``quality/shards/<k>/``.
- :func:`merge_fleet_checks` (one task): every shard's verdicts; more than
  ``quality.max_excluded_share`` of series excluded fails the run (DataQualityError); writes
  ``data/fleet/`` (every kept series), ``quality/series.parquet``, the quality summary page,
  ``data/dataset.json`` (dataset, split, quality) and ``config.json``.
- :func:`check_in_process`: the three, one after another (the CLI, the monitor, tests).

Why a series table: GX validates one row per series with ``result_format`` COMPLETE and the
series column as index, so every failed expectation lists the failing series by id; one
expectation per series (``row_condition``) would be 10,000 x checks expectations. The table
is computed with numpy over the rows sorted by (series, time): segment sums and maxima, no
Python loop over rows (and none over series except to interpolate the few with gaps).

Design: docs/design/fleet.md section 2. pandas, pyarrow and GX are imported inside functions.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from onnxcast.base.errors import DataError, DataQualityError
from onnxcast.base.files import read_json, write_json, write_text_atomic
from onnxcast.base.s3 import S3Settings
from onnxcast.base.untrusted import quote
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.data import dated_split, infer_freq, utc_iso
from onnxcast.pipeline.data import fill_short_gaps as _fill_short_gaps
from onnxcast.pipeline.expectations import (
    OFFLINE_CSS,
    REPORT_HTML,
    import_gx,
    named_check,
    run_suite,
    summary_html,
    write_reports,
)
from onnxcast.pipeline.expectations import clip as _clip
from onnxcast.pipeline.expectations import import_gx as _import_gx
from onnxcast.pipeline.expectations import named_check as _meta
from onnxcast.pipeline.expectations import quiet_gx as _quiet_gx
from onnxcast.pipeline.expectations import summarize as _summarize
from onnxcast.pipeline.fleet_data import (
    ACROSS_SERIES,
    OVER_ORIGINS,
    FleetData,
    assign_shards,
    fleet_steps,
    judging_for,
    min_rows_over_origins,
    min_train_steps,
    proportional_steps,
    split_fleet,
    train_steps_over_origins,
)
from onnxcast.pipeline.quality import (
    FLOAT32_MAX,
    ROBUST_SCALE_MAD,
    ROBUST_SCALE_MEAN_AD,
    hide_unnamed_columns,
    parse_times,
)
from onnxcast.pipeline.quality import grid_positions as _grid_positions
from onnxcast.pipeline.quality import parse_numbers as _numeric
from onnxcast.pipeline.reading import read_long_table, read_table
from onnxcast.pipeline.seasons import season_for_freq

log = logging.getLogger(__name__)

TABLE_SUITE = "onnxcast-fleet-table"
GRID_SUITE = "onnxcast-fleet-grid"
SERIES_SUITE = "onnxcast-fleet-series"
SHARE_SUITE = "onnxcast-fleet-excluded-share"
SUMMARY_HTML = "summary.html"
FREQ_SAMPLE = 500  # series whose own frequency is inferred to find the fleet's
EXAMPLES = 50  # excluded series named per reason on the summary page
SKIPPED_LISTED = 100  # entries of a folder data set skipped (links, FIFOs ...) listed in the report; the rest counted
OFF_GRID_DESCRIBED = 5  # off-grid series whose own frequency is put in words (a pandas inference each)
HELPER = "_qc_"
ONE_SERIES_COLUMN = "series"  # id_column of a table of one series
SERIES_TABLE = "series.parquet"
ZONE_SUFFIX = r"(?:\d:\d\d(?::\d\d(?:\.\d*)?)?\s*(?:Z|[+-]\d\d(?::?\d\d)?)|\b(?:UTC|GMT))$"

# The series checks that exclude a series, in the order its reasons are listed; the series
# suite's warnings (kept, counted) are not_increasing, outlier_share, no_outliers and padded. Outliers only
# warn: one value beyond 12 robust sigmas is already 0.7% of a 140-month series, and the
# defaults excluded 9 of the 1,428 real M3 monthly series for it (level shifts, not errors).
SERIES_CHECKS = ("too_short", "train_too_short", "duplicated_times", "off_grid", "mostly_missing", "constant",
                 "flat_before_holdout",
                 "non_finite", "gap_share", "gaps_repairable", "edges_present")


def check_in_process(cfg: PipelineConfig, *, s3_settings: S3Settings | None = None,
                     judging: str | None = None) -> dict:
    """The three steps one after another in this process (the table, every shard, the merge);
    returns :func:`merge_fleet_checks`'s summary."""
    for shard in check_fleet_table(cfg, s3_settings=s3_settings, judging=judging):
        check_fleet_shard(cfg, shard)
    return merge_fleet_checks(cfg, judging=judging)


# --- step 1: the table ----------------------------------------------------------------------

def check_fleet_table(cfg: PipelineConfig, *, s3_settings: S3Settings | None = None,
                      judging: str | None = None) -> list[int]:
    """Read and check the table; write the shards; return the shard numbers ``[0, .., k-1]``.
    ``judging``: how the run will be judged, which sets how long a series must be (None: as
    ``judging_for`` the table's series; the monitor of a global model says across series)."""

    layout, series_col = cfg.layout, id_column(cfg)
    value_cols = [cfg.target_column, *cfg.feature_columns]
    raw = _read(cfg, s3_settings)
    _check_series_count(raw.frame, cfg, raw.source)
    frame = _with_table_helpers(hide_unnamed_columns(raw.frame, cfg), cfg)
    raw = replace(raw, frame=None)  # the frame as read goes as soon as its helpers have what they need
    checks = _validate(frame, _table_suite(cfg, frame), layout.quality, raw.source, TABLE_SUITE)

    ids, codes = _series_codes(frame, cfg)
    times = frame[f"{HELPER}time"].to_numpy(dtype="datetime64[ns]").astype(np.int64)
    values = np.column_stack([frame[f"{HELPER}{c}_value"].to_numpy(dtype="float64") for c in value_cols])
    del frame
    freq, season, grid_table = _one_frequency(codes, times, ids, cfg, raw.source)
    checks += _validate(grid_table, _grid_suite(cfg, freq, len(ids)), layout.quality / "grid", raw.source,
                        GRID_SUITE, failure=lambda: _mixed_words(grid_table, series_col, freq, cfg))

    rows = np.bincount(codes, minlength=len(ids))
    shards = assign_shards(rows, min(cfg.fleet_shards, len(ids)))
    for k, members in enumerate(shards):
        _write_shard_rows(layout.shard_rows(k), codes, times, values, members, ids, cfg)
    write_json(layout.shards, {
        "n_shards": len(shards), "shards": [[ids[i] for i in members] for members in shards],
        "rows": [int(rows[members].sum()) for members in shards], "freq": freq, "season": int(season),
        "series_column": cfg.series_column, "source": raw.source, "sha256": raw.sha256, "n_bytes": raw.n_bytes,
        "n_series": len(ids), "judging": judging or judging_for(len(ids)), "table_rows": int(len(codes)),
        "table_checks": checks,
        "end": _iso(times.max()) if len(times) else None,
        "skipped_entries": {"count": len(raw.skipped),
                            "entries": [{"entry": name, "why": why} for name, why in raw.skipped[:SKIPPED_LISTED]]}})
    log.info("data table %s: %d rows, %d series, freq %s, %d shard(s)", raw.source, len(codes), len(ids),
             freq, len(shards))
    return list(range(len(shards)))


def id_column(cfg: PipelineConfig) -> str:
    """The column of series ids in the gate's own files (shard rows, series tables):
    ``series_column``, or ``"series"`` for a table of one series."""
    if cfg.series_column:
        return cfg.series_column
    taken = {cfg.time_column, cfg.target_column, *cfg.feature_columns}
    return ONE_SERIES_COLUMN if ONE_SERIES_COLUMN not in taken else f"_{ONE_SERIES_COLUMN}_id"


def _read(cfg: PipelineConfig, s3_settings: S3Settings | None):
    """The table as read: a long table by ``series_column``, else a file of one series."""
    if not cfg.series_column:  # the definition of one series: a table without a series column
        return read_table(cfg.data_uri, s3_settings=s3_settings)
    return read_long_table(cfg.data_uri, columns=[cfg.series_column, cfg.time_column, cfg.target_column,
                                                  *cfg.feature_columns],
                           series_column=cfg.series_column, s3_settings=s3_settings)


def _series_codes(frame, cfg: PipelineConfig) -> tuple[tuple[str, ...], np.ndarray]:
    """(series ids, each row's series number); a table of one series is the series named by
    its target column."""
    if not cfg.series_column:
        return (cfg.target_column,), np.zeros(len(frame), dtype=np.int32)
    ids_cat = frame[cfg.series_column].cat.remove_unused_categories()
    ids = tuple(str(c) for c in ids_cat.cat.categories)
    return ids, ids_cat.cat.codes.to_numpy().astype(np.int32 if len(ids) < 2**31 else np.int64)


def _check_series_count(frame, cfg: PipelineConfig, source: str) -> None:
    """More series than ``quality.max_series``: refused in one line, before any check."""
    column, limit = cfg.series_column, cfg.quality.max_series
    if column not in frame.columns or len(frame[column].cat.categories) <= limit:
        return
    count = len(frame[column].cat.remove_unused_categories().cat.categories)
    if count > limit:
        raise DataError(f"{source}: {count:,} series in column {quote(column)}, more than max_series {limit:,} "
                        "(--max-series); split the table or raise the limit")


def _one_frequency(codes, times, ids: tuple[str, ...], cfg: PipelineConfig, source: str):
    """(freq, season, grid table): the fleet's frequency (``cfg.freq``, else inferred) and one row
    per series whose ``off_grid_example`` says, for a series off its grid, what it looks like."""
    import pandas as pd


    order = series_time_order(codes, times)
    sorted_codes, sorted_times = (codes, times) if order is None else (codes[order], times[order])
    del order
    freq = cfg.freq or _infer_fleet_freq(sorted_codes, sorted_times, len(ids), cfg.seed, source)
    try:
        pd.tseries.frequencies.to_offset(freq)
    except ValueError:
        raise DataError(f"{source}: unknown frequency {freq!r}") from None
    season = cfg.season or season_for_freq(freq)
    keep = _last_of_duplicates(sorted_codes, sorted_times)
    kept_codes, kept_times = sorted_codes[keep], sorted_times[keep]
    del sorted_codes, sorted_times, keep
    off = np.bincount(kept_codes[grid_positions(kept_codes, kept_times, freq) < 0], minlength=len(ids))
    grid_table = pd.DataFrame({id_column(cfg): list(ids), "off_grid_example": None})
    grid_table["off_grid_example"] = grid_table["off_grid_example"].astype(object)
    off_ids = np.flatnonzero(off)
    grid_table.loc[off_ids, "off_grid_example"] = "off the grid"
    for i in off_ids[:OFF_GRID_DESCRIBED]:  # what the first off-grid series look like, in words
        start, stop = np.searchsorted(kept_codes, [i, i + 1])
        own = _own_freq(kept_times[start:stop])
        grid_table.loc[i, "off_grid_example"] = (f"looks {quote(own)}" if own and own != freq else
                                                 f"has {int(off[i])} timestamp(s) off it")
    return freq, season, grid_table


def _write_shard_rows(path: Path, codes, times, values, members, ids, cfg: PipelineConfig) -> None:
    """The rows of the series ``members`` in their original order ("not increasing" is a
    finding), the ids as a dictionary of the shard's series (read back as a categorical)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    local = np.full(len(ids), -1, dtype=np.int32)
    local[members] = np.arange(len(members), dtype=np.int32)
    picked = np.flatnonzero(local[codes] >= 0)
    columns = {id_column(cfg): pa.DictionaryArray.from_arrays(
                   pa.array(local[codes[picked]]), pa.array([ids[i] for i in members], type=pa.string())),
               cfg.time_column: pa.array(times[picked].astype("datetime64[ns]"))}
    columns.update({c: pa.array(values[picked, j]) for j, c in enumerate([cfg.target_column, *cfg.feature_columns])})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.table(columns), tmp, compression="zstd")
    tmp.replace(path)


def _with_table_helpers(frame, cfg: PipelineConfig):
    """The three kinds of row helpers the table suite checks (design 2.1): parsed time, the
    unparseable and the off-zone-style raw text, values that are not numbers.

    Built for millions of rows: timestamps are parsed once per distinct text (a fleet
    repeats the same calendar in every series), and raw text is made only for the bad rows
    (quality._numeric turns every row into a string: 4 s of 30 at 1.2 M rows)."""
    import pandas as pd


    frame = frame.reset_index(drop=True).copy(deep=False)
    if cfg.time_column in frame.columns:
        raw = frame[cfg.time_column]
        if raw.dtype.kind in "Miufb":
            times, zone = parse_times(raw), _nulls(frame.index)
        else:
            distinct = raw.astype("category")
            labels = pd.Series(distinct.cat.categories)
            codes = distinct.cat.codes.to_numpy()
            parsed = parse_times(labels).to_numpy(dtype="datetime64[ns]")
            times = pd.Series(np.where(codes >= 0, parsed[np.maximum(codes, 0)], np.datetime64("NaT")),
                              index=frame.index).dt.tz_localize("UTC")
            zone = _zone_mismatch_of_labels(labels, codes, frame.index)
        unparseable = _bad_rows(times.isna().to_numpy(), raw, empty="<empty>")
        if cfg.trained_until:
            cutoff = pd.Timestamp(cfg.trained_until)  # PipelineConfig checked it is one
            cutoff = cutoff.tz_localize("UTC") if cutoff.tzinfo is None else cutoff.tz_convert("UTC")
            keep = (times.isna() | (times <= cutoff)).to_numpy()
            frame, times, unparseable, zone = (x[keep].reset_index(drop=True)
                                               for x in (frame, times, unparseable, zone))
        frame[f"{HELPER}time"] = times
        frame[f"{HELPER}time_unparseable"] = unparseable
        frame[f"{HELPER}time_zone_mismatch"] = zone
    for column in (cfg.target_column, *cfg.feature_columns):
        if column not in frame.columns:
            continue
        raw = frame[column]
        if raw.dtype.kind in "iufb":
            frame[f"{HELPER}{column}_value"] = raw.astype("float64")
            frame[f"{HELPER}{column}_not_numeric"] = _nulls(frame.index)
        else:
            numeric, not_numeric = _numeric(raw)
            frame[f"{HELPER}{column}_value"] = numeric
            frame[f"{HELPER}{column}_not_numeric"] = not_numeric
    return frame


def _nulls(index):
    import pandas as pd

    return pd.Series(None, index=index, dtype="object")


def _bad_rows(mask, raw, *, empty: str):
    """The raw text (clipped) of the rows in ``mask``, None elsewhere: an object column GX reads as null."""

    out = _nulls(raw.index)
    if mask.any():
        out[mask] = raw[mask].astype("string").fillna(empty).astype(object).map(_clip)
    return out


def _zone_mismatch_of_labels(labels, codes, index):
    """quality._zone_mismatch over the distinct texts: the rows written with a UTC offset
    when most rows are not, or the reverse."""

    text = labels.astype("string").str.strip()
    # an offset follows a time of day: quality's pattern also reads the "-01" that ends a
    # date-only "2000-01-01" as an offset
    aware = text.str.contains(ZONE_SUFFIX, regex=True, na=False).to_numpy(dtype=bool)
    present = codes >= 0
    out = _nulls(index)
    if not present.any():
        return out
    majority = aware[codes[present]].mean() >= 0.5
    odd = present & (aware[np.maximum(codes, 0)] != majority)
    if odd.any():
        out[odd] = text.to_numpy(dtype=object)[codes[odd]]
        out[odd] = out[odd].map(_clip)
    return out


def _table_suite(cfg: PipelineConfig, frame):

    gx = _import_gx()
    E, h = gx.expectations, HELPER
    series, time = cfg.series_column, cfg.time_column
    required = [c for c in (series, time, cfg.target_column, *cfg.feature_columns) if c]
    present = set(map(str, frame.columns))
    raw_time = frame[time] if time in present else None
    numeric_hint = ("; numbers are not read as timestamps, write ISO 8601"
                    if raw_time is not None and raw_time.dtype.kind in "iuf" and bool(raw_time.notna().any()) else "")
    expectations = [_meta(E.ExpectTableColumnsToMatchSet(column_set=required, exact_match=False),
                          "required_columns", f"required columns {required} present")]
    if series in present:
        expectations.append(_meta(E.ExpectColumnValuesToNotBeNull(column=series), "series_ids_present",
                                  f"{series!r} series id on every row", column=series))
    if time in present:
        expectations += [
            _meta(E.ExpectColumnValuesToBeNull(column=f"{h}time_unparseable"), "timestamps_parse",
                  f"{time!r} timestamps parse as dates", numeric_hint, column=time),
            _meta(E.ExpectColumnValuesToBeNull(column=f"{h}time_zone_mismatch"), "timestamps_one_zone_style",
                  f"{time!r} timestamps all with or all without a UTC offset", column=time)]
    for column in (cfg.target_column, *cfg.feature_columns):
        if column in present:
            expectations.append(_meta(E.ExpectColumnValuesToBeNull(column=f"{h}{column}_not_numeric"),
                                      "values_numeric", f"{column!r} values numeric", column=column))
    return gx.ExpectationSuite(name=TABLE_SUITE, expectations=expectations,
                               meta={"onnxcast": {"data_uri": cfg.data_uri}})


def _grid_suite(cfg: PipelineConfig, freq: str, n_series: int):

    gx = _import_gx()
    E, share = gx.expectations, cfg.quality.max_excluded_share
    return gx.ExpectationSuite(name=GRID_SUITE, expectations=[
        _meta(E.ExpectTableRowCountToBeBetween(min_value=1), "series_present", "at least one series",
              observed="{} series"),
        _meta(E.ExpectColumnValuesToBeNull(column="off_grid_example", mostly=1 - share), "one_frequency",
              f"series on the regular {freq!r} grid, all but at most {share:.0%} (max_excluded_share)")])


def _validate(frame, suite, out_dir: Path, source: str, title: str, *, failure=None,
              result_format: str | dict = "SUMMARY") -> list[dict]:
    """Run ``suite``, write its JSON and HTML under ``out_dir``; raise the one-line
    DataQualityError when a critical check failed (``failure()``: its words, else GX's)."""

    with _quiet_gx():
        validation = run_suite(frame, suite, result_format=result_format)
        checks = [_summarize(r) for r in validation.results]
        failed = [c for c in checks if not c["passed"] and c["severity"] == "critical"]
        for c in failed:  # the verdict on top of the page says what the error says
            if c["check"] == "one_frequency" and failure is not None:
                c["message"] = failure()
        _, html = write_reports(validation, out_dir, summary_html(source, checks))
    if failed:
        raise DataQualityError(source, [c["message"] for c in failed], str(html))
    for c in checks:
        c["suite"] = title
    return checks


def _mixed_words(grid_table, series_col: str, freq: str, cfg: PipelineConfig) -> str:
    off = grid_table["off_grid_example"].notna()
    first = grid_table[off].iloc[0]
    mixed = "mixed frequencies: " if not off.all() else ""
    return (f"{mixed}{int(off.sum())} of {len(grid_table)} series ({off.mean():.1%}) are not on the regular "
            f"{freq!r} grid, more than max_excluded_share {cfg.quality.max_excluded_share:.0%} (e.g. "
            f"{quote(first[series_col])} {first['off_grid_example']}); set freq, or split the table by "
            "frequency")


def _infer_fleet_freq(codes, times, n_series: int, seed: int, source: str) -> str:
    """The mode of each series' own frequency over a seeded sample of series (design 1.5)."""
    from collections import Counter

    bounds = np.searchsorted(codes, np.arange(n_series + 1))
    sample = np.random.default_rng(seed).permutation(n_series)[:FREQ_SAMPLE]
    found = Counter()
    for i in sample:
        own = _own_freq(times[bounds[i]:bounds[i + 1]])
        if own:
            found[own] += 1
    if not found:
        raise DataError(f"{source}: cannot infer a frequency: no series has two distinct timestamps; set freq")
    return found.most_common(1)[0][0]


def _own_freq(times) -> str | None:
    import pandas as pd


    distinct = np.unique(times)
    if len(distinct) < 2:
        return None
    try:
        return infer_freq(pd.DatetimeIndex(distinct.astype("datetime64[ns]")), "", "")
    except (DataError, ValueError):
        return None


def _last_of_duplicates(codes, times) -> np.ndarray:
    """Positions of rows sorted by (series, time) that are the last of their (series, time)."""
    last = np.ones(len(codes), dtype=bool)
    if len(codes) > 1:
        last[:-1] = (codes[1:] != codes[:-1]) | (times[1:] != times[:-1])
    return np.flatnonzero(last)


def grid_positions(codes, times, freq: str) -> np.ndarray:
    """Step number of each timestamp on its series' grid (-1: off the grid), rows sorted by
    (series, time) without duplicates. The grid of a series starts at its first timestamp, as
    quality._grid_positions lays one series; vectorised for fixed steps and for anchored
    calendar frequencies (month, quarter, year starts or ends, weeks), else per series."""
    import pandas as pd


    offset = pd.tseries.frequencies.to_offset(freq)
    n = len(codes)
    position = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return position
    first = np.ones(n, dtype=bool)
    first[1:] = codes[1:] != codes[:-1]
    start_of = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    step = _fixed_step(offset)
    if step is not None:
        elapsed = times - times[start_of]
        on = elapsed % step == 0
        position[on] = elapsed[on] // step
        return position
    if offset.n == 1:
        index = pd.DatetimeIndex(times.astype("datetime64[ns]"))
        grid = pd.date_range(index.min(), index.max(), freq=offset)
        at = grid.get_indexer(index)
        at_start = at[start_of]
        on = (at >= 0) & (at_start >= 0)
        position[on] = at[on] - at_start[on]
        return position
    starts = np.flatnonzero(first)
    for a, b in zip(starts, [*starts[1:], n], strict=True):
        index = pd.DatetimeIndex(times[a:b].astype("datetime64[ns]"))
        steps = _grid_positions(index, offset)
        position[a:b] = np.where(np.isnan(steps), -1, np.nan_to_num(steps, nan=-1)).astype(np.int64)
    return position


def _fixed_step(offset) -> int | None:
    """The step in ns of a fixed-length frequency (hours, minutes, days in UTC), else None."""
    import pandas as pd

    if isinstance(offset, pd.offsets.Tick):
        return int(pd.Timedelta(offset).value)
    if offset.name.upper() == "D":  # a calendar day is not a Tick in pandas 3; UTC days are 24 h
        return int(pd.Timedelta(days=offset.n).value)
    return None


# --- step 2: the series of one shard ------------------------------------------------------

def check_fleet_shard(cfg: PipelineConfig, shard: int) -> dict:
    """Check, exclude, repair and grid the series of ``shard``; return its counts
    ``{"shard", "series", "kept", "excluded"}`` (and ``"padded"``).

    The verdict of every series comes from numpy over the series table (:class:`SeriesCheck`,
    one declaration per check); GX validates the same table with the same declarations in its
    SUMMARY format (counts and examples by id) for the report. GX's COMPLETE format, which
    named every failing series, took 286 s for 100,000 series of 3 rows (indexing each failing
    row, then deep-copying and serialising the lists); the whole verdict is series.parquet."""
    import pandas as pd


    layout, series_col = cfg.layout, id_column(cfg)
    plan = read_json(layout.shards)
    ids = plan["shards"][shard]
    season, judging = int(plan["season"]), plan["judging"]
    # passed straight on, so that series_stats drops the rows as read once it has sorted them
    stats, grid = series_stats(*_shard_arrays(layout.shard_rows(shard), ids, cfg), len(ids), plan["freq"], cfg,
                               season, judging=judging)

    table = pd.DataFrame({series_col: ids, **stats})
    table.index = table[series_col].to_numpy()  # GX names failing rows by their index: the series ids
    declared = series_checks(cfg, season, plan["freq"], judging)
    failing = {check.check: check.failing(table) for check in declared}
    because = excluded_because(declared, failing)
    table["excluded_because"] = because
    out = layout.quality_shard(shard)
    with _quiet_gx():
        validation = run_suite(table.drop(columns=["excluded_because", "start"]), _series_suite(cfg, declared),
                               result_format={"result_format": "SUMMARY", "partial_unexpected_count": 20})
        _same_counts(validation, failing, plan["source"])
        write_reports(validation, out, _shard_summary_html(plan["source"], shard, table, series_col))
    checks = [_series_check(check, failing[check.check], table) for check in declared]
    kept = pd.isna(because)
    table["padded"] = failing["padded"] & kept
    table = table.reset_index(drop=True)
    fleet = regular_fleet(grid, np.flatnonzero(kept), ids, cfg, plan)
    fleet.save(layout.shard(shard))
    _write_parquet(table, out / SERIES_TABLE)
    write_json(out / "checks.json", checks)
    result = {"shard": int(shard), "series": len(ids), "kept": int(kept.sum()), "excluded": int((~kept).sum()),
              "padded": int(table["padded"].sum())}
    log.info("shard %d: %d series, %d kept, %d excluded, %d padded", shard, result["series"],
             result["kept"], result["excluded"], result["padded"])
    return result


def _shard_arrays(path: Path, ids: list[str], cfg: PipelineConfig):
    """(codes, times in ns, values) of a shard's rows as written, in their order."""
    import pandas as pd
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pandas()
    codes = pd.Categorical(rows[id_column(cfg)], categories=ids).codes.astype(np.int32)
    times = rows[cfg.time_column].to_numpy(dtype="datetime64[ns]").astype(np.int64)
    values = np.column_stack([rows[c].to_numpy(dtype="float64") for c in (cfg.target_column, *cfg.feature_columns)])
    return codes, times, values


def series_stats(codes, times, values, n_series: int, freq: str, cfg: PipelineConfig, season: int, *,
                 judging: str = ACROSS_SERIES):
    """One row of facts per series (the columns the series suite checks), and the rows laid
    on the grid for the repair. Rows in any order; numpy segment operations throughout, no
    Python loop over series or rows (100,000 series of 117 rows: 19 s of CPU, 2 GB)."""
    n_rows = np.bincount(codes, minlength=n_series)
    # rows out of time order within their series, as they came
    back = np.zeros(len(codes), dtype=bool)
    back[1:] = (times[1:] < times[:-1]) & (codes[1:] == codes[:-1])
    unsorted = np.bincount(codes[back], minlength=n_series)
    del back

    order = series_time_order(codes, times)
    if order is not None:  # the arguments' arrays are dropped as soon as they are replaced
        codes, times, values = codes[order], times[order], values[order]
        del order
    keep = _last_of_duplicates(codes, times)
    if len(keep) < len(codes):
        codes, times, values = codes[keep], times[keep], values[keep]
    del keep
    facts = {"rows": n_rows, "duplicates": n_rows - np.bincount(codes, minlength=n_series), "unsorted": unsorted}
    position = grid_positions(codes, times, freq)
    grid_facts, before = _grid_facts(codes, values, position, n_series, cfg, judging)
    facts.update(grid_facts)
    facts.update(_value_facts(codes, values, before, n_series, cfg.quality.outlier_mad_threshold))
    del before
    on_grid = facts["off_grid"] == 0
    for name in ("train_steps", "gap_share", "missing_steps", "longest_gap", "edge_missing",
                 "distinct_before_holdout"):
        facts[name] = np.where(on_grid, facts[name], np.nan)  # a series off the grid: not judged (GX skips NaN)
    on = position >= 0
    codes, times, values, position = codes[on], times[on], values[on], position[on]
    facts["start"] = _first_times(codes, times, n_series)
    grid = {"codes": codes, "times": times, "position": position, "values": values,
            "grid_steps": facts["grid_steps"], "missing": facts["grid_steps"] - facts["filled"], "season": season}
    return {name: facts[name] for name in SERIES_FACTS}, grid


# The columns of the series table, in order (series_stats).
SERIES_FACTS = ("rows", "grid_steps", "train_steps", "duplicates", "unsorted", "off_grid", "gap_share",
                "missing_steps", "longest_gap", "missing_share", "edge_missing", "distinct_values",
                "distinct_before_holdout", "non_finite", "outlier_share", "missing_column", "start")


def _grid_facts(codes, values, position, n_series: int, cfg: PipelineConfig, judging: str):
    """The facts of the series on the fleet's grid (rows sorted by series and time, without
    duplicates; ``position`` -1 off the grid), and which rows hold a value before their
    series' holdout (split as ``judging`` splits them)."""
    off = position < 0
    off_grid = np.bincount(codes[off], minlength=n_series)
    on = ~off
    on_codes, on_pos = codes[on], position[on]
    on_rows = np.bincount(on_codes, minlength=n_series)
    last_step = np.full(n_series, -1, dtype=np.int64)
    np.maximum.at(last_step, on_codes, on_pos)
    grid_steps = np.where(on_rows > 0, last_step + 1, 0)
    valued_all = ~np.isnan(values).any(axis=1)
    valued = valued_all[on]
    v_codes, v_pos = on_codes[valued], on_pos[valued]
    filled = np.bincount(v_codes, minlength=n_series)
    first_filled = np.full(n_series, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_filled, v_codes, v_pos)
    last_filled = np.full(n_series, -1, dtype=np.int64)
    np.maximum.at(last_filled, v_codes, v_pos)
    gap = np.zeros(len(v_codes), dtype=np.int64)
    if len(v_codes) > 1:
        gap[1:] = np.where(v_codes[1:] == v_codes[:-1], v_pos[1:] - v_pos[:-1] - 1, 0)
    longest_gap = np.zeros(n_series, dtype=np.int64)
    np.maximum.at(longest_gap, v_codes, gap)
    holdout, validation = _held_out(grid_steps, cfg, judging)
    # A series flat before its holdout (a new meter at 0, then 5000) has no in-sample naive error
    # to scale its MASE by: its MASE would be in raw units (100 for a 2% error), enough to move
    # the fleet's mean and so the gates, and its training weight would own the loss.
    before = valued_all & on & (position < (grid_steps - holdout)[codes])
    return {"grid_steps": grid_steps, "train_steps": grid_steps - holdout - validation, "off_grid": off_grid,
            "gap_share": (grid_steps - on_rows) / np.maximum(grid_steps, 1), "missing_steps": grid_steps - filled,
            "filled": filled, "longest_gap": longest_gap,
            # grid points before the first or after the last value cannot be interpolated
            "edge_missing": np.where(filled > 0, first_filled + (grid_steps - 1 - last_filled), grid_steps)}, before


def _held_out(grid_steps, cfg: PipelineConfig, judging: str):
    """(holdout, validation) steps of each series, as ``split_fleet`` will split them."""
    if judging == ACROSS_SERIES:
        return fleet_steps(cfg)
    steps = np.array([proportional_steps(int(n), cfg) for n in grid_steps], dtype=np.int64).reshape(-1, 2)
    return steps[:, 0], steps[:, 1]


def _value_facts(codes, values, before, n_series: int, threshold: float) -> dict:
    """The facts of the values, whatever the grid: empty, non-finite, distinct (over the whole
    series and over the rows ``before`` its holdout), outliers (the series' own range)."""
    distinct_rows = np.maximum(np.bincount(codes, minlength=n_series), 1)
    empty = np.isnan(values).any(axis=1)
    f32 = np.finfo(np.float32).max
    in_range = np.isfinite(values).all(axis=1) & (np.abs(values) <= f32).all(axis=1)
    target = values[:, 0]
    finite = np.isfinite(target) & (np.abs(target) <= f32)
    distinct, outliers, distinct_before = _distinct_and_outliers(codes[finite], target[finite], n_series, threshold,
                                                                 subset=before[finite])
    # the share of empty values of each value column; the series' worst column is named
    per_column = np.stack([np.bincount(codes[np.isnan(values[:, j])], minlength=n_series)
                           for j in range(values.shape[1])], axis=1) / distinct_rows[:, None]
    return {"missing_share": per_column.max(axis=1), "missing_column": per_column.argmax(axis=1),
            "non_finite": np.bincount(codes[~empty & ~in_range], minlength=n_series),
            "distinct_values": distinct, "distinct_before_holdout": distinct_before,
            "outlier_share": outliers / np.maximum(np.bincount(codes[finite], minlength=n_series), 1)}


def _distinct_and_outliers(codes, target, n_series: int, threshold: float, *, subset=None):
    """Distinct values per series, values outside the series' own robust range
    (quality.robust_range: median ± threshold x sigma, sigma from the MAD, else the mean
    absolute deviation; none when both are 0), and distinct values among the rows ``subset``
    (the same sort: a subset of rows sorted by value stays sorted). ``codes`` sorted."""

    order = sort_within_series(codes, target)
    c, v = codes[order], target[order]
    distinct = _distinct_sorted(c, v, n_series)
    distinct_subset = None if subset is None else _distinct_sorted(c[subset[order]], v[subset[order]], n_series)
    del order
    counts = np.bincount(c, minlength=n_series)
    median = _segment_median(c, v, counts, n_series)
    deviation = np.abs(v - median[c])
    mad = _segment_median(c, deviation[sort_within_series(c, deviation)], counts, n_series)
    mean_ad = np.bincount(c, weights=deviation, minlength=n_series) / np.maximum(counts, 1)
    sigma = np.where(mad > 0, ROBUST_SCALE_MAD * mad, ROBUST_SCALE_MEAN_AD * mean_ad)
    limit = threshold * sigma
    outside = (sigma[c] > 0) & (deviation > limit[c])
    return distinct, np.bincount(c[outside], minlength=n_series), distinct_subset


def _distinct_sorted(codes, values, n_series: int) -> np.ndarray:
    """Distinct values per series, rows sorted by series then value."""
    change = np.ones(len(codes), dtype=bool)
    change[1:] = (codes[1:] != codes[:-1]) | (values[1:] != values[:-1])
    return np.bincount(codes[change], minlength=n_series)


def series_time_order(codes, times) -> np.ndarray | None:
    """The order that sorts rows by (series, time), ties in their order; None when they already
    are. Rows usually come grouped by series and in time order within it: a stable sort of the
    codes alone (runs: nearly free) then does it, checked; np.lexsort is the fallback (5 s of
    CPU on 11.7 M rows, and it ran five times per shard)."""
    if len(codes) < 2:
        return None
    same = codes[1:] == codes[:-1]
    if (codes[1:] >= codes[:-1]).all() and not ((times[1:] < times[:-1]) & same).any():
        return None
    order = np.argsort(codes, kind="stable")
    sorted_times, sorted_codes = times[order], codes[order]
    if not ((sorted_times[1:] < sorted_times[:-1]) & (sorted_codes[1:] == sorted_codes[:-1])).any():
        return order
    return np.lexsort((times, codes))


def sort_within_series(codes, values) -> np.ndarray:
    """The order that sorts ``values`` within each run of equal ``codes`` (sorted): the values'
    ranks under an int64 key ``code x n + rank``, one sort of each (2 s of CPU on 11.7 M rows
    where np.lexsort took 5)."""
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if int(codes[-1]) + 1 > (2**62) // n:  # the key would overflow: the general sort
        return np.lexsort((values, codes))
    key = np.empty(n, dtype=np.int64)
    key[np.argsort(values, kind="stable")] = np.arange(n, dtype=np.int64)
    key += codes.astype(np.int64) * n
    return np.argsort(key)  # unique keys: any sort is stable


def _segment_median(codes, sorted_values, counts, n_series: int) -> np.ndarray:
    """Median of each series' values, ``sorted_values`` sorted within each series."""
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    median = np.full(n_series, np.nan)
    has = counts > 0
    lo = start[has] + (counts[has] - 1) // 2
    hi = start[has] + counts[has] // 2
    median[has] = (sorted_values[lo] + sorted_values[hi]) / 2
    return median


def _first_times(codes, times, n_series: int):
    """The first timestamp of each series (UTC), NaT for a series without one."""
    import pandas as pd

    first = np.full(n_series, np.datetime64("NaT"), dtype="datetime64[ns]")
    if len(codes):
        starts = np.flatnonzero(np.concatenate([[True], codes[1:] != codes[:-1]]))
        first[codes[starts]] = times[starts].astype("datetime64[ns]")
    return pd.DatetimeIndex(first).tz_localize("UTC")


@dataclass(frozen=True)
class SeriesCheck:
    """One check of the series table: ``column`` within [``min_value``, ``max_value``] (either
    may be None; a NaN fact is not judged, as GX skips nulls). ``critical`` excludes the
    series; ``warning`` keeps and counts it. Declared once, read by numpy (the verdicts) and by
    GX (the report)."""

    check: str
    column: str
    description: str
    severity: str = "critical"
    min_value: float | None = None
    max_value: float | None = None
    observed: str = "{}"  # one series' fact in words, e.g. "{} rows"
    named_by: str | None = None  # a fact column indexing ``names``: the value column the fact is about
    names: tuple[str, ...] = ()

    def failing(self, table) -> np.ndarray:
        """Which rows of the series table fail the check: one vectorised comparison."""
        values = table[self.column].to_numpy(dtype="float64")
        judged = ~np.isnan(values)
        bad = np.zeros(len(values), dtype=bool)
        if self.min_value is not None:
            bad |= judged & (values < self.min_value)
        if self.max_value is not None:
            bad |= judged & (values > self.max_value)
        return bad

    def threshold(self) -> dict:
        return {k: v for k, v in (("min_value", self.min_value), ("max_value", self.max_value)) if v is not None}


def series_checks(cfg: PipelineConfig, season: int, freq: str, judging: str = ACROSS_SERIES) -> list[SeriesCheck]:
    """The series checks, in report order (SERIES_CHECKS orders the reasons of an exclusion).
    How long a series must be follows how the run is judged (``judging``: the split of
    ``split_fleet``): over origins, one series' proportional split; across series, fixed steps."""
    q, time, target = cfg.quality, repr(cfg.time_column), repr(cfg.target_column)
    if judging == ACROSS_SERIES:
        holdout, validation = fleet_steps(cfg)
        need_train = min_train_steps(cfg, season)
        need_rows = holdout + validation + need_train
        rows_for = (f"at least {need_rows} rows (holdout {holdout} + validation {validation} + min_train_steps "
                    f"{need_train})")
        train_for = f"at least {need_train} training steps (min_train_steps)"
    else:
        need_rows, need_train = min_rows_over_origins(cfg), train_steps_over_origins(cfg)
        rows_for = f"at least {need_rows} rows for lookback {cfg.lookback}, horizon {cfg.horizon}, validation and holdout"
        train_for = f"at least {need_train} training steps (lookback + 2 horizons)"
    dup = "warning" if q.drop_duplicate_timestamps else "critical"
    fill = q.fill_gaps_max_steps
    values = ", ".join(map(repr, (cfg.target_column, *cfg.feature_columns)))
    return [
        SeriesCheck("too_short", "rows", rows_for, min_value=need_rows, observed="{} rows"),
        SeriesCheck("train_too_short", "train_steps", train_for, min_value=need_train, observed="{} training steps"),
        SeriesCheck("duplicated_times", "duplicates", f"{time} timestamps unique"
                    + ("; the last row of each is kept (drop_duplicate_timestamps)" if dup == "warning" else
                       "; set drop_duplicate_timestamps to keep the last row of each"),
                    severity=dup, max_value=0, observed="{} repeated row(s)"),
        SeriesCheck("not_increasing", "unsorted", f"{time} timestamps in increasing order (sorted by the gate)",
                    severity="warning", max_value=0, observed="{} row(s) out of order"),
        SeriesCheck("off_grid", "off_grid", f"{time} timestamps on the regular {freq!r} grid", max_value=0,
                    observed="{} off the grid"),
        SeriesCheck("gap_share", "gap_share", f"missing timestamps at most {q.max_gap_fraction:.2%} of the grid "
                    "(max_gap_fraction)", max_value=q.max_gap_fraction, observed="{:.2%} missing"),
        SeriesCheck("gaps_repairable", "longest_gap", f"gaps (missing timestamps or empty values) at most {fill} "
                    "steps long (fill_gaps_max_steps)", max_value=fill, observed="longest {} steps"),
        SeriesCheck("mostly_missing", "missing_share", f"{values} empty values at most {q.max_missing_fraction:.2%} "
                    "(max_missing_fraction)", max_value=q.max_missing_fraction, observed="empty in {:.2%} of rows",
                    named_by="missing_column", names=(cfg.target_column, *cfg.feature_columns)),
        SeriesCheck("edges_present", "edge_missing", "values present at the first and last timestamp (ends cannot "
                    "be interpolated)", max_value=0, observed="{} step(s) missing at the ends"),
        SeriesCheck("constant", "distinct_values", f"{target} not constant", min_value=2,
                    observed="{} distinct value(s)"),
        SeriesCheck("flat_before_holdout", "distinct_before_holdout", f"{target} not constant before the holdout "
                    "(its MASE has no in-sample scale otherwise)", min_value=2, observed="{} distinct value(s)"),
        SeriesCheck("non_finite", "non_finite", f"values finite and within float32 range (|x| <= {FLOAT32_MAX:.4g})",
                    max_value=0, observed="{} row(s) not"),
        SeriesCheck("outlier_share", "outlier_share", f"{target} outliers (robust z > {q.outlier_mad_threshold:g}, "
                    f"the series' own) at most {q.max_outlier_fraction:.2%} (max_outlier_fraction); kept as they are",
                    severity="warning", max_value=q.max_outlier_fraction, observed="{:.2%} of values"),
        SeriesCheck("no_outliers", "outlier_share", f"{target} has no outliers (robust z > "
                    f"{q.outlier_mad_threshold:g}, the series' own); kept as they are", severity="warning", max_value=0,
                    observed="{:.2%} of values"),
        SeriesCheck("padded", "train_steps", f"at least lookback {cfg.lookback} + horizon {cfg.horizon} training "
                    "steps (shorter histories are padded)", severity="warning", min_value=cfg.lookback + cfg.horizon,
                    observed="{} training steps"),
    ]


def _series_suite(cfg: PipelineConfig, declared: list[SeriesCheck]):
    """The GX suite of the declared series checks, on the series table."""

    gx = import_gx()
    between = gx.expectations.ExpectColumnValuesToBeBetween
    expectations = [named_check(between(column=c.column, severity=c.severity, **c.threshold()),
                                c.check, c.description, column=c.column) for c in declared]
    return gx.ExpectationSuite(name=SERIES_SUITE, expectations=expectations,
                               meta={"onnxcast": {"data_uri": cfg.data_uri, "quality": vars(cfg.quality)}})


def _same_counts(validation, failing: dict[str, np.ndarray], source: str) -> None:
    """GX's count of failing series per check is numpy's, or the report would say otherwise
    than the verdict."""
    for result in validation.results:
        check = result.expectation_config.meta["check"]
        counted = int((result.result or {}).get("unexpected_count") or 0)
        if counted != int(failing[check].sum()):
            raise DataError(f"{source}: the series check {check!r} failed {int(failing[check].sum())} series by "
                            f"numpy and {counted} by Great Expectations; please report this with the file")


def _series_check(check: SeriesCheck, failing: np.ndarray, table) -> dict:
    """One series check as plain JSON (expectations.summarize's keys): how many series failed
    it, the first few by id with their fact in words (``examples``)."""
    at = np.flatnonzero(failing)[:5]
    named = [str(table.index[i]) for i in at]
    facts = table[check.column].to_numpy()
    words = [check.observed.format(_plain(facts[i])) for i in at]
    if check.named_by:
        words = [f"{quote(check.names[int(k)])} {w}" for k, w in zip(table[check.named_by].to_numpy()[at], words,
                                                                      strict=True)]
    examples = [[quote(sid), w] for sid, w in zip(named, words, strict=True)]
    return {"check": check.check, "column": check.column, "description": check.description,
            "expectation": "expect_column_values_to_be_between", "severity": check.severity,
            "passed": not len(at), "observed": {"unexpected_count": int(failing.sum()), "series": named},
            "threshold": check.threshold(), "examples": examples,
            "message": check_message(check.description, int(failing.sum()), examples)}


def check_message(description: str, count: int, examples: list[list[str]]) -> str | None:
    """A failed series check in one line: one series' fact (``"...: 50 rows (series 'y')"``),
    or how many series and the first three; ``examples``: [quoted id, fact in words]."""
    if not count:
        return None
    if count == 1:
        return f"{description}: {examples[0][1]} (series {examples[0][0]})"
    return f"{description}: {count} series, e.g. {', '.join(f'{sid} ({fact})' for sid, fact in examples[:3])}"


def excluded_because(declared: list[SeriesCheck], failing: dict[str, np.ndarray]) -> np.ndarray:
    """Per series, the comma-joined CRITICAL checks it failed in SERIES_CHECKS order, or None
    when kept (a warning, such as duplicated_times with drop_duplicate_timestamps, keeps it).
    Vectorised: one bit per check, one label per distinct combination."""
    critical = {c.check for c in declared if c.severity == "critical"}
    order = [name for name in SERIES_CHECKS if name in critical and name in failing]
    n = len(next(iter(failing.values()))) if failing else 0
    bits = np.zeros(n, dtype=np.int64)
    for i, name in enumerate(order):
        bits |= failing[name].astype(np.int64) << i
    combos, inverse = np.unique(bits, return_inverse=True)
    labels = np.array([",".join(name for i, name in enumerate(order) if combo >> i & 1) or None
                       for combo in combos.tolist()], dtype=object)
    return labels[inverse.reshape(-1)] if n else np.array([], dtype=object)


def _shard_summary_html(source: str, shard: int, table, series_col: str) -> str:
    from html import escape

    excluded = table[table["excluded_because"].notna()]
    items = "".join(f"<li><code>{escape(str(r[series_col]))}</code>: {escape(r['excluded_because'])}</li>"
                    for _, r in excluded.head(200).iterrows())
    return (f'<section id="onnxcast-summary" class="{"failed" if len(excluded) else "passed"}">'
            f"<h1>onnxcast fleet data quality, shard {shard}: {len(table) - len(excluded)} of {len(table)} series "
            f"kept</h1><p>File: <code>{escape(source)}</code></p>"
            + (f"<h2>Excluded series</h2><ol>{items}</ol>" if items else "")
            + "<p>A failed check of severity <em>critical</em> excludes the series, it does not fail the run; "
              "the table below lists every failing series by id.</p></section>")


def regular_fleet(grid: dict, kept, ids, cfg: PipelineConfig, plan: dict) -> FleetData:
    """The kept series on the grid: the last row of duplicates, one row per grid step, short
    gaps interpolated in time as quality's single-series repair does (data._fill_short_gaps)."""
    import pandas as pd


    steps = grid["grid_steps"][kept].astype(np.int64)
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(steps, out=offsets[1:])
    n_features = grid["values"].shape[1]
    out = np.full((int(offsets[-1]), n_features), np.nan, dtype=np.float64)
    slot = np.full(len(ids), -1, dtype=np.int64)
    slot[kept] = np.arange(len(kept))
    rows = slot[grid["codes"]] >= 0
    at = offsets[slot[grid["codes"][rows]]] + grid["position"][rows]
    out[at] = grid["values"][rows]
    starts = np.zeros(len(kept), dtype=np.int64)
    first = np.ones(len(grid["codes"]), dtype=bool)
    first[1:] = grid["codes"][1:] != grid["codes"][:-1]
    first_time = np.full(len(ids), 0, dtype=np.int64)
    first_time[grid["codes"][first]] = grid["times"][first]
    starts[:] = first_time[kept]
    freq = plan["freq"]
    for j in np.flatnonzero(grid["missing"][kept] > 0):  # the few series with gaps: the single-series repair
        index = pd.date_range(pd.Timestamp(int(starts[j]), unit="ns", tz="UTC"), periods=int(steps[j]), freq=freq)
        part = pd.DataFrame(out[offsets[j]:offsets[j + 1]], index=index)
        out[offsets[j]:offsets[j + 1]] = _fill_short_gaps(part, cfg.quality.fill_gaps_max_steps).to_numpy()
    values = out.astype(np.float32)
    if not np.isfinite(values).all():  # the series checks promise this never happens
        bad = int(np.searchsorted(offsets, int(np.flatnonzero(~np.isfinite(values).all(axis=1))[0]), "right") - 1)
        raise DataError(f"{plan['source']}: series {quote(ids[kept[bad]])} has no finite value at a grid step after "
                        "the data checks passed; please report this with the file")
    return FleetData(values=values, offsets=offsets, starts=starts, ids=tuple(ids[i] for i in kept),
                     columns=(cfg.target_column, *cfg.feature_columns), freq=freq, season=int(plan["season"]),
                     source=plan["source"], sha256=plan["sha256"])


def _write_parquet(table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    table.to_parquet(tmp, index=False)
    tmp.replace(path)


# --- step 3: the merge --------------------------------------------------------------------

def merge_fleet_checks(cfg: PipelineConfig, *, judging: str | None = None) -> dict:
    """Merge the shards' verdicts; return the summary written to ``data/dataset.json``
    (``{"dataset": ..., "split": ..., "quality": ...}``, as prepare_data returns). ``judging``:
    as :func:`onnxcast.pipeline.fleet_data.split_fleet`."""
    import pandas as pd

    layout, series_col, q = cfg.layout, id_column(cfg), cfg.quality
    plan = read_json(layout.shards)
    shards = range(int(plan["n_shards"]))
    table = pd.concat([pd.read_parquet(layout.quality_shard(k) / SERIES_TABLE) for k in shards],
                      ignore_index=True).sort_values(series_col, kind="stable").reset_index(drop=True)
    _write_parquet(table, layout.series_table)
    total = len(table)
    excluded = table[table["excluded_because"].notna()]
    padded = table[table["padded"]]
    share = len(excluded) / total if total else 1.0
    counts = _reason_counts(excluded)
    html = layout.quality / SUMMARY_HTML
    share_check = _excluded_share_check(cfg, table, plan["source"])
    series_checks = _merged_series_checks(layout, plan)
    failures = []
    if not share_check["passed"]:  # every failed check that excluded a series, then the share
        examples = ", ".join(f"{quote(sid)} ({why})" for sid, why in
                             zip(excluded[series_col].head(3), excluded["excluded_because"].head(3), strict=True))
        failures = [c["message"] for c in series_checks if c["message"] and c["severity"] == "critical"]
        failures.append(f"{len(excluded)} of {total} series ({share:.1%}) were excluded, more than max_excluded_share "
                        f"{q.max_excluded_share:.0%}: " + ", ".join(f"{k} {v}" for k, v in counts.items())
                        + f" (e.g. {examples}); see {SUMMARY_HTML}")
    write_text_atomic(html, _summary_page(plan, table, excluded, padded, _reason_counts(excluded, first_only=False),
                                          cfg, failures))
    if failures:
        raise DataQualityError(plan["source"], failures, str(html))
    fleet = FleetData.concat([FleetData.load(layout.shard(k)) for k in shards])
    fleet.save(layout.fleet)
    judging = judging or judging_for(fleet.n_series)
    split = split_fleet(fleet.lengths, cfg, judging=judging)
    dated = dated_split(split, fleet.timestamps(0)) if judging == OVER_ORIGINS else _split_dict(split, fleet)
    summary = {"dataset": _dataset(cfg, plan, fleet), "split": dated,
               "quality": _quality_dict(cfg, plan, table, excluded, padded, share, counts, str(html))}
    summary["quality"]["checks"] += series_checks
    summary["quality"]["warnings"] += _series_warnings(series_checks, summary["quality"]["repairs"])
    summary["quality"]["checks"].append(share_check)
    cfg.save(layout.config)
    write_json(layout.dataset, summary)
    log.info("data gate: %d of %d series kept (%d excluded, %d padded), %d rows, freq %s", fleet.n_series, total,
             len(excluded), len(padded), len(fleet.values), fleet.freq)
    return summary


def _excluded_share_check(cfg: PipelineConfig, table, source: str) -> dict:
    """The max_excluded_share verdict as a GX result of its own (``quality/excluded_share/``),
    on the series table's ``excluded_because`` column."""

    gx = _import_gx()
    share = cfg.quality.max_excluded_share
    suite = gx.ExpectationSuite(name=SHARE_SUITE, expectations=[_meta(
        gx.expectations.ExpectColumnValuesToBeNull(column="excluded_because", mostly=1 - share),
        "excluded_share", f"series excluded at most {share:.0%} (max_excluded_share)")])
    with _quiet_gx():
        validation = run_suite(table[[id_column(cfg), "excluded_because"]], suite)
        check = _summarize(validation.results[0])
        write_reports(validation, cfg.layout.quality / "excluded_share", "")
    check["suite"] = SHARE_SUITE
    return check


def _series_warnings(checks: list[dict], repairs: dict) -> list[str]:
    """What the kept series were let through with: outliers (kept as they are), and the steps
    interpolated."""
    warnings = [c["message"] for c in checks if c["check"] in ("outlier_share", "no_outliers") and c["message"]]
    fill = repairs.get("fill_gaps") or {}
    if fill.get("interpolated_steps"):
        warnings.append(f"{fill['interpolated_steps']} missing step(s) interpolated (fill_gaps_max_steps="
                        f"{fill['max_steps']})")
    return warnings


def _merged_series_checks(layout, plan: dict) -> list[dict]:
    """Every series check over all shards: how many series failed it, the first examples."""
    shard_checks = [read_json(layout.quality_shard(k) / "checks.json") for k in range(int(plan["n_shards"]))]
    merged = []
    for position, first in enumerate(shard_checks[0]):
        entries = [s[position] for s in shard_checks]
        failed = sum(int((e["observed"] or {}).get("unexpected_count", 0)) for e in entries)
        examples = [x for e in entries for x in e.get("examples", [])][:3]
        merged.append({"check": first["check"], "column": first["column"], "description": first["description"],
                       "expectation": first["expectation"], "severity": first["severity"],
                       "passed": failed == 0, "observed": {"series": failed}, "threshold": first["threshold"],
                       "message": check_message(first["description"], failed, examples), "suite": SERIES_SUITE})
    return merged


def _reason_counts(excluded, *, first_only: bool = True) -> dict[str, int]:
    """Excluded series per reason, most first; ``first_only``: each series counted once, by
    its first reason in report order (the counts then add up to the excluded total)."""
    counts = dict.fromkeys(SERIES_CHECKS, 0)
    for label, count in excluded["excluded_because"].value_counts().items():  # a few distinct combinations
        for check in str(label).split(",")[: 1 if first_only else None]:
            counts[check] += int(count)
    return {k: v for k, v in sorted(counts.items(), key=lambda kv: -kv[1]) if v}


def _dataset(cfg: PipelineConfig, plan: dict, fleet: FleetData) -> dict:
    ends = _step_times(fleet, fleet.lengths - 1)
    return {"uri": cfg.data_uri, "sha256": plan["sha256"], "rows": int(len(fleet.values)),
            "start": _iso(fleet.starts.min()), "end": _iso(ends.max()), "freq": fleet.freq, "season": fleet.season,
            "target": cfg.target_column, "features": list(cfg.feature_columns), "series_column": cfg.series_column,
            "n_series": fleet.n_series}


def _split_dict(split, fleet: FleetData) -> dict:
    out = split.as_dict()
    out.update({"train_end": _iso(_step_times(fleet, split.train_end - 1).max()),
                "validation_end": _iso(_step_times(fleet, split.validation_end - 1).max()),
                "holdout_start": _iso(_step_times(fleet, split.validation_end).min()),
                "holdout_end": _iso(_step_times(fleet, split.lengths - 1).max())})
    return out


def _step_times(fleet: FleetData, steps) -> np.ndarray:
    """The timestamp (ns) of step ``steps[i]`` of every series ``i``."""
    import pandas as pd

    offset = pd.tseries.frequencies.to_offset(fleet.freq)
    steps = np.asarray(steps, dtype=np.int64)
    fixed = _fixed_step(offset)
    if fixed is not None:
        return fleet.starts + steps * fixed
    if offset.n == 1:
        first = pd.Timestamp(int(fleet.starts.min()), unit="ns")
        span = pd.date_range(first, pd.Timestamp(int(fleet.starts.max()), unit="ns"), freq=offset)
        grid = pd.date_range(first, periods=len(span) + int(steps.max()) + 1, freq=offset)
        at = grid.get_indexer(pd.DatetimeIndex(fleet.starts.astype("datetime64[ns]")))
        return grid.as_unit("ns").asi8[at + steps]
    return np.array([(pd.Timestamp(int(s), unit="ns") + int(k) * offset).value for s, k in
                     zip(fleet.starts, steps, strict=True)], dtype=np.int64)


def _quality_dict(cfg: PipelineConfig, plan: dict, table, excluded, padded, share: float,
                  counts: dict, html: str) -> dict:
    """``passed``, ``suite``, ``warnings``, ``repairs``, ``checks`` (the table's; the merge adds
    the series checks), the report paths, and the series verdicts."""
    series_col, q = id_column(cfg), cfg.quality
    layout = cfg.layout
    checks = list(plan["table_checks"])
    warnings = [c["message"] for c in checks if not c["passed"]]
    repeated = table[table["excluded_because"].isna() & (table["duplicates"] > 0)]  # drop_duplicate_timestamps
    if len(repeated):
        warnings.append(f"{len(repeated)} series repeat timestamps: the last row of each was kept "
                        f"(drop_duplicate_timestamps), {int(repeated['duplicates'].sum())} rows dropped")
    if len(padded):
        warnings.append(f"{len(padded)} series have fewer than lookback {cfg.lookback} + horizon {cfg.horizon} "
                        f"training steps and are padded (e.g. {', '.join(map(quote, padded[series_col].head(3)))})")
    if len(excluded):
        warnings.append(f"{len(excluded)} of {len(table)} series ({share:.1%}) excluded: "
                        + ", ".join(f"{k} {v}" for k, v in counts.items()))
    skipped = plan.get("skipped_entries") or {"count": 0, "entries": []}
    if skipped["count"]:
        shown = ", ".join(f"{e['entry']} ({e['why']})" for e in skipped["entries"][:3])
        warnings.append(f"{skipped['count']} entries of the data folder were skipped, not read: {shown}"
                        + (" ..." if skipped["count"] > 3 else ""))
    unsorted = int((table["unsorted"] > 0).sum())
    if unsorted:
        warnings.append(f"{unsorted} series had rows out of time order (not_increasing); sorted")
    kept = table[table["excluded_because"].isna()]
    repairs = {}
    if q.fill_gaps_max_steps:
        repairs["fill_gaps"] = {"max_steps": q.fill_gaps_max_steps,
                                "interpolated_steps": int(kept["missing_steps"].sum())}
    if q.drop_duplicate_timestamps:
        repairs["drop_duplicate_timestamps"] = {"dropped_rows": int(kept["duplicates"].sum())}
    detail_columns = {"too_short": "rows", "train_too_short": "train_steps", "duplicated_times": "duplicates",
                      "off_grid": "off_grid", "gap_share": "gap_share", "gaps_repairable": "longest_gap",
                      "mostly_missing": "missing_share", "edges_present": "edge_missing",
                      "constant": "distinct_values", "flat_before_holdout": "distinct_before_holdout",
                      "non_finite": "non_finite", "outlier_share": "outlier_share"}
    excluded_list = []
    for row in excluded[[series_col, "excluded_because", *sorted(set(detail_columns.values()))]].to_dict("records"):
        because = row["excluded_because"].split(",")
        excluded_list.append({"series": str(row[series_col]), "because": because,
                              "details": {c: _plain(row[detail_columns[c]]) for c in because}})
    return {"passed": True, "suite": SERIES_SUITE, "warnings": warnings, "repairs": repairs, "checks": checks,
            "json_path": str(layout.quality / "validation_result.json"), "html_path": html,
            "series": {"total": len(table), "kept": len(kept), "excluded": len(excluded), "padded": len(padded),
                       "excluded_share": share, "max_excluded_share": q.max_excluded_share},
            "excluded": excluded_list, "padded": [str(s) for s in padded[series_col]], "skipped_entries": skipped}


def _summary_page(plan: dict, table, excluded, padded, counts: dict, cfg: PipelineConfig,
                  failures: list[str]) -> str:
    """The fleet's verdict: counts, the first EXAMPLES excluded series per reason, the shards' GX pages."""
    from html import escape


    series_col = id_column(cfg)
    share = len(excluded) / max(len(table), 1)
    failed = share > cfg.quality.max_excluded_share
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>onnxcast fleet data quality</title>"
             f"<style>{OFFLINE_CSS}</style></head><body>",
             f'<section id="onnxcast-summary" class="{"failed" if failed else "passed"}">',
             f"<h1>onnxcast fleet data quality: {'FAILED' if failed else 'PASSED'}</h1>",
             f"<p>Data: <code>{escape(plan['source'])}</code> (sha256 <code>{plan['sha256'][:16]}</code>), "
             f"frequency <code>{escape(plan['freq'])}</code>, season {plan['season']}</p>",
             f"<p>{len(table)} series: {len(table) - len(excluded)} kept, {len(excluded)} excluded "
             f"({share:.1%}; at most {cfg.quality.max_excluded_share:.0%} may be: max_excluded_share), "
             f"{len(padded)} padded (shorter than lookback + horizon of training)</p>",
             "".join(f"<p class='failure'>{escape(f)}</p>" for f in failures), "</section>"]
    labels = excluded["excluded_because"].astype(str)
    for reason, count in counts.items():
        having = [label for label in labels.unique() if reason in label.split(",")]
        hit = excluded.loc[labels.isin(having).to_numpy(), series_col].head(EXAMPLES)
        names = ", ".join(f"<code>{escape(str(s))}</code>" for s in hit)
        more = f" and {count - EXAMPLES} more" if count > EXAMPLES else ""
        parts.append(f"<h2>{escape(reason)}: {count} series</h2><p>{names}{more}</p>")
    if len(padded):
        names = ", ".join(f"<code>{escape(str(s))}</code>" for s in padded[series_col].head(EXAMPLES))
        parts.append(f"<h2>padded (kept): {len(padded)} series</h2><p>{names}</p>")
    skipped = plan.get("skipped_entries") or {"count": 0, "entries": []}
    if skipped["count"]:
        items = "".join(f"<li><code>{escape(e['entry'])}</code>: {escape(e['why'])}</li>" for e in skipped["entries"])
        more = f"<p>and {skipped['count'] - len(skipped['entries'])} more</p>" \
            if skipped["count"] > len(skipped["entries"]) else ""
        parts.append(f"<h2>Skipped entries of the data folder: {skipped['count']}</h2><ul>{items}</ul>{more}")
    links = "".join(f'<li><a href="shards/{k:03d}/{REPORT_HTML}">shard {k}</a>: {len(ids)} series</li>'
                    for k, ids in enumerate(plan["shards"]))
    parts.append(f"<h2>Per-shard checks (Great Expectations)</h2><ul>{links}</ul>"
                 f'<p>The table checks: <a href="{REPORT_HTML}">{REPORT_HTML}</a>. Every series with its '
                 f"facts: <code>series.parquet</code>.</p></body></html>")
    return "".join(parts)


def _plain(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return int(value) if value.is_integer() else round(value, 6) if math.isfinite(value) else str(value)
    return value


def _iso(ns) -> str:

    return utc_iso(np.datetime64(int(ns), "ns"))

