"""`make bench`: PyTorch eager vs every ONNX variant, both families, measured in one process.

Usage::

    .venv/bin/python bench/run.py                 # train briefly into bench/out/run, then measure
    .venv/bin/python bench/run.py --run-dir DIR   # measure an existing pipeline run directory
    .venv/bin/python bench/run.py --quick         # smoke mode: seconds of training, few repeats

For each family, batch (1, 64, and 1,024: a fleet) and thread count (1, 2) it measures latency
p50/p95 after a warm-up, throughput, peak memory, size, holdout MAE, and how far each variant
is from the machine's limit for that model: a roofline from the FLOPs and bytes of one forecast
(counted on the exported graph, bench/flops.py), the float32 GEMM peak and the memory bandwidth
measured at the same thread count. Candidates of one (family, batch, threads) cell are timed
in interleaved rounds, so a burst of load from other processes on these shared 2-core machines
hits all of them alike and the ratios stay comparable; the load average before and after says
whether the run was disturbed. Writes ``bench/results.json`` and ``bench/results.md``.
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

from flops import graph_cost  # noqa: E402
from training import render as render_training  # noqa: E402
from training import training_throughput  # noqa: E402

from onnxcast.base.batches import CHUNK_ROWS, run_in_chunks  # noqa: E402
from onnxcast.pipeline.config import DEFAULT_FAMILIES  # noqa: E402
from onnxcast.pipeline.ensemble import ENSEMBLE, ensemble_last  # noqa: E402

log = logging.getLogger("bench")

BATCHES = (1, 64, 1024)
FLEET_BATCH = 1024  # a fleet is served at batch sizes of hundreds to thousands
OPENVINO_VARIANT = "openvino-fp32"  # the openvino deployment target: fp32.onnx on OpenVINO (docs/targets.md)
# A run is "disturbed" when other work held a core: the 1-minute load average over this before
# the run, or over this after it (the benchmark itself keeps one core busy).
QUIET_LOAD_BEFORE, QUIET_LOAD_AFTER = 0.5, 1.5


@dataclass
class Candidate:
    """One thing to time: PyTorch eager or an ONNX variant of one family."""

    family: str
    variant: str
    size_bytes: int
    make: Callable[[int], Callable[[np.ndarray], np.ndarray]]  # threads -> runner
    probe: list[str]  # bench/memprobe.py arguments
    holdout_mae: float | None = None
    parity: float | None = None  # worst validate.tolerance_ratios vs PyTorch, fp32 variants gate on <= 1
    note: str = ""
    times: dict = field(default_factory=dict)  # (batch, threads) -> list of ms
    path: Path | None = None  # the ONNX file (None: PyTorch eager)
    runtime: str = "onnxruntime"  # what runs it: torch, onnxruntime, openvino (the deployment target)


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


def int8_gemm_peak(threads: int, n: int = 1024, repeats: int = 20) -> float:
    """Best rate (GOP/s) of ONNX Runtime's uint8 x int8 ``MatMulInteger`` at ``n``: what the
    int8 kernels (VNNI, AMX) can do, the ceiling of an int8 variant's products."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.integers(-64, 64, (n, n)).astype(np.int8), "w")
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "peak",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, n])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [None, n])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    a = rng.integers(0, 255, (n, n)).astype(np.uint8)
    return _best_rate(lambda: session.run(None, {"a": a}), 2 * n**3, repeats)


def memory_bandwidth_gbs(threads: int, mib: int = 1024, repeats: int = 5) -> float:
    """Best copy rate (GB/s, bytes read plus bytes written) of a ``mib`` MiB tensor at
    ``threads`` threads: larger than any cache here, so it is the memory's bandwidth."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    source = torch.ones(mib * 1024 * 1024 // 4)
    target = torch.empty_like(source)
    try:
        return _best_rate(lambda: target.copy_(source), 2 * source.numel() * 4, repeats)
    finally:
        torch.set_num_threads(previous)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


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

    from onnxcast.pipeline.checkpoint import load_model

    model, _ = load_model(cfg, family)
    size = (cfg.layout.family(family) / "model.pt").stat().st_size

    def make(threads: int):
        torch.set_num_threads(threads)
        chunked: dict[int, bool] = {}  # batch size -> whether chunks of CHUNK_ROWS were faster

        def one_call(history: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return model(torch.from_numpy(history)).numpy()

        def in_chunks(history: np.ndarray) -> np.ndarray:
            return np.concatenate([one_call(history[i : i + CHUNK_ROWS]) for i in range(0, len(history), CHUNK_ROWS)])

        def run(history: np.ndarray) -> np.ndarray:
            # the stronger peer: a large batch in one call or in ONNX Runtime's chunks, whichever
            # this model runs faster (PyTorch in chunks of 128: Transformer faster, N-HiTS slower)
            if len(history) <= CHUNK_ROWS:
                return one_call(history)
            if len(history) not in chunked:
                chunked[len(history)] = _seconds(in_chunks, history) < _seconds(one_call, history)
            return (in_chunks if chunked[len(history)] else one_call)(history)

        return run

    return Candidate(family, "torch", size, make, ["torch", str(run_dir), family],
                     note=f"eager, inference_mode; above {CHUNK_ROWS} rows one call or chunks, the faster",
                     runtime="torch")


def _seconds(fn: Callable[[np.ndarray], object], history: np.ndarray, repeats: int = 3) -> float:
    """The best of ``repeats`` timed calls (after one untimed)."""
    fn(history)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(history)
        best = min(best, time.perf_counter() - start)
    return best


def onnx_candidates(cfg, family: str) -> list[Candidate]:
    from onnxcast.base.files import read_json
    onnx_dir = cfg.layout.family(family) / "onnx"
    out = []
    for spec in read_json(onnx_dir / "variants.json"):
        path = onnx_dir / spec["path"]

        def make(threads: int, path: Path = path):
            from onnxcast.pipeline.sessions import onnx_session

            session = onnx_session(path, threads=threads, spinning=False)
            # as onnxcast runs a fleet: cache-sized chunks (onnxcast.base.batches)
            return lambda history: run_in_chunks(session, ["forecast"], history)[0]

        probe = ["onnx", str(path), str(cfg.n_features), str(cfg.lookback)]
        out.append(Candidate(family, spec["name"], path.stat().st_size, make, probe, note=spec.get("note", ""),
                             path=path))
    return out


def openvino_candidate(cfg, family: str) -> Candidate | None:
    """The fp32 ONNX file run by OpenVINO as the ``openvino`` deployment target runs it on a device
    (onnxcast.rollout.device_runtime.OpenVinoSession: CPU device, f32 precision hint, one history row
    per inference where the model reads features), in the same chunks as ONNX Runtime; None where
    openvino is not installed."""
    import importlib.util

    if importlib.util.find_spec("openvino") is None:
        log.warning("openvino is not installed: no OpenVINO rows")
        return None
    path = cfg.layout.family(family) / "onnx" / "fp32.onnx"

    def make(threads: int):
        from onnxcast.rollout.device_runtime import OpenVinoSession

        session = OpenVinoSession(path, threads)
        return lambda history: run_in_chunks(session, ["forecast"], history)[0]

    probe = ["openvino", str(path), str(cfg.n_features), str(cfg.lookback)]
    return Candidate(family, OPENVINO_VARIANT, path.stat().st_size, make, probe, path=path, runtime="openvino",
                     note="fp32.onnx on OpenVINO's CPU device, f32 hint"
                          + (", row by row (features)" if cfg.n_features > 1 else ""))


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
                 warmup: int, machine: dict) -> tuple[list[dict], dict]:
    """Rows of one family, and its entry in the shape select_variants reads."""
    from onnxcast.pipeline.checkpoint import load_model
    from onnxcast.pipeline.fleet_data import load_split
    from onnxcast.pipeline.metrics import forecast_metrics
    from onnxcast.pipeline.sessions import onnx_predict
    from onnxcast.pipeline.validate import (
        check_parity,
        holdout_windows,
        parity_shapes,
        sample_histories,
        torch_runner,
    )

    series, split = load_split(cfg.layout.fleet, cfg)
    holdout = holdout_windows(cfg, series, split)
    model, spec = load_model(cfg, family)

    candidates = [torch_candidate(cfg.run_dir, cfg, family), *onnx_candidates(cfg, family)]
    candidates += [c for c in (openvino_candidate(cfg, family),) if c is not None]
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
    fp32_path = cfg.layout.family(family) / "onnx" / "fp32.onnx"
    cost = {b: graph_cost(fp32_path, inputs[b]) for b in BATCHES}  # the family's work
    # each variant's own graph, for its roofline: quantized products at the int8 peak
    own = {(c.variant, b): cost[b] if c.path is None else graph_cost(c.path, inputs[b])
           for c in candidates for b in BATCHES}
    for threads in threads_list:
        time_interleaved(candidates, inputs, threads, rounds, repeats, warmup)

    memory = {c.variant: peak_memory_mib(c.probe) for c in candidates}

    rows = []
    for c in candidates:
        for threads in threads_list:
            peak, bandwidth = machine["gemm_peak_gflops"][threads], machine["memory_bandwidth_gbs"][threads]
            int8_peak = machine["int8_gemm_peak_gops"][threads]
            for b in BATCHES:
                times = np.asarray(c.times[(b, threads)])
                p50, p95 = float(np.percentile(times, 50)), float(np.percentile(times, 95))
                torch_p50 = float(np.percentile(candidates[0].times[(b, threads)], 50))
                flops = cost[b]["flops"] * b
                int8_ops, moved = own[(c.variant, b)]["int8_ops"] * b, own[(c.variant, b)]["bytes"] * b
                compute_s = (own[(c.variant, b)]["flops"] * b - int8_ops) / (peak * 1e9) + int8_ops / (int8_peak * 1e9)
                roofline_ms = 1000.0 * max(compute_s, moved / (bandwidth * 1e9))
                rows.append({
                    "family": family, "variant": c.variant, "runtime": c.runtime, "batch": b, "threads": threads,
                    "p50_ms": p50, "p95_ms": p95, "throughput_per_s": b * 1000.0 / p50,
                    "speedup_vs_torch": torch_p50 / p50,
                    "holdout_mae": c.holdout_mae, "mae_vs_fp32": c.holdout_mae / fp32_mae - 1.0,
                    "size_bytes": c.size_bytes, "size_vs_fp32": None,
                    "achieved_gflops": flops / (p50 / 1000.0) / 1e9, "gflops_fraction": flops / (p50 / 1000.0) / 1e9 / peak,
                    "roofline_ms": roofline_ms, "x_roofline": p50 / roofline_ms,
                    "int8_ops_per_forecast": own[(c.variant, b)]["int8_ops"],
                    "roofline_bound": "compute" if compute_s >= moved / (bandwidth * 1e9) else "memory",
                    "peak_rss_delta_mib": (memory[c.variant] or {}).get(b), "parity_ratio": c.parity,
                    "samples": len(times), "note": c.note,
                })
    fp32_size = next(c.size_bytes for c in candidates if c.variant == "fp32")
    for row in rows:
        row["size_vs_fp32"] = row["size_bytes"] / fp32_size

    from onnxcast.pipeline.validate import baseline_metrics

    baseline_mae = baseline_metrics(cfg, series, split)["mae"]
    entry = _selection_entry(family, rows, candidates, cfg, threads_list[0], baseline_mae)
    # the speed goals' choice: parity and the accuracy budget against fp32, not the baseline (a
    # model trained for 3 epochs need not beat the seasonal naive to be timed)
    entry["speed_entry"] = _selection_entry(family, rows, candidates, cfg, threads_list[0], float("inf"))
    entry["cost_per_forecast"] = {str(b): {k: v for k, v in cost[b].items() if k != "by_op"} for b in BATCHES}
    entry["flops_by_op"] = cost[FLEET_BATCH]["by_op"]
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
        if c.runtime != "onnxruntime":  # another runtime of the same fp32 graph: timed, not a variant to choose
            continue
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

    from onnxcast.pipeline.config import PipelineConfig, example_data_path
    from onnxcast.pipeline.run import export_family, optimize_family, prepare_data, train_family

    # the four families and their ensemble (its latency against its members', ensemble_latency)
    cfg = PipelineConfig(data_uri=example_data_path(), out_dir=str(out_dir), max_epochs=epochs,
                         max_minutes=max_minutes, models=(*DEFAULT_FAMILIES, ENSEMBLE))
    out_dir.mkdir(parents=True, exist_ok=True)
    # One thread: with another job on the second core, PyTorch's two OpenMP threads made an
    # epoch 30x slower (60 s instead of 2), hit the time cap and left a different model.
    torch.set_num_threads(1)
    prepare_data(cfg)
    for family in ensemble_last(cfg.models):
        if "skipped" in train_family(cfg, family):
            continue
        export_family(cfg, family)
        optimize_family(cfg, family)
    return cfg


def load_run(run_dir: Path, reoptimize: bool):
    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.run import optimize_family

    cfg = PipelineConfig.load(run_dir / "config.json")
    cfg = PipelineConfig.from_dict({**cfg.to_dict(), "out_dir": str(run_dir)})
    # a skipped ensemble (fewer than two members) has no model to time
    cfg = PipelineConfig.from_dict({**cfg.to_dict(), "models": [f for f in cfg.models if cfg.layout.model_json(f).exists()]})
    if reoptimize:  # rebuild the variants from fp32.onnx with the current onnxcast.pipeline.optimize
        for family in cfg.models:
            optimize_family(cfg, family)
    return cfg


# --- output -----------------------------------------------------------------------------------

def write_markdown(results: dict, path: Path) -> None:
    load = results["load_average"]
    machine = [f"{results['gemm_peak_gflops_by_threads'][t]:.0f} GFLOP/s float32 GEMM, "
               f"{results['int8_gemm_peak_gops_by_threads'][t]:.0f} GOP/s int8, "
               f"{results['memory_bandwidth_gbs_by_threads'][t]:.1f} GB/s memory at {t} thread(s)"
               for t in results["threads"]]
    lines = [
        f"Benchmark of {results['date']} on {results['machine']}; load average {load['before']} before, "
        f"{load['after']} after: {'DISTURBED (other work held a core; ratios within the run still hold)' if load['disturbed'] else 'quiet'}.",
        f"Lookback {results['lookback']}, horizon {results['horizon']}; " + "; ".join(machine)
        + f". ORT: {results['ort_session']}; PyTorch: {results['torch_mode']}. Memory: {results['memory_method']}. "
        f"Roofline: {results['roofline_method']}.",
        "",
        "Each family's chosen variants (the pipeline's choice among the family's variants that pass parity and "
        "the accuracy budget against fp32: edge at batch 1, cloud at 64, and the cloud variant at 1,024), x PyTorch "
        "eager in the same run at 1 / 2 threads, and batch 1,024 against the roofline (1 thread):",
        "",
        "| family | edge variant | batch 1 | cloud variant | batch 64 | batch 1,024 | forecasts/s at 1,024 | roofline | x roofline |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    threads = results["threads"]

    def cell(family: str, variant: str | None, batch: int, t: int) -> dict | None:
        return next((r for r in results["rows"] if r["family"] == family and r["variant"] == variant
                     and r["batch"] == batch and r["threads"] == t), None)

    def ratios(family: str, variant: str | None, batch: int) -> str:
        found = [cell(family, variant, batch, t) for t in threads]
        return " / ".join(f"{r['speedup_vs_torch']:.2f}x" if r else "-" for r in found)

    for family, chosen in results["selected_per_family"].items():
        edge, cloud = chosen.get("edge"), chosen.get("cloud")
        fleet = cell(family, cloud, FLEET_BATCH, threads[0])
        fleet_text = ("- | - | - | -" if fleet is None else
                      f"{ratios(family, cloud, FLEET_BATCH)} | {fleet['throughput_per_s']:,.0f} | "
                      f"{FLEET_BATCH * 1000 / fleet['roofline_ms']:,.0f} ({fleet['roofline_bound']}) | "
                      f"{fleet['x_roofline']:.2f}")
        lines.append(f"| {family} | {edge or 'none'} | {ratios(family, edge, 1)} | {cloud or 'none'} | "
                     f"{ratios(family, cloud, 64)} | {fleet_text} |")
    lines += [
        "",
        "| family | variant | threads | batch | p50 ms | p95 ms | forecasts/s | x torch | x roofline | holdout MAE | "
        "MAE vs fp32 | size KiB | GEMM peak | peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        mem = "" if r["peak_rss_delta_mib"] is None else f"{r['peak_rss_delta_mib']:.1f}"
        lines.append(
            f"| {r['family']} | {r['variant']} | {r['threads']} | {r['batch']} | {r['p50_ms']:.3f} | "
            f"{r['p95_ms']:.3f} | {r['throughput_per_s']:.0f} | {r['speedup_vs_torch']:.2f} | {r['x_roofline']:.2f} | "
            f"{r['holdout_mae']:.2f} | {100 * r['mae_vs_fp32']:+.2f}% | {r['size_bytes'] / 1024:.0f} | "
            f"{100 * r['gflops_fraction']:.1f}% | {mem} |")
    lines += openvino_table(results["rows"])
    lines += ["", "Work per forecast (fp32 graph, batch 1,024): "
              + "; ".join(f"{family} {cost[str(FLEET_BATCH)]['flops'] / 1e6:.2f} MFLOP, "
                          f"{cost[str(FLEET_BATCH)]['bytes'] / 1e3:.1f} kB"
                          for family, cost in results["cost_per_forecast"].items()), ""]
    lines += [f"Selected at {results['threads'][0]} thread(s) (all families competing): "
              + (", ".join(f"{ch} = {s['family']} {s['variant']}" for ch, s in results["selected"].items())
                 or "none: no family passed the pipeline's gates (a benchmark model trains a few epochs and need "
                    "not beat the baselines); the per-family choices above judge parity and the accuracy budget "
                    "against fp32 only"),
              ""]
    if results.get("ensemble"):
        lines += render_ensemble(results["ensemble"])
    if results.get("training"):
        lines += ["Training windows a second (bench/training.py: the pipeline's training step; `before` is the "
                  "model and step of c2a809c, when the issue was filed; per CPU second is the steady figure on "
                  "shared cores):", "", render_training(results["training"]), ""]
    lines += ["| goal | value | met |", "|---|---|---|"]
    for g in results["goals"]:
        lines.append(f"| {g['goal']} | {g['value']} | {'yes' if g['met'] else 'no'} |")
    lines.append("")
    path.write_text("\n".join(lines))


def openvino_table(rows: list[dict]) -> list[str]:
    """OpenVINO against ONNX Runtime on the same fp32 graph, per family, thread count and batch, timed
    interleaved in the same run (the ratio holds under other load); empty without OpenVINO rows."""
    found = {(r["family"], r["threads"], r["batch"]): r for r in rows if r["variant"] == OPENVINO_VARIANT}
    if not found:
        return []
    ort = {(r["family"], r["threads"], r["batch"]): r for r in rows if r["variant"] == "fp32"}
    lines = ["", "OpenVINO against ONNX Runtime, the same fp32.onnx (the `openvino` and `x86_64` deployment "
             "targets, docs/targets.md): p50 ms, timed interleaved in this run; ORT / OpenVINO above 1: OpenVINO "
             "is faster.", "",
             "| family | threads | batch | ONNX Runtime p50 ms | OpenVINO p50 ms | ORT / OpenVINO | OpenVINO parity "
             "vs torch | OpenVINO MAE vs ORT fp32 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key in sorted(found, key=lambda k: (list(dict.fromkeys(f for f, _, _ in found)).index(k[0]), k[1], k[2])):
        ov, base = found[key], ort.get(key)
        if base is None:
            continue
        parity = "-" if ov["parity_ratio"] is None else f"{ov['parity_ratio']:.3f}"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {base['p50_ms']:.3f} | {ov['p50_ms']:.3f} | "
                     f"{base['p50_ms'] / ov['p50_ms']:.2f} | {parity} | {100 * ov['mae_vs_fp32']:+.3f}% |")
    return lines


def ensemble_latency(cfg, rows: list[dict], threads: int) -> dict | None:
    """The ensemble's p50 latency per variant and batch (at ``threads``) against its members': the
    sum of the members' p50 (what running them one by one costs) and the slowest member's."""
    from onnxcast.base.files import read_json

    if ENSEMBLE not in cfg.models:
        return None
    members = [m["family"] for m in read_json(cfg.layout.model_json(ENSEMBLE))["spec"]["members"]]
    p50 = {(r["family"], r["variant"], r["batch"]): r["p50_ms"] for r in rows if r["threads"] == threads}
    cells = []
    for (family, variant, batch), value in sorted(p50.items()):
        mine = [p50.get((m, variant, batch)) for m in members]
        if family != ENSEMBLE or None in mine:
            continue
        cells.append({"variant": variant, "batch": batch, "ensemble_p50_ms": value, "members_sum_p50_ms": sum(mine),
                      "slowest_member_p50_ms": max(mine), "x_members_sum": value / sum(mine)})
    return {"members": members, "threads": threads, "cells": cells}


def render_ensemble(ensemble: dict) -> list[str]:
    lines = [f"The ensemble of {', '.join(ensemble['members'])} against its members (p50 ms at "
             f"{ensemble['threads']} thread(s), the same variant of each; 'sum': the members run one after another):",
             "", "| variant | batch | ensemble | members' sum | slowest member | x sum |", "|---|---:|---:|---:|---:|---:|"]
    for c in ensemble["cells"]:
        lines.append(f"| {c['variant']} | {c['batch']} | {c['ensemble_p50_ms']:.3f} | {c['members_sum_p50_ms']:.3f} | "
                     f"{c['slowest_member_p50_ms']:.3f} | {c['x_members_sum']:.2f} |")
    return [*lines, ""]


def training_goals(training: list[dict]) -> list[dict]:
    """The issue's training goal, per data shape: the slowest family's windows a second (per CPU
    second of the process, the figure that holds on shared cores) now against the slowest then."""
    out = []
    for data in dict.fromkeys(r["data"] for r in training):
        rows = [r for r in training if r["data"] == data]
        before = min((r for r in rows if r["variant"] == "before"), key=lambda r: r["windows_per_cpu_s"])
        after = min((r for r in rows if r["variant"] == "after"), key=lambda r: r["windows_per_cpu_s"])
        ratio = after["windows_per_cpu_s"] / before["windows_per_cpu_s"]
        out.append({"goal": f"training ({data} {before['lookback']}/{before['horizon']}): the slowest family "
                            f"at least 2x as fast (then {before['family']} {before['windows_per_cpu_s']:,.0f}, now "
                            f"{after['family']} {after['windows_per_cpu_s']:,.0f} windows/CPU s)",
                    "value": f"{ratio:.2f}x", "met": ratio >= 2.0})
    return out


def goals(rows: list[dict], selected_by_family: dict[str, dict], threads: int) -> list[dict]:
    """The issue's goals for each family's chosen edge (batch 1) and cloud (batch 64, and a fleet's
    batch 1,024 against the roofline) variant, at ``threads``."""
    def row(family: str, variant: str, batch: int) -> dict | None:
        return next((r for r in rows if r["family"] == family and r["variant"] == variant
                     and r["batch"] == batch and r["threads"] == threads), None)

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
        fleet = row(family, chosen.get("cloud"), FLEET_BATCH) if chosen.get("cloud") else None
        if fleet:
            out.append({"goal": f"{family} cloud ({fleet['variant']}) at batch {FLEET_BATCH:,} within 2x of the roofline",
                        "value": f"{fleet['x_roofline']:.2f}x", "met": fleet["x_roofline"] <= 2.0})
    for family in selected_by_family:
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
    load_before = load_average()

    threads_list = [int(t) for t in args.threads.split(",")]
    if args.quick:
        repeats, rounds, warmup = {1: 5, 64: 1, FLEET_BATCH: 1}, 2, 1
    else:
        repeats, rounds, warmup = {1: 40, 64: 4, FLEET_BATCH: 1}, args.rounds, 3

    if args.run_dir:
        cfg = load_run(args.run_dir, args.reoptimize)
    else:
        cfg = prepare_run(args.out_dir, 1 if args.quick else args.epochs, 0.05 if args.quick else args.train_minutes)
    log.info("run directory %s ready after %.0fs", cfg.run_dir, time.monotonic() - started)

    peaks, machine = {}, {"gemm_peak_gflops": {}, "int8_gemm_peak_gops": {}, "memory_bandwidth_gbs": {}}
    for threads in threads_list:
        peaks[threads] = gemm_peak_gflops(threads, repeats=5 if args.quick else 40)
        machine["gemm_peak_gflops"][threads] = peaks[threads]["peak"]
        machine["int8_gemm_peak_gops"][threads] = int8_gemm_peak(threads, repeats=3 if args.quick else 20)
        machine["memory_bandwidth_gbs"][threads] = memory_bandwidth_gbs(threads, mib=256 if args.quick else 1024)
        log.info("at %d thread(s): float32 GEMM peak %s, int8 %.0f GOP/s, memory %.1f GB/s", threads,
                 {k: round(v, 1) for k, v in peaks[threads].items()}, machine["int8_gemm_peak_gops"][threads],
                 machine["memory_bandwidth_gbs"][threads])

    from onnxcast.pipeline.report import select_variants

    rows, entries = [], []
    for family in ensemble_last(cfg.models):
        family_rows, entry = bench_family(cfg, family, threads_list, rounds, repeats, warmup, machine)
        rows += family_rows
        entries.append(entry)
        for r in family_rows:
            log.info("%-11s %-8s t%d b%-4d p50 %9.3f ms  x%.2f torch  MAE %.2f  x%.1f roofline", r["family"],
                     r["variant"], r["threads"], r["batch"], r["p50_ms"], r["speedup_vs_torch"], r["holdout_mae"],
                     r["x_roofline"])

    selected, ranking = select_variants(entries)
    per_family = {e["family"]: dict(zip(("edge", "cloud"), _best_per_family(e.pop("speed_entry")), strict=True))
                  for e in entries}

    # training windows a second per family, the step against today's, in the same run: at
    # the example's shapes and at an M3-monthly fleet's (lookback 36, horizon 18)
    seconds, training_rounds = (0.3, 2) if args.quick else (4.0, 5)
    training = []
    for fleet, lookback, horizon in ((False, cfg.lookback, cfg.horizon), (True, 36, 18)):
        training += training_throughput(tuple(f for f in cfg.models if f != ENSEMBLE), lookback=lookback, horizon=horizon, fleet=fleet,
                                        fleet_series=200 if args.quick else 10_000, threads=threads_list[0],
                                        seconds_per_candidate=seconds, rounds=training_rounds,
                                        warmup_steps=1 if args.quick else 3)
    log.info("training throughput:\n%s", render_training(training))

    import onnxruntime
    import torch

    load_after = load_average()
    results = {
        "date": dt.date.today().isoformat(),
        "machine": machine_description(),
        "load_average": {"before": load_before, "after": load_after,
                         "disturbed": load_before > QUIET_LOAD_BEFORE or load_after > QUIET_LOAD_AFTER},
        "threads": threads_list,
        "gemm_peak_gflops": peaks[threads_list[0]]["peak"],
        "gemm_peak_gflops_by_threads": machine["gemm_peak_gflops"],
        "gemm_peak_detail": peaks,
        "int8_gemm_peak_gops_by_threads": machine["int8_gemm_peak_gops"],
        "memory_bandwidth_gbs_by_threads": machine["memory_bandwidth_gbs"],
        "lookback": cfg.lookback, "horizon": cfg.horizon,
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
        "ort_session": "CPUExecutionProvider, intra-op threads as listed, inter-op 1, spinning off",
        "torch_mode": f"eager, torch.set_num_threads as listed, inference_mode, "
                      f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}",
        "memory_method": "peak RSS growth (VmHWM) over the size after imports, in a fresh process per "
                         "candidate: loading the model, then runs at batch 1, 64 and 1,024 (1 thread)",
        "roofline_method": "per forecast: the FLOPs of the variant's own matrix products (bench/flops.py) at "
                           "the float32 GEMM peak, those of its quantized ops (MatMulInteger, "
                           "DynamicQuantizeMatMul, DynamicQuantizeLSTM, ...) at the int8 GEMM peak, or its "
                           "history, outputs and weights (once per batch) at the memory bandwidth, whichever "
                           "takes longer; at the same thread count",
        "timing": {"rounds": rounds, "repeats_per_round": repeats, "warmup": warmup, "quick": args.quick},
        "cost_per_forecast": {e["family"]: e["cost_per_forecast"] for e in entries},
        "flops_by_op": {e["family"]: e["flops_by_op"] for e in entries},
        "rows": rows,
        "selected": selected,
        "selected_per_family": per_family,
        "ranking": ranking,
        "gates": {e["family"]: {"passed": e["gates_passed"], "failures": e["failures"],
                                "variants": {v["name"]: v["gates"] for v in e["variants"]}} for e in entries},
        "training": training,
        "ensemble": ensemble_latency(cfg, rows, threads_list[0]),
        "goals": goals(rows, per_family, threads_list[0]) + training_goals(training),
        "seconds": round(time.monotonic() - started, 1),
    }
    from onnxcast.base.files import write_json

    write_json(args.results, results)
    write_markdown(results, args.markdown)
    log.info("wrote %s and %s in %.0fs", args.results, args.markdown, time.monotonic() - started)
    print(args.markdown.read_text())
    return 0


def _best_per_family(entry: dict) -> tuple[str | None, str | None]:
    """Each channel's choice when only this family is allowed (for the per-family goals), from its
    entry judged without the baseline gate."""
    from onnxcast.pipeline.report import select_variants

    selected, _ = select_variants([entry])
    return tuple((selected.get(ch) or {}).get("variant") for ch in ("edge", "cloud"))


if __name__ == "__main__":
    sys.exit(main())
