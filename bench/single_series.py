"""Single series of the M1/M3 competitions, one at a time through `onnxcast pipeline`: how many
ship, and what they ship against the seasonal naive (issue 30, item 2).

The first release refused every family of single monthly series on interval coverage alone,
while their forecasts beat the seasonal naive: a moving-block bootstrap over overlapping rolling
origins (about one independent window) gave the coverage an interval a few tenths of a point
wide. This bench runs the same series through two copies of the code (``--code``: a checkout of
the earlier code; default: this one) and compares.

run: per panel kind, a seeded sample of ``--series`` series long enough for the settings below,
each written as ``ds,y`` (the synthetic end-aligned calendar of tests/real_panels.py) and run
with ``onnxcast.cli.main`` (the console script's function) in one worker process per panel, whose
``onnxcast`` is imported from ``--code``:

    onnxcast pipeline --data <series>.csv --out <run> --models nhits,dlinear --horizon <h>
        --lookback <2 seasons> --holdout-windows 1 --max-epochs 30 --latency-repeats 3

``h`` is the competition's test length (18 monthly, 8 quarterly); ``--holdout-windows 1`` lets the
holdout be a single horizon when 15% of the series is shorter (the competitions' test period).
Recorded per series: the exit code and error line, the family and variant shipped (report.json's
cloud channel) with its holdout MAE, every family's fp32 MAE, gates and interval status (from
report.json or failed-report.json), and the seasonal naive's MAE on the same holdout origins.

table: per panel kind and code, how many series ship, how many were refused on interval
coverage alone, the total holdout MAE of what ships against the seasonal naive on the same
series, and the MAE a user is left with over every series (the seasonal naive where nothing ships).

simulate: the false-refusal rate of the coverage gate as it stood (tolerance 5 points or outside
the moving-block bootstrap interval) on a perfectly calibrated 80% interval, by the number of
independent holdout windows: what intervals.MIN_INDEPENDENT_WINDOWS rests on.

    .venv/bin/python bench/single_series.py run --code /tmp/onnxcast-before --label before
    .venv/bin/python bench/single_series.py run --label after
    .venv/bin/python bench/single_series.py table
    .venv/bin/python bench/single_series.py simulate

Results: bench/single-series-results.json (a run replaces its label's section) and
bench/single-series-results.md; the table is quoted in docs/intervals.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import io
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "single-series-results.json"
MARKDOWN = REPO / "bench" / "single-series-results.md"
PANELS = ("m3-monthly", "m3-quarterly", "m1-monthly", "m1-quarterly")
FAMILIES = "nhits,dlinear"
MAX_EPOCHS = 30
SEED = 0


def load_panels_module():
    """tests/real_panels.py, loaded by path (the bench is not a package and must not import tests)."""
    path = REPO / "tests" / "real_panels.py"
    spec = importlib.util.spec_from_file_location("onnxcast_bench_real_panels", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --- run: the series through one copy of the code -----------------------------------------------

def settings_for(panel) -> dict:
    """The command's settings for a panel: the competition's horizon, two seasons of history."""
    return {"horizon": panel.horizon, "lookback": 2 * panel.season, "season": panel.season}


def rows_needed(n_rows: int, horizon: int, lookback: int) -> bool:
    """Whether a series of ``n_rows`` has room for the pipeline's split (fleet_data.split_fleet of one series, with
    --holdout-windows 1 and the default 15% validation and holdout shares)."""
    holdout = max(round(n_rows * 0.15), horizon)
    validation = max(round(n_rows * 0.15), 2 * horizon)
    return n_rows - holdout - validation >= lookback + 2 * horizon


def pick_series(panel, count: int, seed: int = SEED) -> list[str]:
    """A seeded sample of ``count`` series ids of the panel long enough for the settings."""
    s = settings_for(panel)
    lengths = panel.frame.groupby("unique_id", sort=True).size()
    eligible = sorted(i for i, n in lengths.items() if rows_needed(int(n), s["horizon"], s["lookback"]))
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(eligible), min(count, len(eligible)), replace=False)
    return [eligible[i] for i in sorted(chosen)]


def run_panel(name: str, count: int, code: Path | None, work: Path, families: str = FAMILIES) -> list[dict]:
    """Write the panel's sampled series and run them in one worker process importing ``code``."""
    panels = load_panels_module()
    panel = panels.load_panel(name)
    s = settings_for(panel)
    jobs = []
    for series in pick_series(panel, count):
        frame = panel.frame[panel.frame["unique_id"] == series][["ds", "y"]]
        data = work / name / f"{series}.csv"
        data.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(data, index=False)
        argv = ["pipeline", "--data", str(data), "--out", str(work / name / f"run-{series}"),
                "--models", families, "--horizon", str(s["horizon"]), "--lookback", str(s["lookback"]),
                "--holdout-windows", "1", "--max-epochs", str(MAX_EPOCHS), "--latency-repeats", "3"]
        jobs.append({"panel": name, "series": series, "rows": len(frame), "season": s["season"], "argv": argv})
    jobs_file = work / name / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    out_file = work / name / "results.json"
    command = [sys.executable, str(Path(__file__).resolve()), "worker", "--jobs", str(jobs_file), "--out",
               str(out_file)]
    if code is not None:
        command += ["--code", str(code)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(work / name / "worker.log", "wb") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    return json.loads(out_file.read_text())


def worker(jobs_file: Path, out_file: Path, code: Path | None) -> None:
    """Run every job with ``onnxcast.cli.main`` in this process, ``onnxcast`` imported from
    ``code`` (the editable install's finder is dropped so that the path wins)."""
    if code is not None:
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "").lower()]
        sys.path.insert(0, str(code))
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # the command's own basicConfig is then a no-op
    from onnxcast import cli

    results = []
    for job in json.loads(jobs_file.read_text()):
        started = time.monotonic()
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code_ = cli.main(job["argv"])
        errors = [line for line in stderr.getvalue().splitlines() if line.startswith("error:")]
        out = Path(job["argv"][job["argv"].index("--out") + 1])
        record = {k: job[k] for k in ("panel", "series", "rows", "season")}
        record.update(exit_code=code_, error=errors[0][:400] if errors else None,
                      seconds=round(time.monotonic() - started, 1), **read_outcome(out, job["season"]))
        print(json.dumps({k: record[k] for k in ("panel", "series", "exit_code", "shipped")}), file=sys.stderr,
              flush=True)
        results.append(record)
    out_file.write_text(json.dumps(results, indent=1))
    sys.stderr.write(f"onnxcast from {cli.__file__}\n")


def read_outcome(out: Path, season: int) -> dict:
    """What a run left: shipped family/variant and MAE, every family's fp32 figures, baselines."""
    path = next((p for p in (out / "report.json", out / "failed-report.json") if p.exists()), None)
    if path is None:
        return {"shipped": None, "families": {}, "seasonal_naive_mae": None, "best_baseline": None}
    report = json.loads(path.read_text())
    baselines = report.get("baselines") or {}
    candidates = baselines.get("candidates") or {}
    snaive = candidates.get(f"seasonal_naive_{season}") or {}
    families = {}
    for model in report.get("models", []):
        fp32 = next((v for v in model["variants"] if v["name"] == "fp32"), {})
        coverage = (fp32.get("gates") or {}).get("interval_coverage") or {}
        families[model["family"]] = {
            "fp32_mae": model.get("fp32_holdout_mae"), "gates_passed": model.get("gates_passed"),
            "failures": [f[:200] for f in model.get("failures", [])],
            "beats_baseline": ((fp32.get("gates") or {}).get("beats_seasonal_naive") or {}).get("passed"),
            "coverage": coverage.get("coverage"), "coverage_judged": coverage.get("judged", True),
            "intervals": (model.get("intervals") or {}).get("status"),
            "independent_windows": coverage.get("independent_windows")}
    shipped = None
    choice = (report.get("selected") or {}).get("cloud") if path.name == "report.json" else None
    if choice:
        variant = next(v for m in report["models"] if m["family"] == choice["family"] for v in m["variants"]
                       if v["name"] == choice["variant"])
        shipped = {"family": choice["family"], "variant": choice["variant"], "mae": variant["holdout"]["mae"],
                   "intervals": variant.get("intervals_status")}
    return {"shipped": shipped, "families": families, "seasonal_naive_mae": snaive.get("mae"),
            "best_baseline": {"name": baselines.get("best"), "mae": (baselines.get("seasonal_naive") or {}).get("mae")},
            "origins": (baselines.get("origins") or {}).get("count")}


# --- table ---------------------------------------------------------------------------------

def summarize(records: list[dict]) -> dict:
    """Ship counts and MAE totals of one panel kind under one copy of the code."""
    shipped = [r for r in records if r.get("shipped")]
    # nothing shipped, yet some family beat the baseline and failed nothing but the coverage gate
    coverage_only = [r for r in records if not r.get("shipped") and r.get("exit_code") == 3
                     and any(f["beats_baseline"] and f["failures"] and all("interval covers" in x for x in f["failures"])
                             for f in r["families"].values())]
    snaive = [r for r in records if r.get("seasonal_naive_mae") is not None]
    served = sum(r["shipped"]["mae"] if r.get("shipped") else r["seasonal_naive_mae"] for r in snaive)
    return {
        "series": len(records), "shipped": len(shipped), "refused_on_coverage_alone": len(coverage_only),
        "exit_codes": {str(c): sum(r["exit_code"] == c for r in records) for c in sorted({r["exit_code"] for r in records})},
        "shipped_mae_total": round(sum(r["shipped"]["mae"] for r in shipped), 4),
        "shipped_seasonal_naive_mae_total": round(sum(r["seasonal_naive_mae"] for r in shipped), 4),
        "served_mae_total": round(served, 4),
        "seasonal_naive_mae_total": round(sum(r["seasonal_naive_mae"] for r in snaive), 4),
        "intervals": {s: sum((r.get("shipped") or {}).get("intervals") == s for r in shipped)
                      for s in sorted({str((r.get("shipped") or {}).get("intervals")) for r in shipped})},
    }


def markdown(results: dict) -> str:
    runs = results.get("runs") or {}
    lines = ["# Single series of M1/M3 through `onnxcast pipeline` (bench/single_series.py)", ""]
    for label, section in runs.items():
        lines.append(f"- {label}: `{section['command']}` ({section['date']}, {section['machine']}, code: "
                     f"{section['code']})")
    lines += ["", "| panel | code | series | ship | refused on coverage alone | shipped MAE total (seasonal naive on "
              "the same series) | served MAE total, seasonal naive where nothing ships (seasonal naive) |",
              "|---|---|---|---|---|---|---|"]
    for panel in PANELS:
        for label, section in runs.items():
            records = [r for r in section["records"] if r["panel"] == panel]
            if not records:
                continue
            s = summarize(records)
            ratio = (f" x{s['shipped_mae_total'] / s['shipped_seasonal_naive_mae_total']:.2f}"
                     if s["shipped_seasonal_naive_mae_total"] else "")
            lines.append(f"| {panel} | {label} | {s['series']} | {s['shipped']} | {s['refused_on_coverage_alone']} | "
                         f"{s['shipped_mae_total']:,.0f} ({s['shipped_seasonal_naive_mae_total']:,.0f}){ratio} | "
                         f"{s['served_mae_total']:,.0f} ({s['seasonal_naive_mae_total']:,.0f}) |")
    simulation = results.get("simulate")
    if simulation:
        lines += ["", f"Coverage gate as it stood, on a perfectly calibrated 80% interval ({simulation['what']}):", "",
                  "| horizon | AR | " + " | ".join(f"{k} windows" for k in simulation["windows"]) + " |",
                  "|---|---|" + "---|" * len(simulation["windows"])]
        for row in simulation["rows"]:
            lines.append(f"| {row['horizon']} | {row['ar']} | " + " | ".join(f"{r:.0%}" for r in row["refused"]) + " |")
    return "\n".join(lines) + "\n"


# --- simulate: the gate's false refusals by independent windows ------------------------------

def false_refusals(windows: int, horizon: int, season: int, ar: float, trials: int, seed: int) -> float:
    """The share of ``trials`` in which the coverage gate as it stood refused a perfectly calibrated
    80% interval on ``windows`` independent holdout windows (the pipeline's rolling origins over
    ``windows * horizon`` rows). Forecast errors: a shared AR(1) shock per target step (every
    origin's forecast of that step shares it) plus independent noise, variance 1 everywhere."""
    from onnxcast.pipeline.evaluation import origin_stride
    from onnxcast.pipeline.intervals import coverage_failures
    from onnxcast.pipeline.significance import block_bootstrap_interval

    rng = np.random.default_rng(seed)
    rows = windows * horizon
    stride = origin_stride(horizon, (season,), rows - horizon + 1)
    origins = np.arange(0, rows - horizon + 1, stride)
    block = max(1, math.ceil(horizon / stride))
    limit = 1.2815515655446004  # the standard normal's 90% quantile: the central 80% interval
    index = origins[:, None] + np.arange(horizon)[None, :]
    refused = 0
    for trial in range(trials):
        shocks = rng.standard_normal(rows + 50)
        latent = np.zeros(rows + 50)
        for t in range(1, rows + 50):
            latent[t] = ar * latent[t - 1] + math.sqrt(1 - ar * ar) * shocks[t]
        errors = math.sqrt(0.7) * latent[50:][index] + math.sqrt(0.3) * rng.standard_normal(index.shape)
        inside = np.abs(errors) <= limit
        figures = {"coverage_80": float(inside.mean()),
                   "coverage_80_ci95": block_bootstrap_interval(inside.mean(axis=1).astype(np.float64), block, seed=trial)}
        refused += bool(coverage_failures(figures, 0.05))
    return refused / trials


def simulate(trials: int) -> dict:
    windows = [2, 4, 10, 20, 30]
    cases = [(24, 12, 0.7), (8, 4, 0.5), (24, 24, 0.8), (18, 12, 0.9)]
    rows = [{"horizon": h, "season": m, "ar": ar,
             "refused": [false_refusals(k, h, m, ar, trials, seed=1) for k in windows]} for h, m, ar in cases]
    return {"what": f"{trials} trials each; AR(1) forecast errors shared across origins; the pipeline's origins and "
                    "block; gate: more than 5 points off nominal and nominal outside the bootstrap interval",
            "windows": windows, "rows": rows}


# --- main ----------------------------------------------------------------------------------

def write(results: dict, json_path: Path, markdown_path: Path) -> None:
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    markdown_path.write_text(markdown(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="JSON results (a run replaces its section)")
    parser.add_argument("--markdown", type=Path, default=MARKDOWN, help="Markdown tables")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the sampled series through one copy of the code")
    run.add_argument("--label", required=True, help="the results section: before, after")
    run.add_argument("--code", type=Path, help="a checkout whose onnxcast to import (default: this one)")
    run.add_argument("--panels", default=",".join(PANELS))
    run.add_argument("--series", type=int, default=12, help="series per panel kind")
    run.add_argument("--families", default=FAMILIES, help=f"the runs' --models (default {FAMILIES})")
    run.add_argument("--work", type=Path, help="folder for the series and runs (default: a temporary one)")
    sub.add_parser("table", help="write the Markdown table from the results")
    sim = sub.add_parser("simulate", help="the old coverage gate's false refusals by independent windows")
    sim.add_argument("--trials", type=int, default=300)
    work = sub.add_parser("worker", help=argparse.SUPPRESS)
    work.add_argument("--jobs", type=Path, required=True)
    work.add_argument("--out", type=Path, required=True)
    work.add_argument("--code", type=Path)
    args = parser.parse_args(argv)

    if args.command == "worker":
        worker(args.jobs, args.out, args.code)
        return 0
    command = "bench/single_series.py " + " ".join(sys.argv[1:] if argv is None else argv)
    header = {"date": dt.date.today().isoformat(), "command": command,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"}
    if args.command == "run":
        with tempfile.TemporaryDirectory(prefix="onnxcast-bench-single-") as scratch:
            folder = args.work or Path(scratch)
            records = []
            for name in [p for p in args.panels.split(",") if p]:
                records += run_panel(name, args.series, args.code, folder, args.families)
                print(f"{name}: {sum(bool(r['shipped']) for r in records if r['panel'] == name)} of "
                      f"{sum(r['panel'] == name for r in records)} shipped", flush=True)
        section = {"runs": {args.label: {**header, "code": str(args.code or REPO), "families": args.families,
                                         "max_epochs": MAX_EPOCHS, "records": records}}}
    elif args.command == "simulate":
        section = {"simulate": {**header, **simulate(args.trials)}}
    else:
        section = {}
    # read again: a run of the other label may have finished while this one ran
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    results.setdefault("runs", {}).update(section.pop("runs", {}))
    results.update(section)
    write(results, args.results, args.markdown)
    print(args.markdown.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
