"""The data gate of a fleet (a long table of many series), in three steps that Airflow maps.

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

Design: docs/design/fleet.md section 2.
"""

from __future__ import annotations

from onnxcast.base.s3 import S3Settings
from onnxcast.pipeline.config import PipelineConfig


def check_fleet_table(cfg: PipelineConfig, *, s3_settings: S3Settings | None = None) -> list[int]:
    """Read and check the long table; write the shards; return the shard numbers ``[0, .., k-1]``."""
    raise NotImplementedError("fleet data gate: check_fleet_table")


def check_fleet_shard(cfg: PipelineConfig, shard: int) -> dict:
    """Check, exclude, repair and grid the series of ``shard``; return its counts
    ``{"shard", "series", "kept", "excluded"}``."""
    raise NotImplementedError("fleet data gate: check_fleet_shard")


def merge_fleet_checks(cfg: PipelineConfig) -> dict:
    """Merge the shards' verdicts; return the summary written to ``data/dataset.json``
    (``{"dataset": ..., "split": ..., "quality": ...}``, as prepare_data returns)."""
    raise NotImplementedError("fleet data gate: merge_fleet_checks")
