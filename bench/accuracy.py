"""`make bench-accuracy`: the pipeline on real series that ship inside installed packages,
against the best naive baseline and the statistical reference on the same origins.

For each dataset the whole pipeline runs with the CLI's default training budget (the same
``run_pipeline`` as ``onnxcast pipeline``); the table reads report.json: every family's fp32
holdout MAE and its ratio to the best naive baseline and to the reference, the model the
pipeline chose for the edge channel, and whether the goal holds (edge model within 10% of the
reference's MAE, and better than the best naive). Runs that no family passes are rows too:
the pipeline refused to promote, which is the right answer when nothing beats the baseline.

    .venv/bin/python bench/accuracy.py                  # all datasets (about 5 minutes on 2 cores)
    .venv/bin/python bench/accuracy.py --quick          # one small dataset, few epochs (a smoke test)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "accuracy-results.json"
MARKDOWN = REPO / "bench" / "accuracy-results.md"
GOAL_VS_REFERENCE = 1.10

log = logging.getLogger("bench.accuracy")


@dataclass(frozen=True)
class Dataset:
    name: str
    description: str
    settings: dict  # PipelineConfig values besides data_uri/out_dir
    published: str = ""  # a published figure on the same data, where one exists
    make: object = field(default=None, compare=False)  # () -> pandas.DataFrame with the columns in settings


def _victoria():
    import pandas as pd

    from onnxcast.pipeline.config import example_data_path

    return pd.read_csv(example_data_path())


def _co2():
    import statsmodels.datasets.co2 as co2

    frame = co2.load_pandas().data.rename(columns={"co2": "ppm"}).rename_axis("week").reset_index()
    frame["week"] = frame["week"].dt.strftime("%Y-%m-%d")
    return frame


def _elnino():
    import pandas as pd
    import statsmodels.datasets.elnino as elnino

    wide = elnino.load_pandas().data
    months = wide.columns[1:]
    rows = [(f"{int(year)}-{i + 1:02d}-01", value) for year, values in zip(wide["YEAR"], wide[months].to_numpy(), strict=True)
            for i, value in enumerate(values)]
    return pd.DataFrame(rows, columns=["month", "sst"])


def _sunspots():
    import statsmodels.datasets.sunspots as sunspots

    frame = sunspots.load_pandas().data
    frame["year"] = frame["YEAR"].astype(int).map(lambda y: f"{y}-01-01")
    return frame[["year", "SUNACTIVITY"]]


DATASETS = [
    Dataset("victoria-electricity", "hourly electricity demand of Victoria, 2012 (statsmodels MSTL test data)",
            {"time_column": "ds", "target_column": "y", "horizon": 24, "lookback": 168}, make=_victoria),
    Dataset("mauna-loa-co2", "weekly CO2 at Mauna Loa 1958-2001 (statsmodels.datasets.co2; 59 missing weeks "
            "interpolated on request)", {"time_column": "week", "target_column": "ppm", "horizon": 13, "lookback": 104,
                                         "quality": {"fill_gaps_max_steps": 20, "max_missing_fraction": 0.03}}, make=_co2),
    Dataset("el-nino-sst", "monthly sea surface temperature, El Nino region 1950-2010 (statsmodels.datasets.elnino)",
            {"time_column": "month", "target_column": "sst", "horizon": 12, "lookback": 48}, make=_elnino),
    Dataset("sunspots", "yearly sunspot numbers 1700-2008 (statsmodels.datasets.sunspots)",
            {"time_column": "year", "target_column": "SUNACTIVITY", "horizon": 5, "lookback": 30}, make=_sunspots),
]
QUICK = {"max_epochs": 2, "hidden_size": 16, "num_layers": 1, "d_model": 16, "n_heads": 2, "latency_repeats": 3}


def run_dataset(dataset: Dataset, work: Path, overrides: dict) -> dict:
    from onnxcast.base.errors import GateError
    from onnxcast.base.files import read_json
    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.run import run_pipeline

    data = work / f"{dataset.name}.csv"
    dataset.make().to_csv(data, index=False)
    out = work / dataset.name
    cfg = PipelineConfig.from_dict({"data_uri": str(data), "out_dir": str(out), **dataset.settings, **overrides})
    started = time.monotonic()
    try:
        report = run_pipeline(cfg)
        status = "passed"
    except GateError:
        report = read_json(out / "failed-report.json")
        status = "no family beat the baseline: nothing promoted"
    seconds = time.monotonic() - started
    return summarize(dataset, report, status, seconds)


def summarize(dataset: Dataset, report: dict, status: str, seconds: float) -> dict:
    baselines, reference = report["baselines"], report.get("reference") or {}
    best = baselines["seasonal_naive"]
    families = []
    for m in report["models"]:
        mae = m["fp32_holdout_mae"]
        trained = (m.get("training") or {}).get("training") or {}
        families.append({"family": m["family"], "mae": mae, "mae_ci95": _fp32(m).get("mae_ci95"),
                         # epoch 0 is the untrained model, its seasonal-naive anchor (onnxcast.pipeline.training)
                         "validation_loss_epoch0": trained.get("initial_validation_loss"),
                         "validation_loss_best": trained.get("best_validation_loss"),
                         "best_epoch": trained.get("best_epoch"), "epochs": trained.get("epochs"),
                         "vs_best_naive": mae / best["mae"] if mae else None,
                         "vs_reference": mae / reference["mae"] if mae and reference else None,
                         "p_vs_reference": ((m.get("fp32_vs") or {}).get("reference") or {}).get("p_value"),
                         "intervals": interval_figures(_fp32(m).get("intervals")),
                         "gates_passed": m["gates_passed"]})
    edge = (report.get("selected") or {}).get("edge")
    edge_mae, edge_intervals = None, None
    if edge:
        model = next(m for m in report["models"] if m["family"] == edge["family"])
        edge_holdout = next(v for v in model["variants"] if v["name"] == edge["variant"])["holdout"]
        edge_mae, edge_intervals = edge_holdout["mae"], interval_figures(edge_holdout.get("intervals"))
    vs_ref = edge_mae / reference["mae"] if edge_mae and reference else None
    return {
        "dataset": dataset.name, "description": dataset.description, "published": dataset.published,
        "rows": report["dataset"]["rows"], "freq": report["dataset"]["freq"], "horizon": report["config"]["horizon"],
        "lookback": report["config"]["lookback"], "origins": baselines["origins"],
        "baselines": {k: {"mae": v["mae"], "mase": v["mase"]} for k, v in baselines["candidates"].items()},
        "best_naive": {"name": baselines["best"], "mae": best["mae"], "mae_ci95": best.get("mae_ci95"),
                       "intervals": interval_figures(best.get("intervals"))},
        "reference": {"model": reference.get("model"), "mae": reference.get("mae"),
                      "mae_ci95": reference.get("mae_ci95"), "intervals": interval_figures(reference.get("intervals"))},
        "families": families, "edge": edge, "edge_mae": edge_mae, "edge_intervals": edge_intervals,
        "edge_vs_reference": vs_ref, "edge_vs_best_naive": edge_mae / best["mae"] if edge_mae else None,
        "goal_within_10pct_of_reference": vs_ref is not None and vs_ref <= GOAL_VS_REFERENCE,
        "goal_beats_best_naive": edge_mae is not None and edge_mae < best["mae"],
        "status": status, "seconds": round(seconds, 1),
    }


INTERVAL_FIGURES = ("coverage_80", "coverage_95", "msis_95", "pinball")


def interval_figures(intervals: dict | None) -> dict | None:
    """The interval figures the tables show (None where the forecaster has no intervals)."""
    return {k: intervals.get(k) for k in INTERVAL_FIGURES} if intervals else None


def _fp32(model: dict) -> dict:
    fp32 = next((v for v in model["variants"] if v["name"] == "fp32"), None)
    return (fp32 or {}).get("holdout") or {}


def write_markdown(results: dict, path: Path) -> None:
    def f(value, spec=".4g"):
        return "-" if value is None else format(value, spec)

    lines = [f"# Accuracy benchmark ({results['date']})", "",
             f"{results['machine']}; onnxcast {results['onnxcast']}; command: `{results['command']}`. "
             "MAE on the holdout's rolling origins (every phase of the season); ratios < 1 are better. "
             "The best naive is the most accurate of naive and each seasonal naive; the reference is "
             "statsforecast on the same origins. Goal: the edge model within 10% of the reference, and "
             "better than the best naive.", "",
             "| dataset | rows | freq | h | origins | best naive (MAE) | reference (MAE) | family: fp32 MAE (x best naive, x reference) | edge model | edge x reference | goal |",
             "|---|---:|---|---:|---:|---|---|---|---|---:|---|"]
    for r in results["datasets"]:
        fams = "<br>".join(f"{x['family']}: {f(x['mae'])} ({f(x['vs_best_naive'], '.2f')}, {f(x['vs_reference'], '.2f')})"
                           + ("" if x["gates_passed"] else " excluded") for x in r["families"])
        edge = f"{r['edge']['family']} {r['edge']['variant']}" if r["edge"] else "none (refused)"
        goal = ("met" if r["goal_within_10pct_of_reference"] and r["goal_beats_best_naive"] else
                "beats naive, not within 10% of reference" if r["goal_beats_best_naive"] else
                "refused to promote" if not r["edge"] else "NOT met")
        lines.append(f"| {r['dataset']} | {r['rows']} | {r['freq']} | {r['horizon']} | {r['origins']['count']} "
                     f"(stride {r['origins']['stride']}) | {r['best_naive']['name']} ({f(r['best_naive']['mae'])}) | "
                     f"{r['reference']['model']} ({f(r['reference']['mae'])}) | {fams} | {edge} | "
                     f"{f(r['edge_vs_reference'], '.3f')} | {goal} |")
    lines += ["", "Training (validation loss in standardised units; epoch 0 is the untrained model, "
              "its seasonal-naive anchor):", "",
              "| dataset | family | epochs | best epoch | val loss epoch 0 | best val loss | fp32 MAE | best naive MAE | x best naive |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results["datasets"]:
        for x in r["families"]:
            lines.append(f"| {r['dataset']} | {x['family']} | {f(x.get('epochs'), 'd')} | {f(x.get('best_epoch'), 'd')} | "
                         f"{f(x.get('validation_loss_epoch0'))} | {f(x.get('validation_loss_best'))} | {f(x['mae'])} | "
                         f"{f(r['best_naive']['mae'])} | {f(x['vs_best_naive'], '.3f')} |")
    lines += ["", "Forecast distributions on the same origins: coverage of the central 80% and 95% intervals "
              "(nominal 0.80 and 0.95), MSIS of the 95% interval and the mean pinball loss over the levels, both "
              "scaled like MASE (lower is better). The models' and the best naive's intervals are split-conformal, "
              "calibrated on the validation windows; the reference's are statsforecast's own.", "",
              "| dataset | forecaster | cov 80 | cov 95 | MSIS 95 | pinball |", "|---|---|---:|---:|---:|---:|"]
    for r in results["datasets"]:
        shown = [(f"best naive ({r['best_naive']['name']})", r["best_naive"].get("intervals")),
                 (f"reference ({r['reference']['model']})", r["reference"].get("intervals")),
                 *((f"{x['family']} fp32", x.get("intervals")) for x in r["families"])]
        if r["edge"]:
            shown.append((f"edge: {r['edge']['family']} {r['edge']['variant']}", r.get("edge_intervals")))
        for who, iv in shown:
            iv = iv or {}
            lines.append(f"| {r['dataset']} | {who} | {f(iv.get('coverage_80'), '.3f')} | {f(iv.get('coverage_95'), '.3f')} "
                         f"| {f(iv.get('msis_95'), '.3f')} | {f(iv.get('pinball'), '.4f')} |")
    lines += ["", "Datasets:"] + [f"- {r['dataset']}: {r['description']}" + (f" Published: {r['published']}" if r["published"] else "")
                                  for r in results["datasets"]]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small dataset, tiny models, 2 epochs (smoke test)")
    parser.add_argument("--datasets", help="comma-separated names (default: all)")
    parser.add_argument("--models", help="comma-separated families (default: the pipeline's default)")
    parser.add_argument("--max-epochs", type=int, help="training epochs (default: the pipeline's default)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument("--markdown", type=Path, default=MARKDOWN, help="Markdown table file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("onnxcast", "torch.onnx", "onnxscript", "onnx_ir"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    chosen = [d for d in DATASETS if not args.datasets or d.name in args.datasets.split(",")]
    if args.quick:
        chosen = [d for d in chosen if d.name == "sunspots"] or chosen[:1]
    overrides = dict(QUICK) if args.quick else {}
    if args.models:
        overrides["models"] = args.models
    if args.max_epochs:
        overrides["max_epochs"] = args.max_epochs
    rows = []
    with tempfile.TemporaryDirectory(prefix="onnxcast-bench-accuracy-") as work:
        for dataset in chosen:
            log.info("%s: running the pipeline", dataset.name)
            row = run_dataset(dataset, Path(work), overrides)
            log.info("%s: best naive %s %.4g, reference %.4g, edge %s (x%.3f of the reference) in %.0fs",
                     dataset.name, row["best_naive"]["name"], row["best_naive"]["mae"], row["reference"]["mae"] or 0,
                     row["edge"], row["edge_vs_reference"] or float("nan"), row["seconds"])
            rows.append(row)

    import platform

    from onnxcast import __version__

    results = {"date": dt.date.today().isoformat(), "onnxcast": __version__,
               "machine": f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores",
               "command": "bench/accuracy.py " + " ".join(sys.argv[1:] if argv is None else argv), "datasets": rows}
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    write_markdown(results, args.markdown)
    print(args.markdown.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
