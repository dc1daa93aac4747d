"""A finished fleet run directory for the registry and CLI tests, without training.

The series are real (M3 monthly, tests/real_panels.py) and so are their baselines: naive and
seasonal naive on each series' official test period, MASE on the series' in-sample
seasonal-naive scale. The families' and AutoETS's per-series errors are SYNTHETIC: the
seasonal naive's, scaled by a seeded lognormal factor per series (``skill``), because these
tests are about what is logged and decided, not about accuracy. Every aggregate, paired test
and report field is computed from those tables, so the run is consistent the way a real one
is (report.json's shape: docs/design/fleet.md 4.3; the per-series tables: 4.2). The ONNX
files are real graphs (the last value repeated over the horizon) with the metadata of a
global model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

METRICS = ("mae", "rmse", "smape", "mape", "mase")
VARIANTS = ("fp32", "int8")
SERIES_COLUMN = "unique_id"


@pytest.fixture(scope="session")
def fleet_tracking_uri(tmp_path_factory) -> str:
    """One MLflow store (SQLite) for the fleet tests of a session: creating one costs ~15 s
    on a loaded 2-core machine. Tests keep apart by model name and run key."""
    return f"sqlite:///{tmp_path_factory.mktemp('fleet-mlflow') / 'mlflow.db'}"


def build_fleet_run(root: Path, *, skills: dict[str, float], n_series: int = 60, seed: int = 0,
                    model_name: str = "fleet-m", noise: float = 0.25, champion: dict | None = None,
                    noise_seed: int | None = None) -> Path:
    """Write a fleet run to ``root``: ``skills`` maps each family to its typical MASE ratio to the
    seasonal naive (0.8: 20 % better), with lognormal spread ``noise`` over series drawn from
    ``noise_seed`` (runs on the same series with other draws: another noise_seed, same seed).
    ``champion`` (a plan entry) adds it to plan.json."""
    import pandas as pd
    from real_panels import load_panel

    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.fleet_data import FleetData
    from onnxcast.pipeline.significance import paired_across_series
    from onnxcast.registry.plan import write_plan

    root.mkdir(parents=True, exist_ok=True)
    panel = load_panel("m3-monthly", limit=n_series + 2, seed=seed)
    csv = root.parent / f"{root.name}-panel.csv"
    panel.frame.to_csv(csv, index=False)
    families = list(skills)
    cfg = PipelineConfig.from_dict(panel.settings(models=families, model_name=model_name, data_uri=str(csv),
                                                  out_dir=str(root)))
    cfg.save(root / "config.json")
    groups = {sid: g["y"].to_numpy(np.float64) for sid, g in panel.frame.groupby("unique_id", sort=True)}
    ids = sorted(groups)
    excluded = [{"series": ids[0], "because": "constant", "details": "one value"},
                {"series": ids[1], "because": "too_short", "details": "train steps below the minimum"}]
    kept = ids[2:]
    ys = [groups[s] for s in kept]
    h, season = panel.horizon, panel.season
    fleet = FleetData(values=np.concatenate(ys).astype(np.float32)[:, None],
                      offsets=np.concatenate([[0], np.cumsum([len(y) for y in ys])]).astype(np.int64),
                      starts=np.zeros(len(ys), np.int64), ids=tuple(kept), columns=("y",), freq=panel.freq,
                      season=season, source=str(csv), sha256="0" * 64)
    fleet.save(root / "data" / "fleet")

    rng = np.random.default_rng(seed + 1 if noise_seed is None else noise_seed)
    reference = {"series": kept}
    naive_rows = {"naive": [], f"seasonal_naive_{season}": []}
    scales = []
    for y in ys:
        train = y[:-h]
        scales.append(float(np.mean(np.abs(train[season:] - train[:-season]))) or 1.0)
        naive_rows["naive"].append(np.repeat(train[-1], h))
        naive_rows[f"seasonal_naive_{season}"].append(np.resize(train[-season:], h))
    for name, forecasts in naive_rows.items():
        reference.update(_metrics(name, [y[-h:] for y in ys], forecasts, scales))
    table = pd.DataFrame(reference)
    seasonal = table[f"seasonal_naive_{season}.mase"].to_numpy()
    naive_better = table["naive.mase"].to_numpy() < seasonal
    for metric in METRICS:
        table[f"best_naive.{metric}"] = np.where(naive_better, table[f"naive.{metric}"],
                                                 table[f"seasonal_naive_{season}.{metric}"])
    table["best_naive"] = np.where(naive_better, "naive", f"seasonal_naive_{season}")
    factor = np.exp(rng.normal(np.log(0.9), noise, len(kept)))
    for metric in METRICS:
        table[f"AutoETS.{metric}"] = table[f"seasonal_naive_{season}.{metric}"] * factor
    (root / "data" / "reference").mkdir(parents=True)
    table.to_parquet(root / "data" / "reference" / "per_series.parquet", index=False)
    series_table = pd.DataFrame({"series": ids, "excluded_because": ["constant", "too_short"] + [None] * len(kept)})
    (root / "quality").mkdir()
    series_table.to_parquet(root / "quality" / "series.parquet", index=False)
    (root / "quality" / "validation_result.json").write_text(json.dumps({"success": True}))

    best = table["best_naive.mase"].to_numpy()
    models, families_block, tests = [], {}, {}
    for family, skill in skills.items():
        factor = np.exp(rng.normal(np.log(skill), noise, len(kept)))
        per_series = pd.DataFrame({"series": kept})
        for variant, extra in zip(VARIANTS, (1.0, 1.01), strict=True):
            for metric in METRICS:
                per_series[f"{variant}.{metric}"] = table[f"seasonal_naive_{season}.{metric}"] * factor * extra
        family_dir = root / "models" / family
        (family_dir / "onnx").mkdir(parents=True)
        per_series.to_parquet(family_dir / "per_series.parquet", index=False)
        aggregates = {v: aggregate(per_series, v, best, kept) for v in VARIANTS}
        fp32 = per_series["fp32.mase"].to_numpy()
        vs = {"vs_best_naive": paired_across_series(fp32, best),
              "vs_reference": {"AutoETS": paired_across_series(fp32, table["AutoETS.mase"].to_numpy())}}
        families_block[family], tests[family] = aggregates, vs
        for variant in VARIANTS:
            write_onnx(family_dir / "onnx" / f"{variant}.onnx", h, n_series=len(kept))
        _torch_state(family_dir / "model.pt")
        spec = {"family": family, "n_features": 1, "horizon": h, "lookback": cfg.lookback, "season": season}
        (family_dir / "model.json").write_text(json.dumps({"spec": spec, "source": "trained",
                                                           "training": {"epochs": 2, "seconds": 1.5}}))
        mean = aggregates["fp32"]["mase_mean"]
        validation = {
            "family": family, "fp32_holdout_mae": mean, "fp32_holdout_mase": mean, "gates_passed": True,
            "failures": [], "torch": {"holdout": {"mae": mean, "mase": mean}, "latency_ms": {"batch1_p50": 0.2}},
            "variants": [{"name": v, "holdout": {"mae": aggregates[v]["mase_mean"], "mase": aggregates[v]["mase_mean"]},
                          "latency_ms": {"batch1_p50": 0.1, "batch64_p50": 0.5},
                          "size_bytes": (family_dir / "onnx" / f"{v}.onnx").stat().st_size,
                          "eligible": True, "reasons": [], "parity_max_abs_diff": 0.0,
                          "speedup_vs_torch": {"batch1_p50": 2.0, "batch64_p50": 1.5}} for v in VARIANTS],
            "fleet": {"metric": "mase", "series": len(kept), "variants": aggregates, **vs},
        }
        (family_dir / "validation.json").write_text(json.dumps(validation))
        models.append(validation)
    chosen = min(families, key=lambda f: families_block[f]["fp32"]["mase_mean"])
    best_naive = aggregate(table, "best_naive", best, kept)
    report = {
        "config": cfg.to_dict(),
        "dataset": {"rows": int(fleet.values.shape[0]), "sha256": "0" * 64, "start": "1983-01-01",
                    "end": "2000-01-01", "freq": panel.freq, "series_column": SERIES_COLUMN, "n_series": len(kept)},
        "split": {"holdout_start": "1998-08-01", "holdout_end": "2000-01-01"},
        "quality": {"series": {"total": len(ids), "kept": len(kept), "excluded": 2, "padded": 1,
                               "excluded_share": 2 / len(ids), "max_excluded_share": 0.1},
                    "excluded": excluded, "padded": [kept[0]]},
        "baselines": {"seasonal_naive": {"mae": best_naive["mae_mean"], "mase": best_naive["mase_mean"]},
                      "best": "best_naive"},
        "reference": None,
        "models": models,
        "selected": {"edge": {"family": chosen, "variant": "int8"}, "cloud": {"family": chosen, "variant": "fp32"}},
        "ranking": [{"family": f, "variant": v, "eligible": True} for f in families for v in VARIANTS],
        "status": "passed", "failures": [],
        "fleet": {"n_series": len(kept), "excluded": excluded, "padded": [kept[0]], "shards": 2,
                  "reference": {"models": ["AutoETS"], "sample_size": len(kept), "sampled": False,
                                "aggregates": {"AutoETS": aggregate(table, "AutoETS", best, kept)}},
                  "baselines": {"best_naive": best_naive}, "families": families_block, "tests": tests},
    }
    (root / "report.json").write_text(json.dumps(report))
    write_plan(root, [{"family": f, "source": None, "role": "challenger"} for f in families]
               + ([champion] if champion else []), [] if champion else ["no champion registered for fleet-m"])
    return root


def aggregate(table, forecaster: str, best_naive_mase: np.ndarray, ids: list[str]) -> dict:
    """The report's aggregate of one forecaster over series (mean MASE with a bootstrap interval)."""
    mase = table[f"{forecaster}.mase"].to_numpy(np.float64)
    smape = table[f"{forecaster}.smape"].to_numpy(np.float64)
    mape = table[f"{forecaster}.mape"].to_numpy(np.float64)
    loses = mase > best_naive_mase
    order = np.argsort(-(mase / best_naive_mase))
    return {"mase_mean": float(mase.mean()), "mase_ci95": _interval(mase), "mase_median": float(np.median(mase)),
            "mae_mean": float(table[f"{forecaster}.mae"].mean()),
            "smape_mean": float(smape.mean()), "smape_ci95": _interval(smape),
            "mape_mean": float(np.nanmean(mape)), "mape_series": int(np.isfinite(mape).sum()),
            "series": len(mase), "loses_share": float(loses.mean()), "losers_count": int(loses.sum()),
            "losers": [ids[i] for i in order[:20] if loses[i]]}


def write_onnx(path: Path, horizon: int, n_series: int) -> None:
    """A real ONNX forecaster: the last value of the target repeated over the horizon, with the
    metadata onnxcast's export writes on a global model."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Constant", [], ["last"], value=helper.make_tensor("last", TensorProto.INT64, [1], [-1])),
        helper.make_node("Constant", [], ["ends"], value=helper.make_tensor("ends", TensorProto.INT64, [1], [1])),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [1], [0])),
        helper.make_node("Constant", [], ["shape"],
                         value=helper.make_tensor("shape", TensorProto.INT64, [2], [1, horizon])),
        helper.make_node("Gather", ["history", "last"], ["step"], axis=1),  # [B, 1, F]
        helper.make_node("Slice", ["step", "zero", "ends", "ends"], ["target"]),  # first feature: [B, 1, 1]
        helper.make_node("Squeeze", ["target", "ends"], ["level"]),  # [B, 1]
        helper.make_node("Expand", ["level", "shape"], ["forecast"]),  # [B, horizon]
    ]
    graph = helper.make_graph(
        nodes, "last-value",
        [helper.make_tensor_value_info("history", TensorProto.FLOAT, ["batch", "time", 1])],
        [helper.make_tensor_value_info("forecast", TensorProto.FLOAT, ["batch", horizon])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"onnxcast.global": "true", "onnxcast.n_series": str(n_series),
                                   "onnxcast.series_column": SERIES_COLUMN})
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _metrics(name: str, actuals: list, forecasts: list, scales: list) -> dict[str, list]:
    out = {f"{name}.{m}": [] for m in METRICS}
    for actual, forecast, scale in zip(actuals, forecasts, scales, strict=True):
        error = actual - forecast
        out[f"{name}.mae"].append(float(np.mean(np.abs(error))))
        out[f"{name}.rmse"].append(float(np.sqrt(np.mean(error**2))))
        out[f"{name}.smape"].append(float(np.mean(200 * np.abs(error) / (np.abs(actual) + np.abs(forecast)))))
        out[f"{name}.mape"].append(float(np.mean(100 * np.abs(error / actual))) if np.all(actual) else np.nan)
        out[f"{name}.mase"].append(float(np.mean(np.abs(error)) / scale))
    return out


def _interval(values: np.ndarray) -> list[float]:
    rng = np.random.default_rng(0)
    means = values[rng.integers(0, len(values), (1000, len(values)))].mean(axis=1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def _torch_state(path: Path) -> None:
    import torch

    torch.save({"weight": torch.zeros(1)}, path)


INTERVAL_KEYS = ("coverage_80", "coverage_95", "msis_80", "msis_95", "pinball")


def add_intervals(root: Path, skills: dict[str, float], *, noise: float = 0.1, noise_seed: int = 11,
                  reference_skill: float = 0.9) -> Path:
    """Give a :func:`build_fleet_run` run the interval figures of forecast distributions, as the
    pipeline writes them: per-series ``<variant>.msis_95`` (and coverage, pinball) columns in each
    family's table and ``AutoETS.*``/``best_naive.*`` in the reference table, their means under
    ``intervals`` in report.json (fleet block and variant entries) and validation.json. SYNTHETIC,
    like the MASE there: the 95% MSIS is 4x the best naive's MASE per series, scaled per family by
    a seeded lognormal factor around ``skills[family]`` (0.8: 20 % lower); coverage near nominal."""
    import pandas as pd

    rng = np.random.default_rng(noise_seed)
    reference_path = root / "data" / "reference" / "per_series.parquet"
    reference = pd.read_parquet(reference_path)
    base = 4.0 * reference["best_naive.mase"].to_numpy(np.float64)
    n = len(base)

    def columns(prefix: str, factor: np.ndarray) -> dict[str, np.ndarray]:
        return {f"{prefix}.coverage_80": np.clip(rng.normal(0.8, 0.05, n), 0, 1),
                f"{prefix}.coverage_95": np.clip(rng.normal(0.95, 0.03, n), 0, 1),
                f"{prefix}.msis_80": 0.7 * base * factor, f"{prefix}.msis_95": base * factor,
                f"{prefix}.pinball": 0.1 * base * factor}

    def means(table, prefix: str) -> dict:
        return {**{k: float(table[f"{prefix}.{k}"].mean()) for k in INTERVAL_KEYS}, "levels": [0.025, 0.1, 0.5, 0.9, 0.975]}

    for name, factor in (("best_naive", np.ones(n)), ("AutoETS", np.exp(rng.normal(np.log(reference_skill), noise, n)))):
        for key, value in columns(name, factor).items():
            reference[key] = value
    reference.to_parquet(reference_path, index=False)
    report = json.loads((root / "report.json").read_text())
    fleet = report["fleet"]
    fleet["baselines"]["best_naive"]["intervals"] = means(reference, "best_naive")
    fleet["reference"]["aggregates"]["AutoETS"]["intervals"] = means(reference, "AutoETS")
    for family, skill in skills.items():
        family_dir = root / "models" / family
        table = pd.read_parquet(family_dir / "per_series.parquet")
        factor = np.exp(rng.normal(np.log(skill), noise, n))
        for variant, extra in zip(VARIANTS, (1.0, 1.01), strict=True):
            for key, value in columns(variant, factor * extra).items():
                table[key] = value
        table.to_parquet(family_dir / "per_series.parquet", index=False)
        validation = json.loads((family_dir / "validation.json").read_text())
        for variant in validation["variants"]:
            figures = means(table, variant["name"])
            variant["holdout"]["intervals"] = figures
            validation["fleet"]["variants"][variant["name"]]["intervals"] = figures
            fleet["families"][family][variant["name"]]["intervals"] = figures
        (family_dir / "validation.json").write_text(json.dumps(validation))
        report["models"] = [validation if m["family"] == family else m for m in report["models"]]
    (root / "report.json").write_text(json.dumps(report))
    return root
