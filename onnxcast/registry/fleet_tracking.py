"""What MLflow gets from a fleet run (docs/design/fleet.md section 4.5).

A fleet is judged on thousands of series; MLflow gets the *aggregates* as metrics (tens of
them, never one per series) and the per-series tables as Parquet artifacts, plus one compact
table for the UI. Every input here is optional: a fleet run from an older layout (no
per-series table, no reference, no ``fleet`` block in validation.json) logs what it has.

The functions return plain dicts and paths; :mod:`onnxcast.registry.tracking` writes them.
pandas, onnx and mlflow are imported inside functions (Airflow operators import this module).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from onnxcast.base.errors import DataError
from onnxcast.pipeline.layout import RunLayout
from onnxcast.registry.interval_figures import numbers

SERIES = "series"  # the id column of every per-series table
MAX_TABLE_ROWS = 50_000  # above this, the UI table is skipped and only the Parquet files are logged
TABLE_ARTIFACT = "per_series.json"
# the numbers of a paired test worth a metric (the rest: alpha, min_origins, the test's name)
TEST_KEYS = ("p_value", "robust_p", "mean_diff", "statistic", "significant", "origins", "series")
# ONNX metadata of a global model (onnxcast.pipeline.export) and the version tags made from it
GLOBAL_META = ("onnxcast.global", "onnxcast.n_series", "onnxcast.series_column")


def is_fleet_report(report: dict) -> bool:
    """A report judged across series: it has the ``fleet`` block (a long table that kept one
    series is judged as one series, issue 31: its config's series column says nothing)."""
    return bool(report.get("fleet"))


def count(value) -> int | None:
    """A count from a report field that holds either the count or the list of what it counts."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, list | tuple | dict):
        return len(value)
    return None


def parent_metrics(report: dict, scalars) -> dict[str, float]:
    """``fleet.*`` metrics of the pipeline run: series kept, excluded and padded, the best
    naive's and each reference model's aggregates (mean MASE with its interval, sMAPE, MAPE)."""
    fleet = report.get("fleet") or {}
    gate = (report.get("quality") or {}).get("series") or {}  # dataset.json's quality.series
    metrics: dict[str, float] = {}
    for key, fallback in (("series", "n_series"), ("excluded", "excluded"), ("padded", "padded"),
                          ("shards", "shards")):
        value = count(fleet.get(fallback if key == "series" else key))
        if value is None:
            value = count(gate.get("kept" if key == "series" else key))
        if value is not None:
            metrics[f"fleet.{key}"] = value
    if isinstance(gate.get("excluded_share"), int | float):
        metrics["fleet.excluded_share"] = gate["excluded_share"]
    best = (fleet.get("baselines") or {}).get("best_naive")
    if best:
        metrics.update({f"fleet.best_naive.{k}": v for k, v in scalars(_aggregate_numbers(best)).items()})
        metrics.update({f"fleet.best_naive.{k}": v for k, v in numbers(best.get("intervals") or {}).items()})
    reference = fleet.get("reference") or {}
    for model, aggregate in (reference.get("aggregates") or {}).items():
        metrics.update({f"fleet.reference.{model}.{k}": v for k, v in scalars(_aggregate_numbers(aggregate)).items()})
        # its own level=[80, 95] intervals, means over series (absent before forecast distributions)
        metrics.update({f"fleet.reference.{model}.{k}": v for k, v in numbers(aggregate.get("intervals") or {}).items()})
    if isinstance(reference.get("sample_size"), int | float):
        metrics["fleet.reference.sample_size"] = reference["sample_size"]
    return metrics


def family_metrics(validation: dict, report: dict, family: str, scalars) -> dict[str, float]:
    """The child run's fleet metrics: per variant ``<variant>.fleet_mase_mean`` (+ interval),
    ``fleet_smape_mean``, ``fleet_mape_mean``, ``loses_share``, and the fp32 paired tests
    across series (``fp32_vs_best_naive.p_value``, ``fp32_vs_<reference>.p_value``)."""
    judged = validation.get("fleet") or {}
    variants = judged.get("variants") or ((report.get("fleet") or {}).get("families") or {}).get(family) or {}
    metrics: dict[str, float] = {}
    for variant, aggregate in variants.items():
        for key, value in scalars(_aggregate_numbers(aggregate)).items():
            name = key if key in ("loses_share", "losers_count") else f"fleet_{key}"
            metrics[f"{variant}.{name}"] = value
    tests = ((report.get("fleet") or {}).get("tests") or {}).get(family) or {}
    vs_naive = judged.get("vs_best_naive") or tests.get("vs_best_naive")
    if vs_naive:
        metrics.update({f"fp32_vs_best_naive.{k}": v for k, v in _test_numbers(vs_naive, scalars).items()})
    for model, test in (judged.get("vs_reference") or tests.get("vs_reference") or {}).items():
        metrics.update({f"fp32_vs_{model}.{k}": v for k, v in _test_numbers(test, scalars).items()})
    if tests.get("vs_best_family"):
        metrics.update({f"fp32_vs_best_family.{k}": v
                        for k, v in _test_numbers(tests["vs_best_family"], scalars).items()})
    return metrics


def losers_text(validation: dict, report: dict, family: str, limit: int = 20) -> str | None:
    """The first ``limit`` series where the family's fp32 loses to the best naive (a tag: a JSON
    list of ids, unambiguous whatever characters an id holds)."""
    judged = (validation.get("fleet") or {}).get("variants") or (
        ((report.get("fleet") or {}).get("families") or {}).get(family) or {})
    losers = (judged.get("fp32") or {}).get("losers")
    ids = [str(loser["series"] if isinstance(loser, dict) else loser) for loser in losers[:limit]] if losers else []
    return json.dumps(ids) if ids else None


@contextmanager
def per_series_artifacts(layout: RunLayout, families: list[str]) -> Iterator[dict[str, Path]]:
    """``{family: path}`` of the families' per-series tables that exist, plus ``reference``,
    each copied as ``<name>.parquet`` into a scratch folder (every family's file is called
    per_series.parquet, and MLflow names an artifact by its file name)."""
    with tempfile.TemporaryDirectory(prefix="onnxcast-per-series-") as scratch:
        out = {}
        sources = {family: layout.per_series(family) for family in families}
        sources["reference"] = layout.reference_table
        for name, source in sources.items():
            if source.is_file():
                target = Path(scratch) / f"{name}.parquet"
                shutil.copyfile(source, target)
                out[name] = target
        yield out


def compact_table(layout: RunLayout, families: list[str], selected: str | None):
    """One row per series for the MLflow UI: the id, the best naive's and each reference
    model's MASE, each family's fp32 MASE, and ``loses`` (the selected family's fp32 MASE
    above the best naive's); with forecast distributions, the reference's and each family's
    fp32 95% MSIS after them. None when there is no per-series table, or more than
    :data:`MAX_TABLE_ROWS` series (the Parquet artifacts hold them)."""
    import pandas as pd

    columns, intervals = [], []
    if layout.reference_table.is_file():
        reference = read_per_series(layout.reference_table)
        keep = [c for c in reference.columns if c.endswith(".mase") and c.split(".")[0] in
                ("best_naive", "AutoETS", "AutoTheta", "MSTL")]
        columns.append(reference[[SERIES, *keep]].set_index(SERIES))
        msis = [c.replace(".mase", ".msis_95") for c in keep if c.replace(".mase", ".msis_95") in reference]
        intervals.append(reference[[SERIES, *msis]].set_index(SERIES))
    for family in families:
        path = layout.per_series(family)
        if path.is_file():
            table = read_per_series(path, ["fp32.mase"]).set_index(SERIES)
            columns.append(table[["fp32.mase"]].rename(columns={"fp32.mase": f"{family}.fp32.mase"}))
            if "fp32.msis_95" in table:
                intervals.append(table[["fp32.msis_95"]].rename(columns={"fp32.msis_95": f"{family}.fp32.msis_95"}))
    if not columns:
        return None
    table = pd.concat(columns, axis=1, join="outer")
    if len(table) > MAX_TABLE_ROWS:
        return None
    edge = f"{selected}.fp32.mase"
    if edge in table and "best_naive.mase" in table:
        table["loses"] = (table[edge] > table["best_naive.mase"]).where(
            table[edge].notna() & table["best_naive.mase"].notna())
    if any(len(part.columns) for part in intervals):  # after ``loses``: the MASE columns keep their places
        table = pd.concat([table, *[p for p in intervals if len(p.columns)]], axis=1, join="outer")
    table = table.reset_index().rename(columns={"index": SERIES})
    # JSON has no NaN: a series outside the reference sample gets null
    return table.astype(object).where(table.notna(), None)


def read_per_series(path: str | Path, columns: list[str] | None = None):
    """A per-series table (Parquet) with its ``series`` ids as text; ``columns`` must exist.
    A one-line DataError names the file and what it lacks."""
    import pandas as pd

    try:
        table = pd.read_parquet(path)
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not a per-series table ({' '.join(str(error).split())})") from None
    missing = [c for c in [SERIES, *(columns or [])] if c not in table.columns]
    if missing:
        raise DataError(f"{path}: no column {', '.join(map(repr, missing))} (has {list(table.columns)[:8]})")
    table[SERIES] = table[SERIES].astype(str)
    return table


def version_tags(layout: RunLayout, report: dict, family: str) -> dict[str, str]:
    """Tags of a fleet model version: global, over how many series, which series column,
    horizon and frequency (what a later run checks before comparing), and the metric its
    ``onnxcast.fp32_holdout_mae`` holds (mean MASE). From the ONNX metadata when present."""
    import onnx

    config = report.get("config") or {}
    tags = {"onnxcast.global": "true",
            "onnxcast.n_series": str((report.get("fleet") or {}).get("n_series") or
                                     (report.get("dataset") or {}).get("n_series") or ""),
            "onnxcast.series_column": str(config.get("series_column") or ""),
            "onnxcast.horizon": str(config.get("horizon", "")),
            "onnxcast.freq": str((report.get("dataset") or {}).get("freq") or config.get("freq") or ""),
            "onnxcast.metric": "mase"}
    path = layout.onnx(family)
    if path.is_file():
        meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        tags.update({key: str(meta[key]) for key in GLOBAL_META if key in meta})
    entry = next((m for m in report.get("models", []) if m["family"] == family), {})
    fp32 = (((report.get("fleet") or {}).get("families") or {}).get(family) or {}).get("fp32") or {}
    mase = fp32.get("mase_mean", entry.get("fp32_holdout_mase", entry.get("fp32_holdout_mae")))
    if mase is not None:
        tags["onnxcast.fp32_holdout_mase"] = str(mase)
    if fp32.get("mase_ci95"):
        tags["onnxcast.fp32_mase_ci95"] = json.dumps(fp32["mase_ci95"])
    return tags


def input_example(layout: RunLayout, lookback: int):
    """Two real histories ``[2, lookback, features]`` from the checked fleet (data/fleet, else
    the first shard), edge-padded when a series is shorter than the lookback."""
    import numpy as np

    from onnxcast.pipeline.fleet_data import FLEET_JSON, FleetData

    candidates = [layout.fleet, *sorted((layout.data / "shards").glob("*/"))]
    folder = next((c for c in candidates if (c / FLEET_JSON).is_file()), None)
    if folder is None:
        raise DataError(f"{layout.fleet}: no checked fleet in the run directory (needed for the signature example)")
    fleet = FleetData.load(folder, mmap=True)
    rows = []
    for i in range(min(2, fleet.n_series)):
        history = np.asarray(fleet.series(i)[-lookback:], dtype=np.float32)
        if len(history) < lookback:
            history = np.concatenate([np.repeat(history[:1], lookback - len(history), axis=0), history])
        rows.append(history)
    while len(rows) < 2:  # a fleet of one series: batch 2 all the same (see docs: batch >= 2)
        rows.append(rows[0])
    return np.ascontiguousarray(np.stack(rows), dtype=np.float32)


def _aggregate_numbers(aggregate: dict) -> dict:
    """An aggregate without its list of losers (ids are not metrics)."""
    return {k: v for k, v in aggregate.items() if k != "losers"}


def _test_numbers(test: dict, scalars) -> dict[str, float]:
    return {k: v for k, v in scalars(test).items() if k in TEST_KEYS}
