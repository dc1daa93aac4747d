"""Training throughput: windows a second per family, through the pipeline's own training step.

A step is what ``onnxcast.pipeline.training`` runs (``train_step``: forward and loss, backward,
gradients clipped at norm 1, AdamW), fed the way the pipeline feeds it: a single series'
windows shuffled a batch at a time as ``train_model`` draws them (``series_windows`` +
``shuffled_batches``), or, with ``fleet=True``, windows drawn by ``fleet_train.WindowSampler``
from a synthetic fleet of M3-monthly-length series and the weighted loss of ``train_sampled``.

Candidates per family, timed in interleaved rounds (every candidate once per round, the median
over rounds reported) so that load from other processes hits them alike; ratios are against
``before`` measured in the same run, the only comparison to trust on shared cores. Rates are
given per wall-clock second and per CPU second of the process: with other jobs on the cores the
process runs a fraction of the time, and the CPU-second figure (what a core of its own would do)
is the steadier one.

- ``before``: the model and training step as they were when issue 23 was filed (c2a809c):
  one token a time step for the LSTM and the Transformer (``patch`` 1) and the Transformer's
  attention as explicit products, float32, PyTorch's default CPU AdamW (a Python loop over the
  parameters), windows copied by ``data.windows`` / series drawn with ``Generator.choice(p=...)``.
- ``after``: the pipeline's default step now: float32, fused AdamW, window views / the
  sampler's own draw.
- ``after, bf16``: the same in bfloat16 autocast (where the CPU has bf16 units): what the
  ``bf16_training`` setting turns on for the families in ``BF16_FAMILIES``.
- ``after, N threads`` (``compare_threads``) and ``after, compiled`` (``compile=True``, its
  compile seconds in the row) when asked.

    .venv/bin/python bench/training.py                       # example shapes, every family (~1 min)
    .venv/bin/python bench/training.py --fleet               # M3-monthly fleet shapes (lookback 36, h 18)
    .venv/bin/python bench/training.py --quick --families dlinear   # a smoke test (seconds)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import statistics
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/training.py` from a checkout
    sys.path.insert(0, str(REPO))

FAMILIES = ("lstm", "transformer", "nhits", "dlinear")
SERIES_SEASONS = (24, 168)  # hourly, as the example data
FLEET_SEASONS = (12,)  # monthly, as M3
FLEET_LENGTHS = (66, 144)  # M3 monthly series, shortest and longest
BEFORE = "before"
PAUSE_S = 0.02  # between candidates: OpenMP workers of a multi-threaded one fall asleep first


@dataclass
class Candidate:
    variant: str
    setting: str
    step: Callable[[], int]  # one training step on the next batch; returns its windows
    threads: int
    compile_s: float | None = None
    copied_window_bytes: int = 0


def training_throughput(families: tuple[str, ...] | list[str] = FAMILIES, *, lookback: int = 168, horizon: int = 24,
                        n_features: int = 1, batch_size: int = 64, threads: int = 1,
                        seconds_per_candidate: float = 4.0, rounds: int = 5, fleet: bool = False,
                        fleet_series: int = 10_000, compare_threads: int | None = None, compile: bool = False,
                        warmup_steps: int = 3, seed: int = 0) -> list[dict]:
    """Training windows a second of each family, one row per (family, variant).

    ``lookback``/``horizon``/``n_features``/``batch_size``: the shapes (the pipeline's defaults
    are the example's 168/24/1/64; M3 monthly fleets use 36/18). ``threads``: torch threads of
    every candidate (the pipeline's ``threads``, default 1). ``seconds_per_candidate`` is split
    over ``rounds``, after ``warmup_steps`` untimed steps per candidate. ``fleet``: the fleet path
    (global model, weighted loss, ``WindowSampler`` over ``fleet_series`` synthetic series) instead
    of a single series' windows.

    Each row: ``family``, ``variant``, ``setting`` (what the variant runs), ``windows_per_s``
    (median over rounds), ``ratio`` (to ``before`` of the same family, same run),
    ``windows_per_cpu_s`` and ``cpu_ratio`` (the same per CPU second of this process: what a
    core of its own would do, the steadier figure when other processes take turns on the cores),
    ``round_windows_per_s``, ``threads``, ``data`` ("series" or "fleet"), the shapes,
    ``copied_window_bytes`` (windows materialised up front), ``compile_s`` (compiled only),
    ``bf16_supported`` and ``load_average_before``/``_after`` (``os.getloadavg()`` around the
    family's rounds). Takes about ``len(families) x 3 x seconds_per_candidate`` plus set-up.
    """
    import torch

    from onnxcast.pipeline.models import torch_threads
    from onnxcast.pipeline.training import bf16_supported

    rows = []
    supported = bf16_supported()
    for family in families:
        with torch_threads(threads):
            candidates = _candidates(family, lookback=lookback, horizon=horizon, n_features=n_features,
                                     batch_size=batch_size, threads=threads, fleet=fleet, fleet_series=fleet_series,
                                     compare_threads=compare_threads, compile=compile, warmup_steps=warmup_steps,
                                     seed=seed)
            load_before = [round(x, 2) for x in os.getloadavg()]
            rates: dict[str, list[float]] = {c.variant: [] for c in candidates}
            cpu_rates: dict[str, list[float]] = {c.variant: [] for c in candidates}
            slot = seconds_per_candidate / max(rounds, 1)
            for _ in range(max(rounds, 1)):
                for c in candidates:
                    torch.set_num_threads(c.threads)
                    time.sleep(PAUSE_S)
                    wall, cpu = _rate(c.step, slot)
                    rates[c.variant].append(wall)
                    cpu_rates[c.variant].append(cpu)
            load_after = [round(x, 2) for x in os.getloadavg()]
        base, cpu_base = statistics.median(rates[BEFORE]), statistics.median(cpu_rates[BEFORE])
        for c in candidates:
            median, cpu = statistics.median(rates[c.variant]), statistics.median(cpu_rates[c.variant])
            rows.append({"family": family, "variant": c.variant, "setting": c.setting,
                         "windows_per_s": round(median, 1), "ratio": round(median / base, 3),
                         "windows_per_cpu_s": round(cpu, 1), "cpu_ratio": round(cpu / cpu_base, 3),
                         "round_windows_per_s": [round(r, 1) for r in rates[c.variant]], "threads": c.threads,
                         "data": "fleet" if fleet else "series", "lookback": lookback, "horizon": horizon,
                         "n_features": n_features, "batch_size": batch_size,
                         "copied_window_bytes": c.copied_window_bytes, "compile_s": c.compile_s,
                         "bf16_supported": supported, "load_average_before": load_before,
                         "load_average_after": load_after})
    return rows


def _rate(step: Callable[[], int], seconds: float) -> tuple[float, float]:
    """Windows a second of ``step`` over at least ``seconds`` (and at least one step): per
    wall-clock second and per CPU second of this process (all its threads)."""
    windows, started, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        windows += step()
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return windows / elapsed, windows / max(time.process_time() - cpu, 1e-9)


def _candidates(family: str, *, lookback: int, horizon: int, n_features: int, batch_size: int, threads: int,
                fleet: bool, fleet_series: int, compare_threads: int | None, compile: bool, warmup_steps: int,
                seed: int) -> list[Candidate]:
    from onnxcast.pipeline.training import BF16_FAMILIES, bf16_supported

    now = "fused AdamW, window views / the sampler's cdf"
    # variant, setting, options of _candidate
    plan: list[tuple[str, str, dict]] = [
        (BEFORE, "c2a809c: one token a step, explicit attention, float32, PyTorch's default CPU AdamW "
                 "(a loop), copied windows / choice(p)",
         {"fused": False, "bf16": False, "old": True}),
        ("after", f"float32, {now}", {"bf16": False}),
    ]
    if bf16_supported():  # the evidence for BF16_FAMILIES (what bf16_training turns on)
        chosen = " (bf16_training)" if family in BF16_FAMILIES else " (not in BF16_FAMILIES)"
        plan.append(("after, bf16", f"bf16 autocast{chosen}, {now}", {"bf16": True}))
    if compare_threads and compare_threads != threads:
        plan.append((f"after, {compare_threads} threads", f"float32, {now}, {compare_threads} torch threads",
                     {"bf16": False, "threads": compare_threads}))
    if compile:
        plan.append(("after, compiled", f"float32, {now}, torch.compile(model)", {"bf16": False, "compiled": True}))
    make = (_fleet_feeder(lookback, horizon, n_features, fleet_series, seed) if fleet
            else _series_feeder(lookback, horizon, n_features, seed))
    spec = _spec(family, lookback, horizon, n_features, fleet)
    old_spec = dataclasses.replace(spec, patch=1)  # one token a time step, as the issue measured
    return [_candidate(variant, setting, old_spec if options.get("old") else spec, make, batch_size,
                       **{"threads": threads, **options}, warmup=warmup_steps, seed=seed)
            for variant, setting, options in plan]


def _spec(family: str, lookback: int, horizon: int, n_features: int, fleet: bool):
    from onnxcast.pipeline.config import PATCHED_FAMILIES, sequence_patch
    from onnxcast.pipeline.models import ModelSpec

    seasons = tuple(s for s in (FLEET_SEASONS if fleet else SERIES_SEASONS) if s <= lookback) or (1,)
    return ModelSpec(family=family, n_features=n_features, horizon=horizon, lookback=lookback, season=seasons[0],
                     seasons=seasons, patch=sequence_patch(0, lookback) if family in PATCHED_FAMILIES else 1,
                     global_model=fleet)


def _candidate(variant: str, setting: str, spec, make, batch_size: int, *, threads: int, bf16: bool,
               fused: bool = True, old: bool = False, compiled: bool = False, warmup: int, seed: int) -> Candidate:
    """A model, its optimizer and its own batch stream; ``old``: c2a809c's step and data path."""
    import torch

    from onnxcast.pipeline.models import EncoderLayer, build_model, torch_threads
    from onnxcast.pipeline.training import make_optimizer, seed_everything, train_step

    batches, batch_loss, mean, std, copied = make(batch_size, old)
    seed_everything(seed)
    model = build_model(spec, mean, std)
    if old:  # the Transformer's attention as explicit products, as it trained then
        for layer in model.modules():
            if isinstance(layer, EncoderLayer):
                layer.explicit_attention = True
    model.train()
    if fused:
        optimizer = make_optimizer(model, 2e-3)
    else:  # c2a809c's optimizer: on CPU, PyTorch's default is the per-parameter loop
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    forward = torch.compile(model) if compiled else model

    def step() -> int:
        batch = next(batches)
        if old:
            _before_step(forward, optimizer, batch_loss, batch)
        else:
            train_step(forward, optimizer, batch_loss, batch, bf16=bf16)
        return len(batch[0])

    with torch_threads(threads):
        started = time.perf_counter()
        for _ in range(max(warmup, 2 if compiled else 1)):  # allocator, oneDNN primitives, compiled graphs
            step()
        compile_s = round(time.perf_counter() - started, 1) if compiled else None
    return Candidate(variant, setting, step, threads, compile_s, copied)


def _before_step(model, optimizer, batch_loss, batch) -> None:
    """c2a809c's step, line for line (onnxcast.pipeline.training._fit)."""
    import torch

    loss = batch_loss(model, *batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    loss.item()


def _series_feeder(lookback: int, horizon: int, n_features: int, seed: int):
    """A single series (hourly daily and weekly cycles, noise; 4,000 rows): batches as
    ``train_model`` draws them, from views (after) or from ``data.windows``' copies (before)."""
    rng = np.random.default_rng(seed)
    rows = max(4_000, 4 * (lookback + horizon))
    t = np.arange(rows)
    target = 1000 + 200 * np.sin(2 * np.pi * t / 24) + 100 * np.sin(2 * np.pi * t / 168) + rng.normal(0, 30, rows)
    values = np.column_stack([target, rng.normal(0, 1, (rows, n_features - 1))]).astype(np.float32)
    mean, std = values.mean(axis=0), values.std(axis=0)

    def make(batch_size: int, old_data: bool):
        import torch

        from onnxcast.pipeline.data import windows
        from onnxcast.pipeline.training import series_loss, series_windows, shuffled_batches

        if old_data:
            x, y = windows(values, lookback, horizon, 0, rows)[:2]
            copied = x.nbytes + y.nbytes
            x, y = torch.from_numpy(x), torch.from_numpy(y)
        else:
            (x, y), copied = series_windows(values, lookback, horizon, 0, rows), 0
        generator = torch.Generator().manual_seed(seed)
        epochs = (shuffled_batches(x, y, batch_size, generator) for _ in itertools.count())
        return itertools.chain.from_iterable(epochs), series_loss, mean, std, copied

    return make


def _fleet_feeder(lookback: int, horizon: int, n_features: int, n_series: int, seed: int):
    """A synthetic fleet of ``n_series`` monthly series of M3 lengths (level, yearly cycle,
    noise): batches as ``train_sampled`` draws them, with the weighted loss."""
    from onnxcast.pipeline.fleet_data import FleetData, FleetSplit

    rng = np.random.default_rng(seed)
    lengths = rng.integers(FLEET_LENGTHS[0], FLEET_LENGTHS[1] + 1, n_series).astype(np.int64)
    offsets = np.zeros(n_series + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    t = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    level = np.repeat(rng.lognormal(8, 1, n_series), lengths)
    target = level * (1 + 0.2 * np.sin(2 * np.pi * t / 12) + rng.normal(0, 0.05, len(t)))
    values = np.column_stack([target, rng.normal(0, 1, (len(t), n_features - 1))]).astype(np.float32)
    data = FleetData(values=values, offsets=offsets, starts=np.zeros(n_series, dtype=np.int64),
                     ids=tuple(f"s{i:06d}" for i in range(n_series)), columns=tuple(f"c{i}" for i in range(n_features)),
                     freq="MS", season=FLEET_SEASONS[0], source="synthetic", sha256="")
    split = FleetSplit(lengths=lengths, train_end=lengths - 2 * horizon, validation_end=lengths - horizon,
                       holdout_steps=horizon, validation_steps=horizon)

    def make(batch_size: int, old_data: bool):
        import torch

        from onnxcast.pipeline.fleet_train import FLEET_LOSS, WindowSampler
        from onnxcast.pipeline.training import sampled_batches, weighted_loss

        sampler = WindowSampler(data, split, lookback, horizon, season=FLEET_SEASONS[0], power=0.5, seed=seed)
        if old_data:
            sampler.draw = types.MethodType(_choice_draw, sampler)

        def batch_loss(model, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return weighted_loss(model, x, y, w, FLEET_LOSS)

        epochs = (sampled_batches(sampler, 20_000, batch_size) for _ in itertools.count())
        return itertools.chain.from_iterable(epochs), batch_loss, None, None, 0

    return make


def _choice_draw(sampler, size: int) -> tuple[np.ndarray, np.ndarray]:
    """c2a809c's ``WindowSampler.draw``: ``Generator.choice`` with ``p`` on every batch."""
    s = sampler.rng.choice(len(sampler.p), size=size, p=sampler.p)
    o = sampler.min_context + np.floor(sampler.rng.random(size) * sampler.n_origins[s]).astype(np.int64)
    return s, o


def render(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| family | data | variant | windows/s | x before | windows/CPU s | x before | threads "
             "| load before -> after |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        load = f"{r['load_average_before'][0]:.1f} -> {r['load_average_after'][0]:.1f}"
        extra = f" (compile {r['compile_s']} s)" if r.get("compile_s") is not None else ""
        lines.append(f"| {r['family']} | {r['data']} {r['lookback']}/{r['horizon']} | {r['variant']}{extra} | "
                     f"{r['windows_per_s']:.0f} | {r['ratio']:.2f} | {r['windows_per_cpu_s']:.0f} | "
                     f"{r['cpu_ratio']:.2f} | {r['threads']} | {load} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated families")
    parser.add_argument("--fleet", action="store_true",
                        help="the fleet path (WindowSampler, weighted loss) at M3-monthly shapes unless given")
    parser.add_argument("--lookback", type=int, help="default 168 (36 with --fleet)")
    parser.add_argument("--horizon", type=int, help="default 24 (18 with --fleet)")
    parser.add_argument("--n-features", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every candidate")
    parser.add_argument("--compare-threads", type=int, help="also the default step at this many threads")
    parser.add_argument("--compile", action="store_true", help="also torch.compile (needs a C++ compiler)")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per candidate, over the rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fleet-series", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="a smoke test: small fleet, 0.3 s per candidate")
    parser.add_argument("--results", type=Path, help="JSON file for the rows")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds, args.fleet_series, warmup = 0.3, 2, 200, 1
    else:
        warmup = 3
    rows = training_throughput(
        tuple(args.families.split(",")), lookback=args.lookback or (36 if args.fleet else 168),
        horizon=args.horizon or (18 if args.fleet else 24), n_features=args.n_features, batch_size=args.batch_size,
        threads=args.threads, seconds_per_candidate=args.seconds, rounds=args.rounds, fleet=args.fleet,
        fleet_series=args.fleet_series, compare_threads=args.compare_threads, compile=args.compile,
        warmup_steps=warmup)
    import torch

    result = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "torch": torch.__version__,
              "command": "bench/training.py " + " ".join(sys.argv[1:] if argv is None else argv), "rows": rows}
    if args.results:
        args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
