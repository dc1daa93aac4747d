"""Pipeline settings: one typed dataclass, validated once where settings enter (CLI, operator params)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from onnxcast.base.errors import ConfigError
from onnxcast.pipeline.layout import RunLayout

# nhits and dlinear: window families (onnxcast.pipeline.models), trained in seconds; N-HiTS was more
# accurate than the Transformer on hourly, half-hourly and weekly data, DLinear on weekly data
# only (docs/performance.md#model-families)
MODEL_FAMILIES = ("lstm", "transformer", "nhits", "dlinear")
VARIANTS = ("fp32", "fp32-opt", "int8", "fp16")
CHANNELS = ("edge", "cloud")


@dataclass(frozen=True)
class QualitySettings:
    """Thresholds of the data-quality gate (see onnxcast.pipeline.quality)."""

    max_missing_fraction: float = 0.01
    max_gap_fraction: float = 0.01  # share of expected timestamps that may be absent
    outlier_mad_threshold: float = 12.0  # robust z-score beyond which a value is an outlier
    max_outlier_fraction: float = 0.001
    min_holdout_windows: int = 2
    fill_gaps_max_steps: int = 0  # repair on request: interpolate gaps up to this many steps
    drop_duplicate_timestamps: bool = False  # repair on request: keep the last of duplicate rows

    def __post_init__(self) -> None:
        problems = check_ranges(self, QUALITY_RANGES, prefix="quality.")
        if problems:
            raise ConfigError("invalid settings: " + "; ".join(problems))


@dataclass(frozen=True)
class PipelineConfig:
    """Everything one pipeline run needs. Defaults train the example data in minutes on 2 cores."""

    data_uri: str
    out_dir: str
    time_column: str = "ds"
    target_column: str = "y"
    feature_columns: tuple[str, ...] = ()
    freq: str | None = None  # pandas offset alias; inferred from the timestamps when None
    horizon: int = 24
    lookback: int = 168
    models: tuple[str, ...] = MODEL_FAMILIES
    season: int | None = None  # seasonal-naive period; derived from freq when None
    validation_fraction: float = 0.15
    holdout_fraction: float = 0.15
    trained_until: str | None = None  # ignore rows after this timestamp (DAG: data interval end)
    # training
    max_epochs: int = 30
    max_minutes: float = 10.0
    patience: int = 5
    batch_size: int = 64
    learning_rate: float = 2e-3
    hidden_size: int = 64
    num_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    seed: int = 42
    # export / optimize / validate
    opset: int | None = None  # convert the exported graph to this opset when set
    threads: int = 1  # torch and ORT intra-op threads in every step (parallel workers share cores)
    accuracy_budget: float = 0.01  # allowed relative holdout-MAE loss of a variant vs fp32
    # fp32 must beat the best baseline's holdout MAE by this share of it (onnxcast.pipeline.validate):
    # a model equal to its seasonal-naive anchor "beat" it by float32 rounding
    baseline_margin: float = 0.01
    parity_rtol: float = 1e-3
    parity_atol: float = 1e-4
    latency_repeats: int = 30
    model_name: str = "onnxcast-forecaster"
    quality: QualitySettings = field(default_factory=QualitySettings)

    def __post_init__(self) -> None:
        problems = check_ranges(self, RANGES)
        if not self.data_uri:
            problems.append("data_uri is empty")
        if not isinstance(self.quality, QualitySettings):
            problems.append(f"quality must be QualitySettings or a mapping, got {type(self.quality).__name__}")
        if problems:  # the checks below compare numbers: stop at the first wrong type or range
            raise ConfigError("invalid settings: " + "; ".join(problems))
        unknown = [m for m in self.models if m not in MODEL_FAMILIES]
        if unknown or not self.models:
            problems.append(f"models must be a non-empty subset of {list(MODEL_FAMILIES)}, got {list(self.models)}")
        if self.d_model % self.n_heads:
            problems.append(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.target_column in self.feature_columns:
            problems.append(f"target column {self.target_column!r} is also listed as a feature")
        if self.time_column == self.target_column:
            problems.append(f"time column and target column are both {self.time_column!r}")
        if self.trained_until:
            try:
                datetime.fromisoformat(str(self.trained_until).replace("Z", "+00:00"))
            except ValueError:
                problems.append(f"trained_until must be an ISO timestamp, got {self.trained_until!r}")
        if not problems:  # the estimates below assume every size in range and the models known
            problems += model_size_problems(self)
        if problems:
            raise ConfigError("invalid settings: " + "; ".join(problems))

    @property
    def n_features(self) -> int:
        return 1 + len(self.feature_columns)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir)

    @property
    def layout(self) -> RunLayout:
        """The paths of the run directory ``out_dir`` (onnxcast.pipeline.layout)."""
        return RunLayout(self.out_dir)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PipelineConfig:
        """Build from plain values (JSON, Airflow params), rejecting unknown keys by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        values = dict(values)
        for key in ("feature_columns", "models"):
            if key in values and values[key] is not None:
                values[key] = _as_tuple(values[key], key)
        if isinstance(values.get("quality"), dict):
            qknown = {f.name for f in dataclasses.fields(QualitySettings)}
            bad = sorted(set(values["quality"]) - qknown)
            if bad:
                raise ConfigError(f"unknown quality setting(s): {', '.join(bad)}")
            values["quality"] = QualitySettings(**values["quality"])
        elif values.get("quality") is None:
            values.pop("quality", None)
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"invalid settings: {exc}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path) -> PipelineConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))


# --- ranges of the numeric settings ---------------------------------------------------------
# name: (type, low, high, low_open, high_open); None = unbounded. One table, so no numeric
# setting can slip through unchecked (tests/onnxcast/test_config.py walks every field).

RANGES: dict[str, tuple[type, float | None, float | None, bool, bool]] = {
    "horizon": (int, 1, 10_000, False, False),
    "lookback": (int, 2, 100_000, False, False),
    "season": (int, 1, 100_000, False, False),  # None allowed: derived from freq
    "validation_fraction": (float, 0.0, 0.5, True, True),
    "holdout_fraction": (float, 0.0, 0.5, True, True),
    "max_epochs": (int, 1, 100_000, False, False),
    "max_minutes": (float, 0.0, 7 * 24 * 60, True, False),
    "patience": (int, 1, 100_000, False, False),
    "batch_size": (int, 1, 1_000_000, False, False),
    "learning_rate": (float, 0.0, 10.0, True, False),
    # widths beyond 4,096 train nothing on a CPU worker; the estimate in model_size_problems
    # bounds what these ranges still allow in combination (N-HiTS is 8x hidden_size wide)
    "hidden_size": (int, 1, 4096, False, False),
    "num_layers": (int, 1, 64, False, False),
    "d_model": (int, 1, 4096, False, False),
    "n_heads": (int, 1, 1024, False, False),
    "seed": (int, 0, 2**32 - 1, False, False),
    "opset": (int, 14, 30, False, False),  # None allowed: the exporter's default
    "threads": (int, 1, 1024, False, False),
    "accuracy_budget": (float, 0.0, 1.0, False, False),
    "baseline_margin": (float, 0.0, 1.0, False, True),
    "parity_rtol": (float, 0.0, 1.0, False, False),
    "parity_atol": (float, 0.0, None, False, False),
    "latency_repeats": (int, 1, 100_000, False, False),
}
QUALITY_RANGES: dict[str, tuple[type, float | None, float | None, bool, bool]] = {
    "max_missing_fraction": (float, 0.0, 1.0, False, True),
    "max_gap_fraction": (float, 0.0, 1.0, False, True),
    "outlier_mad_threshold": (float, 0.0, None, True, False),
    "max_outlier_fraction": (float, 0.0, 1.0, False, True),
    "min_holdout_windows": (int, 1, 10_000, False, False),
    "fill_gaps_max_steps": (int, 0, 1_000_000, False, False),
    "drop_duplicate_timestamps": (bool, None, None, False, False),
}


# --- model size, estimated before anything is allocated ---------------------------------------
# `--models nhits --hidden-size 65536` once passed the range check and failed after 19 s with an
# allocation traceback: N-HiTS is 3 blocks of two (8 x hidden_size)^2 layers, 8.2e11 weights.
# Training holds weights, gradients and AdamW's two moments: 16 bytes per parameter.
MAX_MODEL_PARAMETERS = 50_000_000  # 800 MB of training state; the defaults are 0.01-1.2 M
MAX_ATTENTION_BYTES = 8 * 1024**3  # the Transformer's attention scores (and their gradients) per batch
TRAINING_BYTES_PER_PARAMETER = 16
_MAX_SEASONS = 3  # a window family anchors on at most the run's season and two implied ones
# The settings that size each family, the first the one to name when the defaults do not explain it.
SIZE_SETTINGS = {
    "lstm": ("hidden_size", "num_layers", "horizon"),
    "transformer": ("d_model", "num_layers", "horizon", "lookback", "batch_size"),
    "nhits": ("hidden_size", "lookback", "horizon"),
    "dlinear": ("lookback", "horizon"),
}


def model_size_problems(cfg: PipelineConfig) -> list[str]:
    """One problem per selected family whose estimated size is over the limits, naming the
    setting that makes it so and the largest value of it that fits with the others."""
    problems = []
    for family in cfg.models:
        parameters, attention = estimate_model_size(family, cfg)
        if parameters <= MAX_MODEL_PARAMETERS and attention <= MAX_ATTENTION_BYTES:
            continue
        name = _culprit(family, cfg)
        value = getattr(cfg, name)
        fits = _largest_fitting(family, cfg, name)
        if parameters > MAX_MODEL_PARAMETERS:
            what = (f"about {parameters:,} parameters ({parameters * TRAINING_BYTES_PER_PARAMETER / 1e9:,.1f} GB "
                    f"to train), over the limit of {MAX_MODEL_PARAMETERS:,}")
        else:
            what = (f"about {attention / 1e9:,.1f} GB of attention scores per batch, over the limit of "
                    f"{MAX_ATTENTION_BYTES / 1e9:.1f} GB")
        advice = f"use {name} {fits:,} or less with these settings" if fits else f"lower {name}"
        problems.append(f"{name} {value:,} makes the {family} model {what}: {advice}")
    return problems


def estimate_model_size(family: str, cfg: PipelineConfig, **override: int) -> tuple[int, int]:
    """(parameters, bytes of attention scores for one training batch) of ``family`` under
    ``cfg`` with ``override`` applied; the formulas follow onnxcast.pipeline.models layer by layer."""
    v = {name: getattr(cfg, name) for name in ("hidden_size", "num_layers", "d_model", "n_heads", "horizon",
                                               "lookback", "batch_size")}
    v.update(override)
    features, horizon, lookback = cfg.n_features, v["horizon"], v["lookback"]
    # LSTM and Transformer mix up to _MAX_SEASONS seasonal-naive anchors and their head reads them
    anchors = _MAX_SEASONS * horizon + _MAX_SEASONS * horizon * horizon
    if family == "lstm":
        h, layers = v["hidden_size"], v["num_layers"]
        lstm = 4 * h * (features + h + 2) + (layers - 1) * 4 * h * (2 * h + 2)
        return lstm + h * horizon + horizon + anchors, 0
    if family == "transformer":
        d, layers = v["d_model"], v["num_layers"]
        layer = 4 * (d * d + d) + 2 * (2 * d * d) + 3 * d + 4 * d  # attention, feed-forward, two norms
        parameters = features * d + d + layers * layer + 2 * d + 2 * d * horizon + horizon + anchors
        # scores, softmax and their gradients: 3 float32 [batch, heads, time, time] per layer
        attention = 3 * 4 * v["batch_size"] * v["n_heads"] * lookback * lookback * layers
        return parameters, attention
    extra = (features - 1) * lookback + _MAX_SEASONS * horizon
    if family == "nhits":
        width = 8 * v["hidden_size"]
        total = _MAX_SEASONS * horizon  # the mix of seasonal-naive anchors
        for pool, knots in ((max(1, lookback // 24), max(2, horizon // 12)),
                            (max(1, lookback // 84), max(2, horizon // 4)), (1, horizon)):
            pooled = -(-lookback // pool)
            total += (pooled + extra + 1) * width + (width + 1) * width + (width + 1) * (lookback + knots)
        return total, 0
    if family == "dlinear":
        return 2 * (lookback + 1) * horizon + (extra + 1) * horizon + _MAX_SEASONS * horizon, 0  # + the mix
    return 0, 0


def _fits(family: str, cfg: PipelineConfig, **override: int) -> bool:
    parameters, attention = estimate_model_size(family, cfg, **override)
    return parameters <= MAX_MODEL_PARAMETERS and attention <= MAX_ATTENTION_BYTES


def _culprit(family: str, cfg: PipelineConfig) -> str:
    """The size setting whose default would shrink ``family`` the most."""
    defaults = {f.name: f.default for f in dataclasses.fields(PipelineConfig)}
    names = SIZE_SETTINGS[family]
    return min(names, key=lambda n: (sum(estimate_model_size(family, cfg, **{n: defaults[n]})), names.index(n)))


def _largest_fitting(family: str, cfg: PipelineConfig, name: str) -> int:
    """The largest value of ``name`` (others unchanged) within the limits; 0 if none."""
    low, high = 0, getattr(cfg, name)  # low fits (or is 0), high does not
    while high - low > 1:
        middle = (low + high) // 2
        if _fits(family, cfg, **{name: middle}):
            low = middle
        else:
            high = middle
    return low


def check_ranges(settings: Any, ranges: dict, prefix: str = "") -> list[str]:
    """One problem per setting of the wrong type or outside its range (NaN and inf included)."""
    problems = []
    for name, (kind, low, high, low_open, high_open) in ranges.items():
        value = getattr(settings, name)
        label = f"{prefix}{name}"
        if value is None and name in ("season", "opset"):
            continue
        if kind is bool:
            if not isinstance(value, bool):
                problems.append(f"{label} must be true or false, got {value!r}")
            continue
        allowed = (int,) if kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, allowed):
            word = "an integer" if kind is int else "a number"
            problems.append(f"{label} must be {word}, got {value!r}")
            continue
        if not math.isfinite(value):
            problems.append(f"{label} must be finite, got {value!r}")
            continue
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            left = "(" if low_open else "["
            right = ")" if high_open else "]"
            low_text = "-inf" if low is None else _number(low)
            high_text = "inf" if high is None else _number(high)
            problems.append(f"{label} must be in {left}{low_text}, {high_text}{right}, got {value!r}")
    return problems


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _as_tuple(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, list | tuple):
        return tuple(str(v).strip() for v in value)
    raise ConfigError(f"{key} must be a list or a comma-separated string, got {value!r}")
