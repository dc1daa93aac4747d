"""Data-quality gate: a Great Expectations suite built from the run's settings.

``check_data`` reads the table (onnxcast.pipeline.reading), adds helper columns (parsed timestamps,
steps on the frequency grid, numeric values), validates the whole frame against a suite
built in code (ephemeral GX context, pandas data source, one whole-dataframe batch), writes
the GX validation result (JSON) and its data-docs page (HTML), and then either raises one
DataQualityError naming the file and every failed check, or returns the regular series with
warnings for tolerated issues and the repairs that were asked for. See docs/data-quality.md.

Helper columns start with ``_qc_``; a helper holds the offending raw value of a row and is
empty elsewhere, so GX reports the bad values and their rows.

great_expectations and pandas are imported inside functions: Airflow operators import this
module when a DAG file is parsed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxcast.base.errors import ConfigError, DataError, DataQualityError
from onnxcast.base.s3 import S3Settings
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.data import infer_freq, series_from_checked
from onnxcast.pipeline.expectations import (
    HELPER,
    HIDDEN,
    clip,
    import_gx,
    named_check,
    quiet_gx,
    run_suite,
    summarize,
    summary_html,
    write_reports,
)
from onnxcast.pipeline.fleet_data import FleetData, split_fleet
from onnxcast.pipeline.reading import plausible_column_name, read_table
from onnxcast.pipeline.seasons import season_for_freq

SUITE_NAME = "onnxcast-data-quality"
FLOAT32_MAX = 3.4028234663852886e38
ROBUST_SCALE_MAD = 1.4826  # MAD -> standard deviation for normal data
ROBUST_SCALE_MEAN_AD = 1.2533  # mean absolute deviation -> standard deviation, when MAD is 0


@dataclass
class QualityResult:
    """What the gate found. ``series`` is the regular series the pipeline trains on (a fleet of one)."""

    series: FleetData
    warnings: list[str] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    repairs: dict = field(default_factory=dict)
    json_path: str | None = None
    html_path: str | None = None

    def to_dict(self) -> dict:
        return {"passed": True, "suite": SUITE_NAME, "warnings": self.warnings,
                "repairs": self.repairs, "checks": self.checks,
                "json_path": self.json_path, "html_path": self.html_path}


def check_data(cfg: PipelineConfig, out_dir: str | Path, *, s3_settings: S3Settings | None = None) -> QualityResult:
    """Read and check ``cfg.data_uri`` (``s3_settings`` for an ``s3://`` URI); return the
    regular series or raise.

    Raises DataError when the file cannot be read as a table (no report is written), and
    DataQualityError listing every failed check after writing the JSON and HTML reports
    under ``out_dir``.
    """
    raw = read_table(cfg.data_uri, s3_settings=s3_settings)
    prepared = prepare_frame(hide_unnamed_columns(raw.frame, cfg), cfg, raw.source)
    suite = build_suite(cfg, prepared)
    with quiet_gx():
        validation = run_suite(prepared.frame, suite)
        checks = [summarize(r) for r in validation.results]
        json_path, html_path = write_reports(validation, Path(out_dir), summary_html(raw.source, checks))
    failures = [c["message"] for c in checks if not c["passed"] and c["severity"] == "critical"]
    if failures:
        raise DataQualityError(raw.source, failures, str(html_path))
    series = checked_series(prepared, cfg, raw.source, raw.sha256)
    warnings = [c["message"] for c in checks if not c["passed"]]
    return QualityResult(series=series, warnings=warnings, checks=checks,
                         repairs=_repairs(cfg, prepared), json_path=str(json_path),
                         html_path=str(html_path))


def hide_unnamed_columns(frame, cfg: PipelineConfig):
    """``frame`` with every header field that may not be shown renamed ``<field N>``.

    The column list goes into the missing-columns message, the GX HTML page and
    validation_result.json: a first line of data, a lone field that is no column the settings
    name (a token file passed by mistake), or any field unlike a column name must reach none
    of them. The columns the settings name are the user's own words and stay."""
    names = [str(c) for c in frame.columns]
    wanted = {cfg.time_column, cfg.target_column, *cfg.feature_columns, cfg.series_column}
    shown = [n in wanted or (len(names) > 1 and plausible_column_name(n)) for n in names]
    if all(shown):
        return frame
    frame = frame.copy(deep=False)
    frame.columns = [n if ok else f"{HIDDEN}{i + 1}>" for i, (n, ok) in enumerate(zip(names, shown, strict=True))]
    return frame


def checked_series(prepared: PreparedFrame, cfg: PipelineConfig, source: str, sha256: str) -> FleetData:
    """The series the pipeline trains on, built from the helper columns the checks passed:
    the same parsed timestamps, the same numbers, the same grid. No rule is applied twice."""
    frame = prepared.frame
    rows = frame[f"{HELPER}time"].notna()
    columns = (cfg.target_column, *cfg.feature_columns)
    values = {column: frame.loc[rows, f"{HELPER}{column}_value"] for column in columns}
    return series_from_checked(frame.loc[rows, f"{HELPER}time"], values, prepared.freq,
                               cfg.season or season_for_freq(prepared.freq),
                               fill_gaps_max_steps=cfg.quality.fill_gaps_max_steps, source=source, sha256=sha256)


@dataclass
class PreparedFrame:
    """The raw rows in use plus ``_qc_`` helper columns, and the facts the suite needs."""

    frame: Any  # pandas.DataFrame
    time_ok: bool  # the time column exists
    value_columns: list[str]  # target and features that exist in the file
    freq: str | None = None  # None when fewer than two timestamps parse
    grid_steps: int = 0  # timestamps the regular grid from first to last holds
    duplicates: int = 0  # rows beyond the first at a repeated timestamp
    missing_steps: int = 0  # grid points without a row or with an empty value
    robust_range: dict[str, tuple[float, float]] = field(default_factory=dict)
    numeric_counts: dict[str, int] = field(default_factory=dict)
    time_is_numeric: bool = False


def prepare_frame(frame, cfg: PipelineConfig, source: str) -> PreparedFrame:
    """Add the helper columns the suite checks; raise DataError only for an unusable ``freq``."""
    columns = [str(c) for c in frame.columns]
    prepared = PreparedFrame(frame=frame.reset_index(drop=True), time_ok=cfg.time_column in columns,
                             value_columns=[c for c in (cfg.target_column, *cfg.feature_columns) if c in columns])
    if prepared.time_ok:
        _add_time_helpers(prepared, cfg)
    for column in prepared.value_columns:
        numeric, not_numeric = parse_numbers(prepared.frame[column])
        prepared.frame[f"{HELPER}{column}_value"] = numeric
        prepared.frame[f"{HELPER}{column}_not_numeric"] = not_numeric
        prepared.numeric_counts[column] = int(numeric.notna().sum())
        prepared.robust_range[column] = robust_range(numeric, cfg.quality.outlier_mad_threshold)
    if prepared.time_ok:
        _add_grid_helpers(prepared, cfg, source)
    return prepared


def build_suite(cfg: PipelineConfig, prepared: PreparedFrame):
    """The expectation suite for this run's settings and this file's columns."""
    gx = import_gx()

    E = gx.expectations
    q = cfg.quality
    time, h = cfg.time_column, HELPER
    required = [cfg.time_column, cfg.target_column, *cfg.feature_columns]
    need = min_rows(cfg)
    expectations = [
        named_check(E.ExpectTableColumnsToMatchSet(column_set=required, exact_match=False),
                    "required_columns", f"required columns {required} present"),
        named_check(E.ExpectTableRowCountToBeBetween(min_value=need),
                    "enough_rows", f"at least {need} rows for lookback {cfg.lookback}, horizon {cfg.horizon}, "
                    "validation and holdout", observed="{} rows"),
    ]
    if prepared.time_ok:
        hint = "; numbers are not read as timestamps, write ISO 8601" if prepared.time_is_numeric else ""
        dup_severity = "warning" if q.drop_duplicate_timestamps else "critical"
        dup_hint = ("; kept the last row of each (drop_duplicate_timestamps)" if q.drop_duplicate_timestamps
                    else "; set drop_duplicate_timestamps to keep the last row of each")
        expectations += [
            named_check(E.ExpectColumnValuesToBeNull(column=f"{h}time_unparseable"),
                        "timestamps_parse", f"{time!r} timestamps parse as dates", hint),
            named_check(E.ExpectColumnValuesToBeNull(column=f"{h}time_zone_mismatch"),
                        "timestamps_one_zone_style", f"{time!r} timestamps all with or all without a UTC offset"),
            named_check(E.ExpectColumnValuesToBeUnique(column=f"{h}time", severity=dup_severity),
                        "timestamps_unique", f"{time!r} timestamps unique", dup_hint),
            named_check(E.ExpectColumnValuesToBeIncreasing(column=f"{h}time"),
                        "timestamps_increasing", f"{time!r} timestamps in increasing order"),
        ]
    if prepared.freq:
        allowed = int(math.floor(q.max_gap_fraction * prepared.grid_steps))
        fill = q.fill_gaps_max_steps
        fill_hint = (f"; fill_gaps_max_steps={fill} interpolates shorter runs" if fill
                     else "; set fill_gaps_max_steps to interpolate short gaps")
        expectations += [
            named_check(E.ExpectColumnValuesToBeNull(column=f"{h}off_grid"),
                        "timestamps_on_grid", f"{time!r} timestamps on the regular {prepared.freq!r} grid"),
            named_check(E.ExpectColumnSumToBeBetween(column=f"{h}missing_before", max_value=allowed),
                        "gap_share", f"missing timestamps at most {q.max_gap_fraction:.2%} of the "
                        f"{prepared.grid_steps} on the grid (max_gap_fraction)", observed="{} missing"),
            named_check(E.ExpectColumnMaxToBeBetween(column=f"{h}missing_run", max_value=fill),
                        "gaps_repairable", f"gaps (missing timestamps or empty values) at most {fill} steps long "
                        "(fill_gaps_max_steps)", fill_hint, observed="longest {} steps"),
            named_check(E.ExpectColumnValuesToBeNull(column=f"{h}edge_missing"),
                        "edges_present", "values present at the first and last timestamp (ends cannot be interpolated)"),
        ]
        if fill:  # without the repair, any gap already fails gaps_repairable
            expectations.append(named_check(
                E.ExpectColumnSumToBeBetween(column=f"{h}missing_before", max_value=0, severity="warning"),
                "no_gaps", "no missing timestamps", f"; interpolated (fill_gaps_max_steps={fill})",
                observed="{} missing"))
    for column in prepared.value_columns:
        expectations += _value_expectations(E, cfg, prepared, column)
    return gx.ExpectationSuite(name=SUITE_NAME, expectations=expectations,
                               meta={"onnxcast": {"data_uri": cfg.data_uri, "quality": vars(q)}})


def parse_times(raw):
    """Timestamps as UTC (NaT where unparseable): offsets converted, naive values taken as UTC.

    Numbers are never read as timestamps (seconds or milliseconds since when?).
    """
    import pandas as pd

    if raw.dtype.kind == "M":
        values = pd.to_datetime(raw)
        return values.dt.tz_localize("UTC") if values.dt.tz is None else values.dt.tz_convert("UTC")
    if raw.dtype.kind in "iufb":
        return pd.Series(pd.NaT, index=raw.index, dtype="datetime64[ns, UTC]")
    text = raw.astype("string").str.strip()
    try:
        return pd.to_datetime(text, utc=True)  # fast: one format, inferred from the first value
    except (ValueError, TypeError, OverflowError):
        return pd.to_datetime(text, utc=True, format="mixed", errors="coerce")


def robust_range(values, threshold: float) -> tuple[float, float]:
    """``median ± threshold * robust sigma``; sigma from the MAD, else the mean absolute deviation."""
    import numpy as np

    finite = values[np.isfinite(values)]
    if finite.empty:
        return (-math.inf, math.inf)
    median = float(finite.median())
    deviation = (finite - median).abs()
    sigma = ROBUST_SCALE_MAD * float(deviation.median()) or ROBUST_SCALE_MEAN_AD * float(deviation.mean())
    if sigma == 0:
        return (-math.inf, math.inf)  # constant: the not-constant check reports it
    return (median - threshold * sigma, median + threshold * sigma)


def min_rows(cfg: PipelineConfig) -> int:
    """Fewest rows one series needs for its split (``split_fleet``): lookback + horizons +
    validation + holdout."""
    n = cfg.lookback + 2 * cfg.horizon
    while True:
        try:
            split_fleet(np.array([n]), cfg)
            return n
        except DataError:
            n += 1


# --- helpers ------------------------------------------------------------------------------

def _add_time_helpers(prepared: PreparedFrame, cfg: PipelineConfig) -> None:
    """Parsed UTC timestamps, the unparseable ones, and offsets written inconsistently."""
    import pandas as pd

    frame = prepared.frame
    raw = frame[cfg.time_column]
    prepared.time_is_numeric = raw.dtype.kind in "iuf" and bool(raw.notna().any())
    times = parse_times(raw)
    if cfg.trained_until:
        try:
            cutoff = pd.Timestamp(cfg.trained_until)
        except ValueError:
            raise ConfigError(f"trained_until {cfg.trained_until!r} is not a timestamp") from None
        cutoff = cutoff.tz_localize("UTC") if cutoff.tzinfo is None else cutoff.tz_convert("UTC")
        keep = times.isna() | (times <= cutoff)
        frame, times, raw = frame[keep].copy(), times[keep], raw[keep]
    frame[f"{HELPER}time"] = times
    frame[f"{HELPER}time_unparseable"] = _where(times.isna(), raw.astype("string").fillna("<empty>"))
    frame[f"{HELPER}time_zone_mismatch"] = _zone_mismatch(raw)
    prepared.frame = frame


def _add_grid_helpers(prepared: PreparedFrame, cfg: PipelineConfig, source: str) -> None:
    """Off-grid timestamps, missing steps before each row, and runs of missing steps.

    The grid has one point per distinct valid timestamp, the last row of duplicates (as the
    repair keeps), from the first timestamp to the last at ``freq``.
    """
    import numpy as np
    import pandas as pd

    frame = prepared.frame
    raw = frame[cfg.time_column].astype("string")
    for name in ("off_grid", "edge_missing"):
        frame[f"{HELPER}{name}"] = pd.Series(None, index=frame.index, dtype="object")
    for name in ("missing_before", "missing_run"):
        frame[f"{HELPER}{name}"] = np.nan
    times = frame[f"{HELPER}time"].dropna()
    distinct = times[~times.duplicated(keep="last")].sort_values()
    prepared.duplicates = int(len(times) - len(distinct))
    if len(distinct) < 2:
        return
    index = pd.DatetimeIndex(distinct).as_unit("ns")
    freq = cfg.freq or infer_freq(index, source, cfg.time_column)
    try:
        offset = pd.tseries.frequencies.to_offset(freq)
    except ValueError:
        raise DataError(f"{source}: unknown frequency {freq!r}") from None
    prepared.freq = freq
    position = grid_positions(index, offset)
    off_grid = np.isnan(position)
    frame[f"{HELPER}off_grid"] = _where(pd.Series(frame.index.isin(distinct.index[off_grid]), index=frame.index), raw)
    rows, steps = distinct.index[~off_grid], position[~off_grid].astype("int64")
    if len(steps) == 0:
        return
    prepared.grid_steps = int(steps[-1] - steps[0] + 1)
    frame.loc[rows, f"{HELPER}missing_before"] = _steps_between(steps)

    # Runs of missing steps: grid points without a row, or whose row has an empty value.
    helpers = [f"{HELPER}{c}_value" for c in prepared.value_columns]
    valued = frame.loc[rows, helpers].notna().all(axis=1).to_numpy()
    filled = steps[valued]
    prepared.missing_steps = int(prepared.grid_steps - len(filled))
    if len(filled):
        frame.loc[rows[valued], f"{HELPER}missing_run"] = _steps_between(filled)
        edge = (steps < filled[0]) | (steps > filled[-1])
    else:
        edge = np.ones(len(steps), bool)
    frame[f"{HELPER}edge_missing"] = _where(pd.Series(frame.index.isin(rows[edge]), index=frame.index), raw)


def _value_expectations(E, cfg: PipelineConfig, prepared: PreparedFrame, column: str) -> list:
    q, h = cfg.quality, HELPER
    value = f"{h}{column}_value"
    is_target = column == cfg.target_column
    low, high = prepared.robust_range.get(column, (-math.inf, math.inf))
    expectations = [
        named_check(E.ExpectColumnValuesToBeNull(column=f"{h}{column}_not_numeric"),
                    "values_numeric", f"{column!r} values numeric", column=column),
        named_check(E.ExpectColumnValuesToNotBeNull(column=column, mostly=1 - q.max_missing_fraction),
                    "missing_share", f"{column!r} empty values at most {q.max_missing_fraction:.2%} "
                    "(max_missing_fraction)", column=column),
    ]
    if q.fill_gaps_max_steps:  # without the repair, any empty value already fails gaps_repairable
        expectations.append(named_check(
            E.ExpectColumnValuesToNotBeNull(column=column, severity="warning"), "no_missing",
            f"{column!r} has no empty values", f"; interpolated (fill_gaps_max_steps={q.fill_gaps_max_steps})",
            column=column))
    if not prepared.numeric_counts.get(column):
        return expectations  # nothing numeric to describe: the checks above say why
    expectations += [
        named_check(E.ExpectColumnValuesToBeBetween(column=value, min_value=-FLOAT32_MAX, max_value=FLOAT32_MAX),
                    "values_finite", f"{column!r} values finite and within float32 range", column=column),
        named_check(E.ExpectColumnUniqueValueCountToBeBetween(column=value, min_value=2,
                                                        severity="critical" if is_target else "warning"),
              "not_constant", f"{column!r} not constant", column=column, observed="{} distinct value(s)"),
    ]
    if math.isfinite(low):
        where = f"robust z > {q.outlier_mad_threshold:g}: outside [{low:.6g}, {high:.6g}]"
        expectations += [
            named_check(E.ExpectColumnValuesToBeBetween(column=value, min_value=low, max_value=high,
                                                  mostly=1 - q.max_outlier_fraction),
                  "outlier_share", f"{column!r} outliers at most {q.max_outlier_fraction:.2%} ({where}; "
                  "max_outlier_fraction)", column=column),
            named_check(E.ExpectColumnValuesToBeBetween(column=value, min_value=low, max_value=high,
                                                  severity="warning"),
                  "no_outliers", f"{column!r} has no outliers ({where})", "; kept as they are", column=column),
        ]
    return expectations


def _repairs(cfg: PipelineConfig, prepared: PreparedFrame) -> dict:
    q = cfg.quality
    repairs = {}
    if q.fill_gaps_max_steps:
        repairs["fill_gaps"] = {"max_steps": q.fill_gaps_max_steps, "interpolated_steps": prepared.missing_steps}
    if q.drop_duplicate_timestamps:
        repairs["drop_duplicate_timestamps"] = {"dropped_rows": prepared.duplicates}
    return repairs


def parse_numbers(raw):
    """(values as float64 with NaN where empty or not a number, the raw text where not a number)."""
    import pandas as pd

    if raw.dtype.kind in "iufb":
        numeric = raw.astype("float64")
    else:
        numeric = pd.to_numeric(raw, errors="coerce").astype("float64")
    return numeric, _where(numeric.isna() & raw.notna(), raw.astype("string"))


def _zone_mismatch(raw):
    """The raw text of timestamps written with a UTC offset when most are not, or the reverse."""
    import pandas as pd

    if raw.dtype.kind != "O" and not pd.api.types.is_string_dtype(raw):
        return pd.Series(None, index=raw.index, dtype="object")
    text = raw.astype("string").str.strip()
    aware = text.str.contains(r"(?:Z|[+-]\d\d(?::?\d\d)?|\bUTC|\bGMT)$", regex=True, na=False)
    present = text.notna()
    majority = aware[present].mean() >= 0.5 if present.any() else False
    return _where(present & (aware != majority), text)


def _steps_between(steps):
    """Grid points skipped before each step number (0 for the first)."""
    import numpy as np

    return np.concatenate([[0], np.diff(steps) - 1])


def grid_positions(times, offset):
    """Step number of each timestamp on the grid that starts at the first one (NaN: off grid)."""
    import numpy as np
    import pandas as pd

    if isinstance(offset, pd.offsets.Tick):
        steps = (times - times[0]) / pd.Timedelta(offset)
        steps = np.asarray(steps, dtype="float64")
        return np.where(np.isclose(steps, np.round(steps), rtol=0, atol=1e-9), np.round(steps), np.nan)
    grid = pd.date_range(times[0], times[-1], freq=offset)
    position = grid.get_indexer(times).astype("float64")
    return np.where(position >= 0, position, np.nan)


def _where(mask, values):
    """``values`` where ``mask`` holds, None elsewhere, as an object column GX reads as null."""
    import pandas as pd

    out = pd.Series(None, index=values.index, dtype="object")
    mask = mask.fillna(False).astype(bool) if hasattr(mask, "fillna") else mask
    out[mask] = values[mask].astype(object).map(clip)
    return out


