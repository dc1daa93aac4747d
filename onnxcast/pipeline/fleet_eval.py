"""A fleet judged per series and in aggregate.

- :func:`reference_shard` (one mapped task per shard): the baselines (naive, seasonal naive
  of every season, the series' best naive) on every series of the shard, and the statistical
  reference (statsforecast AutoETS / AutoTheta / MSTL as the frequency fits) on the shard's
  series that are in the reference sample, at end-aligned origins ->
  ``data/reference/shards/<k>.parquet``.
- :func:`evaluate_shard` (one mapped task per shard): every ONNX variant of every family on
  the shard's series, at the same origins -> ``models/<family>/shards/<k>.parquet``.
- :func:`validate_fleet_family` (one task per family): parity and latency as for one series,
  the merge of the family's shards (``models/<family>/per_series.parquet``), the aggregates
  (mean MASE, sMAPE, MAPE with intervals over series, the share of series lost to the best
  naive), the gates, paired tests across series -> ``validation.json``.
- :func:`fleet_baselines`: the merged reference (``data/reference/per_series.parquet``) and
  its aggregates, in the shape of ``data/baselines.json``.

Per-series tables (Parquet) have one row per series, column ``series`` (the id) first, then
``<forecaster>.<metric>`` for metric in mae, rmse, smape, mape, mase (averaged over the
series' origins and steps; MASE on the series' in-sample seasonal-naive scale).

Design: docs/design/fleet.md section 4.
"""

from __future__ import annotations

from pathlib import Path

from onnxcast.pipeline.config import PipelineConfig


def reference_shard(cfg: PipelineConfig, shard: int) -> Path:
    raise NotImplementedError("fleet evaluation: reference_shard")


def evaluate_shard(cfg: PipelineConfig, shard: int, families: list[str] | None = None) -> list[Path]:
    raise NotImplementedError("fleet evaluation: evaluate_shard")


def validate_fleet_family(cfg: PipelineConfig, family: str) -> dict:
    raise NotImplementedError("fleet evaluation: validate_fleet_family")


def fleet_baselines(cfg: PipelineConfig) -> dict:
    raise NotImplementedError("fleet evaluation: fleet_baselines")
