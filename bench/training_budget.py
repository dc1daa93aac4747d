"""Training budget (issue 32, item 4): fleet accuracy against training minutes, per family.

For each panel and each budget of M minutes, one run of ``bench/fleet.py accuracy`` (its
functions, in this process): every family trained for at most M minutes (``max_minutes``), the
pretrained base fine-tuned for at most M minutes (``base_finetune_minutes``, so it is on the same
budget), the ensemble of them, and statsforecast's SeasonalNaive, AutoETS and AutoTheta judged on
the same series and the same official test (fitted once, then read from ``--statsforecast-cache``).
Per family and budget: mean MASE with its 95 % bootstrap interval, mean MAPE, the series whose
test MAE is above 3x their seasonal naive's, the epochs run, the best epoch, what ended training
(``early_stopping``, ``max_epochs``, ``max_minutes``), the training seconds and the validation loss
of every epoch; per run its wall time and the machine's load average (the minutes are wall-clock
minutes: on a shared machine a budget buys fewer epochs).

    nice -n 10 .venv/bin/python bench/training_budget.py --panels m1-monthly --minutes 0.5,1,2,4 \\
        --statsforecast-cache /tmp/budget/sf --work /tmp/budget/work

Every (panel, minutes) point is written to bench/training-budget-results.json when it ends (a point
run again replaces its entry, so a grid can be run a point at a time) and
bench/training-budget-results.md is rendered from all of them. docs/training-budget.md reads them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

import fleet  # bench/ is the script's folder: sys.path[0]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "training-budget-results.json"
MARKDOWN = REPO / "bench" / "training-budget-results.md"
FAMILIES = ("nhits", "dlinear", "lstm", "transformer", "base", "ensemble")
REFERENCES = ("AutoETS", "AutoTheta", "SeasonalNaive")
# the pipeline settings a panel needs besides Panel.settings() (M1 monthly: series as short as 12
# training steps and one holdout window; as the fleet bench ran it, docs/fleet.md)
PANEL_SETTINGS = {"m1-monthly": {"quality": {"min_holdout_windows": 1, "min_train_steps": 12}}}

log = logging.getLogger("bench.training_budget")


def fleet_args(minutes: float, args) -> argparse.Namespace:
    """The arguments ``fleet.accuracy_panel`` reads, for one budget."""
    return argparse.Namespace(limit=args.limit, no_pipeline=False, minutes=minutes, families=list(args.families),
                              n_jobs=args.n_jobs, reference_series=args.reference_series,
                              statsforecast_cache=args.statsforecast_cache, settings=None)


def run_point(panel: str, minutes: float, args) -> dict:
    """One panel at one budget: the fleet bench's accuracy run, summarised."""
    settings = {**PANEL_SETTINGS.get(panel, {}), "base_finetune_minutes": minutes, **json.loads(args.settings or "{}")}
    point_args = fleet_args(minutes, args)
    point_args.settings = json.dumps(settings)
    work = args.work / f"{panel}-{minutes:g}min"
    work.mkdir(parents=True, exist_ok=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    row = fleet.accuracy_panel(panel, point_args, work)
    wall = round(time.monotonic() - started, 1)
    pipeline = row["pipeline"] or {}
    log.info("%s at %g min: %s in %.0f s", panel, minutes, pipeline.get("status"), wall)
    return {"panel": panel, "minutes": minutes, "settings": settings, "date": dt.date.today().isoformat(),
            "series": row["series"], "judged_series": row["judged_series"], "wall_s": wall,
            "pipeline_s": pipeline.get("seconds"), "status": pipeline.get("status"),
            "edge": row["goals"]["edge"], "load_average_before": load_before,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "statsforecast_source": row["statsforecast_source"],
            "families": family_rows(row, work / panel), "references": reference_rows(row),
            "steps": pipeline.get("steps", [])}


def accuracy_of(aggregate: dict) -> dict:
    return {"mase_mean": aggregate["mase_mean"], "mase_ci95": aggregate["mase_ci95"],
            "mape_mean": aggregate["mape_mean"], "blowups": aggregate["blowups"], "series": aggregate["series"]}


def family_rows(row: dict, run: Path) -> dict:
    """Per family: its fp32 accuracy, and how its training went (model.json's ``training``)."""
    by = {a["forecaster"]: a for a in row["forecasters"]}
    steps = {s["step"]: s["wall_s"] for s in (row["pipeline"] or {}).get("steps", [])}
    out = {}
    for family in (row["pipeline"] or {}).get("families", []):
        model = run / "models" / family / "model.json"
        saved = json.loads(model.read_text()) if model.exists() else {}
        trained = saved.get("training") or {}
        out[family] = {**(accuracy_of(by[f"{family}/fp32"]) if f"{family}/fp32" in by else {}),
                       "epochs": trained.get("epochs"), "best_epoch": trained.get("best_epoch"),
                       "stopped": trained.get("stopped"), "train_s": trained.get("seconds"),
                       "train_step_s": steps.get(f"train {family}"), "use": saved.get("use"),
                       "validation_loss": [h["validation_loss"] for h in trained.get("history", [])],
                       "initial_validation_loss": trained.get("initial_validation_loss")}
    return out


def reference_rows(row: dict) -> dict:
    by = {a["forecaster"]: a for a in row["forecasters"]}
    return {name: accuracy_of(by[name]) for name in REFERENCES if name in by}


# --- results -----------------------------------------------------------------------------------

def merge(results: dict, point: dict) -> dict:
    """The results with ``point`` in place of an earlier point of the same panel and budget."""
    points = [p for p in results.get("points", []) if (p["panel"], p["minutes"]) != (point["panel"], point["minutes"])]
    points.append(point)
    points.sort(key=lambda p: (p["panel"], p["minutes"]))
    return {**results, "points": points}


def _f(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def render(results: dict) -> str:
    lines = ["# Training budget (issue 32, item 4)", "",
             "Written by `bench/training_budget.py`; docs/training-budget.md reads it. Commands and machine: "
             "in each panel's section.", ""]
    for panel in sorted({p["panel"] for p in results["points"]}):
        lines += render_panel(results, [p for p in results["points"] if p["panel"] == panel])
    return "\n".join(lines) + "\n"


def render_panel(results: dict, points: list[dict]) -> list[str]:
    """The pivot of mean MASE (family by budget), then the full table, then the runs."""
    first = points[0]
    families = list(first["families"])
    lines = [f"## {first['panel']}: {first['judged_series']} of {first['series']} series", "",
             *[f"Command: `{c}`" for c in dict.fromkeys(p["command"] for p in points)], "",
             f"Machine: {results['machine']}.", "",
             "Mean MASE (fp32) by training budget (minutes per family; base: minutes of fine-tuning):", "",
             "| forecaster | " + " | ".join(f"{p['minutes']:g} min" for p in points) + " |",
             "|---|" + "---:|" * len(points)]
    for name in families:
        lines.append(f"| {name} | " + " | ".join(_f(p["families"].get(name, {}).get("mase_mean")) for p in points) + " |")
    for name in REFERENCES:
        lines.append(f"| {name} | " + " | ".join(_f(p["references"].get(name, {}).get("mase_mean")) for p in points) + " |")
    lines += ["", "| minutes | forecaster | mean MASE [95 % CI] | mean MAPE | MAE > 3x seasonal naive | epochs "
              "(best) | ended by | training s |", "|---:|---|---|---:|---:|---:|---|---:|"]
    for p in points:
        rows = [(name, p["families"][name]) for name in families if name in p["families"]]
        rows += [(name, p["references"][name]) for name in REFERENCES if name in p["references"]]
        for name, a in rows:
            ci = a.get("mase_ci95") or [None, None]
            epochs = f"{a['epochs']} ({a['best_epoch']})" if a.get("epochs") is not None else "-"
            lines.append(f"| {p['minutes']:g} | {name} | {_f(a.get('mase_mean'))} [{_f(ci[0])}, {_f(ci[1])}] | "
                         f"{_f(a.get('mape_mean'), '.2f')} | {a.get('blowups', '-')} | {epochs} | "
                         f"{a.get('stopped') or '-'} | {_f(a.get('train_s'), '.0f')} |")
    lines += ["", "| minutes | run wall s | pipeline s | status | edge | load average before / after |",
              "|---:|---:|---:|---|---|---|"]
    for p in points:
        lines.append(f"| {p['minutes']:g} | {p['wall_s']:.0f} | {_f(p['pipeline_s'], '.0f')} | {p['status']} | "
                     f"{p['edge']} | {p['load_average_before']} / {p['load_average_after']} |")
    return [*lines, ""]


def write(results: dict, json_path: Path, markdown_path: Path) -> None:
    json_path.write_text(json.dumps(results, indent=2, default=fleet._json_default) + "\n")
    markdown_path.write_text(render(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--panels", default="m1-monthly", help="comma-separated panel names")
    parser.add_argument("--minutes", default="0.5,1,2,4", help="comma-separated budgets, minutes per family")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated families")
    parser.add_argument("--limit", type=int, help="a seeded sample of this many series per panel (a smoke run)")
    parser.add_argument("--n-jobs", type=int, default=1, help="statsforecast processes")
    parser.add_argument("--reference-series", type=int, default=100, help="the pipeline's reference_max_series")
    parser.add_argument("--statsforecast-cache", type=Path, required=True, help="folder of statsforecast tables")
    parser.add_argument("--work", type=Path, required=True, help="folder for the data and the runs")
    parser.add_argument("--settings", help="extra pipeline settings as JSON (they win over the budget's)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--markdown", type=Path, default=MARKDOWN)
    args = parser.parse_args(argv)
    args.families = [f for f in args.families.split(",") if f]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("onnxcast", "torch.onnx", "onnxscript", "onnx_ir", "great_expectations"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    command = "bench/training_budget.py " + " ".join(sys.argv[1:] if argv is None else argv)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores shared with other work"
    for panel in (p for p in args.panels.split(",") if p):
        for minutes in (float(m) for m in args.minutes.split(",") if m):
            point = run_point(panel, minutes, args) | {"command": command}
            # read at the end of each point: another invocation may have written meanwhile
            results = json.loads(args.results.read_text()) if args.results.exists() else {}
            results = merge(results, point) | {"machine": machine}
            write(results, args.results, args.markdown)
    print(args.markdown.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
