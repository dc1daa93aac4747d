"""Row helpers of the data gate (onnxcast.pipeline.fleet_quality): how a raw cell is read.

Timestamps (:func:`parse_times`), numbers (:func:`parse_numbers`), a timestamp's step on a
frequency grid (:func:`grid_positions`), and which header fields may be shown
(:func:`hide_unnamed_columns`). One reading for the table checks of any number of series; see
docs/data-quality.md.

pandas is imported inside functions: Airflow operators import the gate when a DAG file is parsed.
"""

from __future__ import annotations

from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.expectations import HIDDEN, clip
from onnxcast.pipeline.reading import plausible_column_name

FLOAT32_MAX = 3.4028234663852886e38
ROBUST_SCALE_MAD = 1.4826  # MAD -> standard deviation for normal data
ROBUST_SCALE_MEAN_AD = 1.2533  # mean absolute deviation -> standard deviation, when MAD is 0


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


def parse_numbers(raw):
    """(values as float64 with NaN where empty or not a number, the raw text where not a number)."""
    import pandas as pd

    if raw.dtype.kind in "iufb":
        numeric = raw.astype("float64")
    else:
        numeric = pd.to_numeric(raw, errors="coerce").astype("float64")
    return numeric, _where(numeric.isna() & raw.notna(), raw.astype("string"))


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
