"""`make bench`: PyTorch eager vs every ONNX variant, both families, measured in one process.

Usage::

    .venv/bin/python bench/run.py                 # train briefly into bench/out/run, then measure
    .venv/bin/python bench/run.py --run-dir DIR   # measure an existing pipeline run directory
    .venv/bin/python bench/run.py --quick         # smoke mode: seconds of training, few repeats

For each family, batch (1, 64) and thread count (1, 2) it measures latency p50/p95 after a
warm-up, throughput, peak memory, size, holdout MAE and the achieved GFLOP/s as a fraction
of the machine's float32 GEMM peak measured at the same thread count. Candidates of one
(family, batch, threads) cell are timed in interleaved rounds, so a burst of load from
other processes on these shared 2-core machines hits all of them alike and the ratios stay
comparable. Writes ``bench/results.json`` and ``bench/results.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from flops import model_flops  # noqa: E402

log = logging.getLogger("bench")

BATCHES = (1, 64)
FAMILIES = ("lstm", "transformer")


@dataclass
class Candidate:
    """One thing to time: PyTorch eager or an ONNX variant of one family."""

    family: str
    variant: str
    size_bytes: int
    make: Callable[[int], Callable[[np.ndarray], np.ndarray]]  # threads -> runner
    probe: list[str]  # bench/memprobe.py arguments
    holdout_mae: float | None = None
    parity: float | None = None  # worst |diff|/(atol+rtol*|y|) vs PyTorch, fp32 variants gate on <= 1
    note: str = ""
    times: dict = field(default_factory=dict)  # (batch, threads) -> list of ms


# --- machine ----------------------------------------------------------------------------------

def machine_description() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    isa = [name for name, flag in (("AVX2", " avx2"), ("AVX-512", " avx512f"), ("AVX512-VNNI", " avx512_vnni"),
                                   ("AMX", " amx_tile")) if flag in flags]
    return f"{model}, {os.cpu_count()} cores ({', '.join(isa)}), Linux {platform.release()}"


def gemm_peak_gflops(threads: int, n: int = 1024, repeats: int = 40) -> dict:
    """Best float32 GEMM rate of a square matmul, torch (MKL) and numpy (OpenBLAS).

    Best of many short runs: on a shared machine a long run rarely gets the cores to itself,
    and the peak is what the cores can do, not what they did under someone else's load.
    n = 1024 is large enough for both libraries to reach their plateau on this machine.
    """
    import torch
    from threadpoolctl import threadpool_limits

    result = {}
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    result["torch_mkl"] = _best_rate(lambda: a @ b, 2 * n**3, repeats)
    torch.set_num_threads(previous)
    with threadpool_limits(limits=threads, user_api="blas"):
        x = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
        result["numpy_openblas"] = _best_rate(lambda: x @ x, 2 * n**3, repeats)
    result["peak"] = max(result.values())
    return result


def _best_rate(fn: Callable[[], object], flops: float, repeats: int) -> float:
    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e9


# --- memory -----------------------------------------------------------------------------------

def peak_memory_mib(args: list[str]) -> dict[int, float] | None:
    """Peak RSS growth per batch of one candidate, from bench/memprobe.py in a fresh process."""
    import subprocess

    try:
        done = subprocess.run([sys.executable, str(ROOT / "bench" / "memprobe.py"), *args], capture_output=True,
                              text=True, timeout=300, check=True)
        return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        log.warning("memory probe %s failed: %s", args, exc)
        return None


# --- candidates -------------------------------------------------------------------------------

def torch_candidate(run_dir: Path, cfg, family: str) -> Candidate:
    import torch

    from onnxcast.pipeline.run import family_dir, load_model

    model, _ = load_model(cfg, family)
    size = (family_dir(cfg, family) / "model.pt").stat().st_size

    def make(threads: int):
        torch.set_num_threads(threads)

        def run(history: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return model(torch.from_numpy(history)).numpy()

        return run

    return Candidate(family, "torch", size, make, ["torch", str(run_dir), family], note="eager, inference_mode")


def onnx_candidates(cfg, family: str) -> list[Candidate]:
    from onnxcast.base.files import read_json
    from onnxcast.pipeline.run import family_dir

    onnx_dir = family_dir(cfg, family) / "onnx"
    out = []
    for spec in read_json(onnx_dir / "variants.json"):
        path = onnx_dir / spec["path"]

        def make(threads: int, path: Path = path):
            from onnxcast.pipeline.validate import onnx_session

            session = onnx_session(path, threads=threads, spinning=False)
            return lambda history: session.run(["forecast"], {"history": history})[0]

        probe = ["onnx", str(path), str(cfg.n_features), str(cfg.lookback)]
        out.append(Candidate(family, spec["name"], path.stat().st_size, make, probe, note=spec.get("note", "")))
    return out


# --- measuring --------------------------------------------------------------------------------

def time_interleaved(candidates: list[Candidate], inputs: dict[int, np.ndarray], threads: int,
                     rounds: int, repeats: dict[int, int], warmup: int) -> None:
    """p50/p95 inputs: ``rounds`` x ``repeats[batch]`` timed calls per candidate, interleaved."""
    runners = {c.variant: c.make(threads) for c in candidates}
    for batch, x in inputs.items():
        for c in candidates:
            for _ in range(warmup):
                runners[c.variant](x)
            c.times[(batch, threads)] = []
        for _ in range(rounds):
            for c in candidates:
                run = runners[c.variant]
                # PyTorch's OpenMP workers spin for a while after a parallel region (libgomp's
                # default); let them go to sleep so they do not take a core from the next one
                time.sleep(0.02)
                for _ in range(repeats[batch]):
                    start = time.perf_counter()
                    run(x)
                    c.times[(batch, threads)].append((time.perf_counter() - start) * 1000.0)
    del runners
    gc.collect()


def bench_family(cfg, family: str, threads_list: list[int], rounds: int, repeats: dict[int, int],
                 warmup: int, peaks: dict[int, float]) -> tuple[list[dict], dict]:
    """Rows of one family, and its entry in the shape select_variants reads."""
    from onnxcast.pipeline.metrics import forecast_metrics
    from onnxcast.pipeline.run import _load_data, load_model
    from onnxcast.pipeline.validate import (
        baseline_metrics,
        check_parity,
        holdout_windows,
        onnx_predict,
        parity_shapes,
        sample_histories,
        torch_runner,
    )

    series, split = _load_data(cfg)
    holdout = holdout_windows(cfg, series, split)
    model, spec = load_model(cfg, family)
    flops_per_forecast = model_flops(spec, cfg.lookback)

    candidates = [torch_candidate(cfg.run_dir, cfg, family), *onnx_candidates(cfg, family)]
    reference = torch_runner(model)
    shapes = parity_shapes(cfg.lookback, series.season)
    for c in candidates:
        run = c.make(1)
        predicted = (run(holdout.history) if c.variant == "torch"
                     else onnx_predict(_Session(run), holdout.history))
        c.holdout_mae = forecast_metrics(holdout.actual, predicted.astype(np.float32), holdout.mase_scale)["mae"]
        if c.variant != "torch":
            parity = check_parity(reference, _Session(run), series.values, shapes, cfg.parity_rtol,
                                  cfg.parity_atol, cfg.seed)
            c.parity = parity["worst_tolerance_ratio"]
    fp32_mae = next(c.holdout_mae for c in candidates if c.variant == "fp32")

    rng = np.random.default_rng(cfg.seed)
    inputs = {b: sample_histories(series.values, b, cfg.lookback, rng) for b in BATCHES}
    for threads in threads_list:
        time_interleaved(candidates, inputs, threads, rounds, repeats, warmup)

    memory = {c.variant: peak_memory_mib(c.probe) for c in candidates}

    rows = []
    for c in candidates:
        for threads in threads_list:
            for b in BATCHES:
                times = np.asarray(c.times[(b, threads)])
                p50, p95 = float(np.percentile(times, 50)), float(np.percentile(times, 95))
                achieved = flops_per_forecast * b / (p50 / 1000.0) / 1e9
                torch_p50 = float(np.percentile(candidates[0].times[(b, threads)], 50))
                rows.append({
                    "family": family, "variant": c.variant, "batch": b, "threads": threads,
                    "p50_ms": p50, "p95_ms": p95, "throughput_per_s": b * 1000.0 / p50,
                    "speedup_vs_torch": torch_p50 / p50,
                    "holdout_mae": c.holdout_mae, "mae_vs_fp32": c.holdout_mae / fp32_mae - 1.0,
                    "size_bytes": c.size_bytes, "size_vs_fp32": None,
                    "achieved_gflops": achieved, "gflops_fraction": achieved / peaks[threads],
                    "peak_rss_delta_mib": (memory[c.variant] or {}).get(b), "parity_ratio": c.parity,
                    "samples": len(times), "note": c.note,
                })
    fp32_size = next(c.size_bytes for c in candidates if c.variant == "fp32")
    for row in rows:
        row["size_vs_fp32"] = row["size_bytes"] / fp32_size

    baseline_mae = baseline_metrics(cfg, series, split)["mae"]
    entry = _selection_entry(family, rows, candidates, cfg, threads_list[0], baseline_mae)
    return rows, entry


class _Session:
    """Adapts a runner to the ``session.run`` shape the validate helpers call."""

    def __init__(self, run: Callable[[np.ndarray], np.ndarray]):
        self._run = run

    def run(self, _names, feeds):
        return [self._run(feeds["history"])]


def _selection_entry(family: str, rows: list[dict], candidates: list[Candidate], cfg, threads: int,
                     baseline_mae: float) -> dict:
    """The family's figures at ``threads`` in the report's ``models`` shape, with its gates decided
    by the pipeline's own ``judge_variants`` (parity, accuracy budget, seasonal-naive baseline)."""
    from onnxcast.pipeline.validate import FP32_VARIANTS, gate, judge_variants

    def latency(variant: str) -> dict:
        out = {}
        for r in rows:
            if r["variant"] == variant and r["threads"] == threads:
                out[f"batch{r['batch']}_p50"] = r["p50_ms"]
                out[f"batch{r['batch']}_p95"] = r["p95_ms"]
        return out

    variants = []
    for c in candidates[1:]:
        gates = {}
        if c.variant in FP32_VARIANTS:
            measured = c.parity is not None
            gates["parity"] = gate(measured and c.parity <= 1.0, c.parity if measured else "not measured", 1.0)
        variants.append({"name": c.variant, "size_bytes": c.size_bytes, "holdout": {"mae": c.holdout_mae},
                         "latency_ms": latency(c.variant), "parity_max_abs_diff": None, "gates": gates})
    torch_latency = latency("torch")
    failures = judge_variants(variants, baseline_mae=baseline_mae, torch_latency=torch_latency,
                              accuracy_budget=cfg.accuracy_budget)
    fp32_mae = next(c.holdout_mae for c in candidates if c.variant == "fp32")
    return {"family": family, "torch": {"holdout": {"mae": candidates[0].holdout_mae}, "latency_ms": torch_latency},
            "variants": variants, "fp32_holdout_mae": fp32_mae, "gates_passed": not failures, "failures": failures}


# --- the run directory ------------------------------------------------------------------------

def prepare_run(out_dir: Path, epochs: int, max_minutes: float):
    """Train, export and optimize both families with the pipeline's own steps (no validation:
    this script measures everything itself, in one process)."""
    import torch

    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.data import example_data_path
    from onnxcast.pipeline.run import export_family, optimize_family, prepare_data, train_family

    cfg = PipelineConfig(data_uri=example_data_path(), out_dir=str(out_dir), max_epochs=epochs,
                         max_minutes=max_minutes)
    out_dir.mkdir(parents=True, exist_ok=True)
    # One thread: with another job on the second core, PyTorch's two OpenMP threads made an
    # epoch 30x slower (60 s instead of 2), hit the time cap and left a different model.
    torch.set_num_threads(1)
    prepare_data(cfg)
    for family in cfg.models:
        train_family(cfg, family)
        export_family(cfg, family)
        optimize_family(cfg, family)
    return cfg


def load_run(run_dir: Path, reoptimize: bool):
    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.run import optimize_family

    cfg = PipelineConfig.load(run_dir / "config.json")
    cfg = PipelineConfig.from_dict({**cfg.to_dict(), "out_dir": str(run_dir)})
    if reoptimize:  # rebuild the variants from fp32.onnx with the current onnxcast.pipeline.optimize
        for family in cfg.models:
            optimize_family(cfg, family)
    return cfg


# --- output -----------------------------------------------------------------------------------

def write_markdown(results: dict, path: Path) -> None:
    lines = [
        f"Benchmark of {results['date']} on {results['machine']}.",
        f"Lookback {results['lookback']}, horizon {results['horizon']}; float32 GEMM peak "
        + ", ".join(f"{v:.0f} GFLOP/s at {t} thread(s)" for t, v in results["gemm_peak_gflops_by_threads"].items())
        + f". ORT: {results['ort_session']}; PyTorch: {results['torch_mode']}. Memory: {results['memory_method']}.",
        "",
        "| family | variant | threads | batch | p50 ms | p95 ms | forecasts/s | x torch | holdout MAE | "
        "MAE vs fp32 | size KiB | GEMM peak | peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        mem = "" if r["peak_rss_delta_mib"] is None else f"{r['peak_rss_delta_mib']:.1f}"
        lines.append(
            f"| {r['family']} | {r['variant']} | {r['threads']} | {r['batch']} | {r['p50_ms']:.3f} | "
            f"{r['p95_ms']:.3f} | {r['throughput_per_s']:.0f} | {r['speedup_vs_torch']:.2f} | "
            f"{r['holdout_mae']:.2f} | {100 * r['mae_vs_fp32']:+.2f}% | {r['size_bytes'] / 1024:.0f} | "
            f"{100 * r['gflops_fraction']:.1f}% | {mem} |")
    lines += ["", f"Selected at {results['threads'][0]} thread(s): "
              + ", ".join(f"{ch} = {s['family']} {s['variant']}" for ch, s in results["selected"].items()), ""]
    lines += ["| goal | value | met |", "|---|---|---|"]
    for g in results["goals"]:
        lines.append(f"| {g['goal']} | {g['value']} | {'yes' if g['met'] else 'no'} |")
    lines.append("")
    path.write_text("\n".join(lines))


def goals(rows: list[dict], selected_by_family: dict[str, dict], threads: int) -> list[dict]:
    """The issue's goals for each family's chosen edge (batch 1) and cloud (batch 64) variant."""
    def row(family: str, variant: str, batch: int) -> dict:
        return next(r for r in rows if r["family"] == family and r["variant"] == variant
                    and r["batch"] == batch and r["threads"] == threads)

    out = []
    for family, chosen in selected_by_family.items():
        for channel, batch, target in (("edge", 1, 3.0), ("cloud", 64, 1.5)):
            variant = chosen.get(channel)
            if not variant:
                out.append({"goal": f"{family} {channel}: a variant qualifies", "value": "none", "met": False})
                continue
            r = row(family, variant, batch)
            out.append({"goal": f"{family} {channel} ({variant}) >= {target}x torch at batch {batch}",
                        "value": f"{r['speedup_vs_torch']:.2f}x", "met": r["speedup_vs_torch"] >= target})
            out.append({"goal": f"{family} {channel} ({variant}) MAE within 1% of fp32",
                        "value": f"{100 * r['mae_vs_fp32']:+.2f}%", "met": r["mae_vs_fp32"] <= 0.01})
    for family in selected_by_family:
        fastest = max((r for r in rows if r["family"] == family and r["batch"] == 64 and r["threads"] == threads
                       and r["variant"] != "torch"), key=lambda r: r["gflops_fraction"])
        if family == "lstm":
            out.append({"goal": f"lstm batch 64 >= 60% of GEMM peak (best: {fastest['variant']})",
                        "value": f"{100 * fastest['gflops_fraction']:.1f}%", "met": fastest["gflops_fraction"] >= 0.6})
        int8 = [r for r in rows if r["family"] == family and r["variant"] == "int8"]
        if int8:
            out.append({"goal": f"{family} int8 size <= 30% of fp32", "value": f"{100 * int8[0]['size_vs_fp32']:.1f}%",
                        "met": int8[0]["size_vs_fp32"] <= 0.30})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, help="an existing pipeline run directory to measure")
    parser.add_argument("--reoptimize", action="store_true", help="rebuild the variants of --run-dir first")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out" / "run",
                        help="where to train when --run-dir is not given")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-minutes", type=float, default=1.0,
                        help="training time cap per family (keeps make bench under 10 minutes)")
    parser.add_argument("--threads", default="1,2", help="comma-separated intra-op thread counts")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per (batch, threads)")
    parser.add_argument("--quick", action="store_true", help="smoke mode: seconds of training, few repeats")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "bench" / "results.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("torch").setLevel(logging.ERROR)
    started = time.monotonic()

    threads_list = [int(t) for t in args.threads.split(",")]
    if args.quick:
        repeats, rounds, warmup = {1: 5, 64: 1}, 2, 2
    else:
        repeats, rounds, warmup = {1: 40, 64: 4}, args.rounds, 5

    if args.run_dir:
        cfg = load_run(args.run_dir, args.reoptimize)
    else:
        cfg = prepare_run(args.out_dir, 1 if args.quick else args.epochs, 0.05 if args.quick else args.train_minutes)
    log.info("run directory %s ready after %.0fs", cfg.run_dir, time.monotonic() - started)

    peaks = {}
    for threads in threads_list:
        peaks[threads] = gemm_peak_gflops(threads, repeats=5 if args.quick else 40)
        log.info("float32 GEMM peak at %d thread(s): %s", threads, {k: round(v, 1) for k, v in peaks[threads].items()})

    from onnxcast.pipeline.report import select_variants

    rows, entries = [], []
    for family in cfg.models:
        family_rows, entry = bench_family(cfg, family, threads_list, rounds, repeats, warmup,
                                          {t: p["peak"] for t, p in peaks.items()})
        rows += family_rows
        entries.append(entry)
        for r in family_rows:
            log.info("%-11s %-8s t%d b%-2d p50 %8.3f ms  x%.2f  MAE %.2f  %.1f%% peak", r["family"], r["variant"],
                     r["threads"], r["batch"], r["p50_ms"], r["speedup_vs_torch"], r["holdout_mae"],
                     100 * r["gflops_fraction"])

    selected, ranking = select_variants(entries)
    per_family = {e["family"]: dict(zip(("edge", "cloud"), _best_per_family(e), strict=True))
                  for e in entries}

    import onnxruntime
    import torch

    results = {
        "date": dt.date.today().isoformat(),
        "machine": machine_description(),
        "threads": threads_list,
        "gemm_peak_gflops": peaks[threads_list[0]]["peak"],
        "gemm_peak_gflops_by_threads": {t: p["peak"] for t, p in peaks.items()},
        "gemm_peak_detail": peaks,
        "lookback": cfg.lookback, "horizon": cfg.horizon,
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
        "ort_session": "CPUExecutionProvider, intra-op threads as listed, inter-op 1, spinning off",
        "torch_mode": f"eager, torch.set_num_threads as listed, inference_mode, "
                      f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}",
        "memory_method": "peak RSS growth (VmHWM) over the size after imports, in a fresh process per "
                         "candidate: loading the model, then runs at batch 1, then at 64 (1 thread)",
        "timing": {"rounds": rounds, "repeats_per_round": repeats, "warmup": warmup, "quick": args.quick},
        "flops_per_forecast": {e["family"]: model_flops(_spec(cfg, e["family"]), cfg.lookback) for e in entries},
        "rows": rows,
        "selected": selected,
        "selected_per_family": per_family,
        "ranking": ranking,
        "gates": {e["family"]: {"passed": e["gates_passed"], "failures": e["failures"],
                                "variants": {v["name"]: v["gates"] for v in e["variants"]}} for e in entries},
        "goals": goals(rows, per_family, threads_list[0]),
        "seconds": round(time.monotonic() - started, 1),
    }
    from onnxcast.base.files import write_json

    write_json(args.results, results)
    write_markdown(results, args.markdown)
    log.info("wrote %s and %s in %.0fs", args.results, args.markdown, time.monotonic() - started)
    print(args.markdown.read_text())
    return 0


def _best_per_family(entry: dict) -> tuple[str | None, str | None]:
    """Each channel's choice when only this family is allowed (for the per-family goals)."""
    from onnxcast.pipeline.report import select_variants

    selected, _ = select_variants([entry])
    return tuple((selected.get(ch) or {}).get("variant") for ch in ("edge", "cloud"))


def _spec(cfg, family: str):
    from onnxcast.base.files import read_json
    from onnxcast.pipeline.models import ModelSpec
    from onnxcast.pipeline.run import family_dir

    return ModelSpec(**read_json(family_dir(cfg, family) / "model.json")["spec"])


if __name__ == "__main__":
    sys.exit(main())
