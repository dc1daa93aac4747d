"""Pipeline settings: one typed dataclass, validated once where settings enter (CLI, operator params).

Every setting is declared once, here, as a field of :class:`PipelineConfig` (or of
:class:`QualitySettings`) made by :func:`setting`: its name, type, default, range, choices and
help text. The ``onnxcast pipeline`` options (onnxcast.cli) and the training DAG's trigger-form
params (onnxcast.airflow.params) are generated from :func:`settings`, and the range checks from
:func:`ranges`: adding a setting is one field here. Standard library only (DAG files import it).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from onnxcast.base.contract import parse_quantile_levels
from onnxcast.base.errors import ConfigError, DataError
from onnxcast.base.files import write_text_atomic
from onnxcast.pipeline.layout import RunLayout
from onnxcast.targets.declarations import (
    DEFAULT_TARGETS,
    TARGETS,
    UnknownTargetError,
    parse_targets,
)

# nhits and dlinear: window families (onnxcast.pipeline.models), trained in seconds; N-HiTS was more
# accurate than the Transformer on hourly, half-hourly and weekly data, DLinear on weekly data
# only (docs/performance.md#model-families)
# base: the pretrained forecaster (docs/pretrained.md), chosen with --models, not trained by default
# ensemble: the other families of the run combined, trained after them (onnxcast.pipeline.ensemble,
# docs/ensemble.md); chosen by name, not by default
MODEL_FAMILIES = ("lstm", "transformer", "nhits", "dlinear", "base", "ensemble")
DEFAULT_FAMILIES = ("lstm", "transformer", "nhits", "dlinear")
# the trigger form's names of the families, in its order (the window families first)
FAMILY_LABELS = {"nhits": "N-HiTS", "dlinear": "DLinear", "lstm": "LSTM", "transformer": "Transformer",
                 "base": "base (pretrained)", "ensemble": "Ensemble"}
BASE_MAX_HORIZON = 48  # the steps the pretrained base forecaster forecasts (onnxcast.pipeline.models.BASE_HORIZON)
VARIANTS = ("fp32", "fp32-opt", "int8", "fp16")
CHANNELS = ("edge", "cloud")
# the trigger form's names of the rollout channels, in CHANNELS' order
CHANNEL_LABELS = {"edge": "edge (devices)", "cloud": "cloud (onnxcast serve)"}
# data_uri "example": the built-in example data (resolved by data_source), a CSV in the statsmodels wheel
EXAMPLE_DATA = "example"
EXAMPLE_CSV = "statsmodels/tsa/stl/tests/results/mstl_elec_vic.csv"
# the rollout store's names (onnxcast.rollout.store.NAME_PATTERN): checked in the trigger form
MODEL_NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# what champion/challenger compares (onnxcast.registry.champion): the point forecast or the 95% interval
CHAMPION_METRICS = ("mase", "msis")
CHAMPION_METRIC_PATTERN = "^(" + "|".join(CHAMPION_METRICS) + ")$"

# the groups of `onnxcast pipeline --help`
DATA, FORECAST, TRAINING, EXPORT = "data", "forecast", "models and training", "export and validation"


def setting(default: Any = dataclasses.MISSING, *, help: str, cli: str | None = None,
            group: str | None = None, metavar: str | None = None, dag: str | bool = False,
            description: str | None = None, dag_default: Any = dataclasses.MISSING,
            low: float | None = None, high: float | None = None, low_open: bool = False,
            high_open: bool = False, choices: tuple[str, ...] = (), labels: dict[str, str] | None = None,
            pattern: str | None = None) -> Any:
    """A settings field: its default and everything the CLI, the DAG and the checks need.

    ``help``: what the setting does (the CLI's help; the DAG's ``description`` unless given).
    ``cli``: the ``onnxcast pipeline`` option (in ``group``), none when not on the command line.
    ``dag``: a param of the training DAG (``True``: under the setting's name, or the param's
    name); ``dag_default``: the form's default when it is not the setting's. ``low``/``high``
    (``*_open``: excluded): the range of a number, checked by :func:`check_ranges`. ``choices``:
    the values a list setting takes a non-empty subset of (``labels``: their names in the form,
    in its order). ``pattern``: what the form accepts for a name."""
    metadata = {"help": help, "cli": cli, "group": group, "metavar": metavar, "dag": dag,
                "description": description, "dag_default": dag_default, "low": low, "high": high,
                "low_open": low_open, "high_open": high_open, "choices": tuple(choices), "labels": labels,
                "pattern": pattern}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class QualitySettings:
    """Thresholds of the data-quality gate (see onnxcast.pipeline.quality)."""

    fill_gaps_max_steps: int = setting(
        0, help="repair: interpolate gaps up to STEPS long (0: refuse any gap)", cli="--fill-gaps", group=DATA,
        metavar="STEPS", low=0, high=1_000_000)
    drop_duplicate_timestamps: bool = setting(
        False, help="repair: keep the last row of duplicate timestamps", cli="--drop-duplicates", group=DATA)
    max_missing_fraction: float = setting(
        0.01, help="data check: largest share of missing target values", cli="--max-missing-fraction",
        group=DATA, low=0.0, high=1.0, high_open=True)
    max_gap_fraction: float = setting(
        0.01, help="data check: largest share of expected timestamps that may be absent", low=0.0, high=1.0,
        high_open=True)
    outlier_mad_threshold: float = setting(
        12.0, help="data check: robust z-score beyond which a value is an outlier", low=0.0, low_open=True)
    max_outlier_fraction: float = setting(
        0.001, help="data check: largest share of outliers", low=0.0, high=1.0, high_open=True)
    min_holdout_windows: int = setting(
        2, help="data check: forecast windows the holdout must hold at least (a fleet holds out exactly this "
                "many horizons at the end of every series; 1: the competitions' test period)",
        cli="--holdout-windows", group=FORECAST, metavar="N", low=1, high=10_000)
    # fleet mode (series_column set): a bad series is excluded, the run fails past this share
    max_excluded_share: float = setting(
        0.1, help="fleet data check: largest share of series that may be excluded (too short, gaps, constant, "
                  "...) before the run fails", cli="--max-excluded-share", group=DATA, low=0.0, high=1.0)
    min_train_steps: int | None = setting(
        None, help="fleet data check: training steps a series needs at least (default: one season; a "
                   "series too short for a training window is still forecast and judged)", low=1, high=10_000_000)
    # 1,000,000 series of 3 rows spent over 300 s in the per-series checks before they were
    # vectorised (now: docs/fleet.md, "Scale"); 100,000 series of 117 rows run end to end in bench/fleet.py
    max_series: int = setting(
        200_000, help="fleet data check: most series the table may hold; a table with more is refused in one "
                      "line before any per-series check", cli="--max-series", group=DATA, low=1,
        high=100_000_000)

    def __post_init__(self) -> None:
        problems = check_ranges(self, ranges(type(self)), prefix="quality.")
        if problems:
            raise ConfigError("invalid settings: " + "; ".join(problems))


@dataclass(frozen=True)
class PipelineConfig:
    """Everything one pipeline run needs. Defaults train the example data in minutes on 2 cores."""

    data_uri: str = setting(
        help="CSV or Parquet file: local path or s3:// URI ('example' for the built-in data)", cli="--data",
        group=DATA, dag=True, dag_default=EXAMPLE_DATA,
        description="CSV or Parquet: local path, s3:// URI, or 'example' (Victoria electricity demand)")
    out_dir: str = setting(help="output folder for report.json and the ONNX files", cli="--out")
    # fleet mode: a long table of many series (onnxcast.pipeline.fleet_data, docs/fleet.md)
    series_column: str | None = setting(
        None, help="column of series ids: a long table of many series, one global model per family "
                   "(omitted: one series)", cli="--series-column", group=DATA, dag=True,
        description="Series id column of a long table of many series (empty: the file is one series)")
    time_column: str = setting("ds", help="column of timestamps (ISO 8601)", cli="--time-column", group=DATA,
                               dag=True, description="Timestamp column")
    target_column: str = setting("y", help="column to forecast", cli="--target-column", group=DATA, dag=True)
    feature_columns: tuple[str, ...] = setting(
        (), help="comma-separated extra numeric input columns", cli="--feature-columns", group=DATA, dag=True,
        description="Extra numeric input columns (the target is always an input)")
    freq: str | None = setting(
        None, help="pandas frequency alias (h, 30min, D, W-SUN, MS); inferred from the timestamps if omitted",
        cli="--freq", group=DATA, dag=True,
        description="pandas frequency (h, 30min, D, W-SUN, MS); empty: inferred from the timestamps")
    # DAG: the run's data interval end when empty (onnxcast.airflow.steps.CheckDataOperator)
    trained_until: str | None = setting(
        None, help="ignore rows after this ISO timestamp", cli="--trained-until", group=DATA, dag=True,
        description="Ignore data after this timestamp; empty: the run's data interval end")
    horizon: int = setting(24, help="steps to forecast", cli="--horizon", group=FORECAST, dag=True,
                           low=1, high=10_000)
    lookback: int = setting(168, help="history steps the models are trained on", cli="--lookback",
                            group=FORECAST, dag=True, description="History steps the model is trained on",
                            low=2, high=100_000)
    models: tuple[str, ...] = setting(
        DEFAULT_FAMILIES, help="comma-separated families: " + ", ".join(MODEL_FAMILIES) + " (default: all but base "
        "and ensemble; ensemble: the others combined, after them)", cli="--models",
        group=TRAINING, dag="families", choices=MODEL_FAMILIES, labels=FAMILY_LABELS,
        dag_default=tuple(f for f in FAMILY_LABELS if f in DEFAULT_FAMILIES),
        description="Model families trained in parallel (one mapped task each); Ensemble: the others "
                    "combined once they trained (at least two of them)")
    season: int | None = setting(
        None, help="seasonal-naive period in steps; derived from the frequency if omitted", cli="--season",
        group=FORECAST, low=1, high=100_000)
    validation_fraction: float = setting(0.15, help="share of the rows for validation (early stopping)",
                                         low=0.0, high=0.5, low_open=True, high_open=True)
    holdout_fraction: float = setting(0.15, help="share of the rows for the holdout (the judged forecasts)",
                                      low=0.0, high=0.5, low_open=True, high_open=True)
    # training
    max_epochs: int = setting(30, help="training epochs at most", cli="--max-epochs", group=TRAINING,
                              dag=True, description="Training epochs at most (early stopping)",
                              low=1, high=100_000)
    max_minutes: float = setting(10.0, help="training minutes per family at most", cli="--max-minutes",
                                 group=TRAINING, low=0.0, high=7 * 24 * 60, low_open=True)
    patience: int = setting(5, help="stop after this many epochs without a better validation loss",
                            cli="--patience", group=TRAINING, low=1, high=100_000)
    batch_size: int = setting(64, help="training windows per step", cli="--batch-size", group=TRAINING,
                              low=1, high=1_000_000)
    learning_rate: float = setting(2e-3, help="AdamW learning rate", cli="--learning-rate", group=TRAINING,
                                   low=0.0, high=10.0, low_open=True)
    # widths beyond 4,096 train nothing on a CPU worker; the estimate in model_size_problems
    # bounds what these ranges still allow in combination (N-HiTS is 8x hidden_size wide)
    hidden_size: int = setting(64, help="LSTM hidden units (N-HiTS: MLP width 8x this)", cli="--hidden-size",
                               group=TRAINING, low=1, high=4096)
    num_layers: int = setting(2, help="LSTM and Transformer layers", cli="--num-layers", group=TRAINING,
                              low=1, high=64)
    d_model: int = setting(64, help="Transformer width", cli="--d-model", group=TRAINING, low=1, high=4096)
    n_heads: int = setting(4, help="Transformer attention heads (must divide --d-model)", cli="--n-heads",
                           group=TRAINING, low=1, high=1024)
    # ~24 tokens a window: the Transformer's attention is 24**2 scores a head, the LSTM's recurrence
    # 24 sequential steps (PatchTST, SegRNN; docs/performance.md)
    patch_length: int = setting(
        0, help="LSTM and Transformer steps per token (patches cut from the newest step); 0: lookback // 24, "
                "at least 1",
        cli="--patch-length", group=TRAINING, low=0, high=100_000)
    base_finetune_minutes: float = setting(
        1.0, help="base (pretrained) family: minutes of fine-tuning from the shipped weights (0: zero-shot, as "
                  "for data too short for a training window)", cli="--base-finetune-minutes", group=TRAINING,
        low=0.0, high=7 * 24 * 60)
    seed: int = setting(42, help="random seed (training is repeatable)", cli="--seed", group=TRAINING,
                        low=0, high=2**32 - 1)
    # export / optimize / validate
    opset: int | None = setting(None, help="convert the export to this ONNX opset", cli="--opset",
                                group=EXPORT, low=14, high=30)
    accuracy_budget: float = setting(
        0.01, help="largest relative holdout-MAE loss of int8/fp16 vs fp32 for a variant to be chosen",
        cli="--accuracy-budget", group=EXPORT, low=0.0, high=1.0)
    # a model equal to its seasonal-naive anchor "beat" it by float32 rounding (onnxcast.pipeline.validate)
    baseline_margin: float = setting(
        0.01, help="how much lower (relative) a family's fp32 holdout MAE must be than the best baseline's "
                   "for the family to be eligible (0.01: 1% lower)",
        cli="--baseline-margin", group=EXPORT, low=0.0, high=1.0, high_open=True)
    # forecast distributions (onnxcast.pipeline.intervals, docs/intervals.md)
    quantile_levels: str = setting(
        "0.025,0.1,0.5,0.9,0.975", help="levels of the models' quantiles output, comma-separated and "
        "ascending (pairs a, 1-a make the central intervals judged on holdout)", cli="--quantile-levels",
        group=FORECAST, metavar="LEVELS")
    coverage_tolerance: float = setting(
        0.05, help="gate: the holdout coverage of the 80% and 95% intervals must be within this of nominal "
                   "(0.05: 5 points)", cli="--coverage-tolerance", group=EXPORT, low=0.0, high=1.0)
    # a coverage judged on enough independent holdout windows that misses refuses the family only
    # when strict: intervals alone kept every family of monthly series from shipping while their
    # forecasts beat the seasonal naive by 31-36% (issue 30; docs/intervals.md, "Gates")
    strict_intervals: bool = setting(
        False, help="refuse a family whose interval coverage misses (judged on at least 20 independent holdout "
                    "windows); without it, its intervals are recalibrated on the most recent windows (one series) "
                    "or shipped marked uncalibrated (a fleet)",
        cli="--strict-intervals", group=EXPORT, dag=True,
        description="Refuse a family whose forecast intervals miss their coverage (otherwise: recalibrate or mark)")
    # onnxcast.registry.champion; a str has no `choices` (those are list settings'): checked in __post_init__
    champion_metric: str = setting(
        "mase", help="what the challenger must beat the champion on: mase (holdout MAE, a fleet's mean MASE) or "
                     "msis (the 95% interval's mean scaled interval score)", cli="--champion-metric",
        group=EXPORT, dag=True, pattern=CHAMPION_METRIC_PATTERN, metavar="METRIC",
        description="What the challenger must beat the champion on: mase (point forecast) or msis (the 95% "
                    "interval)")
    parity_rtol: float = setting(1e-3, help="relative tolerance of ONNX vs torch outputs", low=0.0, high=1.0)
    parity_atol: float = setting(1e-4, help="absolute tolerance of ONNX vs torch outputs", low=0.0)
    latency_repeats: int = setting(30, help="timed runs per batch size for the latency figures",
                                   cli="--latency-repeats", group=EXPORT, low=1, high=100_000)
    threads: int = setting(
        1, help="threads per step (training, validation, latency figures); 1 keeps parallel workers from "
                "thrashing", cli="--threads", group=EXPORT, low=1, high=1024)
    # deployment targets (onnxcast.targets, docs/targets.md): each eligible variant is run and judged on each
    targets: tuple[str, ...] = setting(
        DEFAULT_TARGETS, help="comma-separated deployment targets every eligible variant is validated on: "
        + ", ".join(TARGETS) + " (docs/targets.md)", cli="--targets", group=EXPORT, dag=True,
        choices=tuple(TARGETS), description="Deployment targets each variant is validated on (one mapped task "
                                            "each): runtime and processor")
    # onnxcast.pipeline.training.BF16_FAMILIES: measured per family, speed and holdout MAE (docs/performance.md)
    bf16_training: bool = setting(
        False, help="train the LSTM in bfloat16 autocast where the CPU has bf16 units (AMX, AVX512-BF16): about "
                    "1.5x as many windows a second, holdout MAE not shown equal (hourly demand: +4.6% over 8 "
                    "seeds, within seed noise); validation stays float32, other families are not faster in bf16",
        cli="--bf16-training", group=TRAINING)
    # fleet mode (series_column set)
    fleet_shards: int = setting(
        4, help="fleet: shards of series for the per-series work (data checks, reference, evaluation), one "
                "mapped task each in Airflow", cli="--shards", group=DATA, dag=True, low=1, high=256)
    fleet_windows_per_epoch: int = setting(
        20_000, help="fleet: training windows drawn per epoch, across the series", cli="--windows-per-epoch",
        group=TRAINING, low=1, high=100_000_000)
    fleet_validation_series: int = setting(
        2_000, help="fleet: series sampled for the validation loss (early stopping)", low=1, high=10_000_000)
    series_sampling_power: float = setting(
        0.5, help="fleet: a series is drawn for training with weight (its windows)^POWER: 0 every series "
                  "alike, 1 every window alike", low=0.0, high=1.0)
    reference_max_series: int = setting(
        2_000, help="fleet: the statistical reference runs on a random sample of this many series (0: all)",
        cli="--reference-series", group=EXPORT, low=0, high=10_000_000)
    reference_max_origins: int = setting(
        3, help="fleet: holdout origins per series of the statistical reference (the last ones)", low=1,
        high=10_000)
    model_name: str = setting(
        "onnxcast-forecaster", help="registered model name, MLflow experiment and rollout store folder",
        dag=True, pattern=MODEL_NAME_PATTERN)
    quality: QualitySettings = field(default_factory=QualitySettings)

    def __post_init__(self) -> None:
        try:  # the declared targets, in order, without duplicates; one line naming an unknown one
            text = self.targets if isinstance(self.targets, str) else ",".join(map(str, self.targets))
            names = tuple(t.name for t in parse_targets(text))
        except UnknownTargetError as exc:
            raise ConfigError(f"invalid settings: targets: {exc}") from None
        object.__setattr__(self, "targets", names)
        problems = check_ranges(self, ranges(type(self)))
        if not self.data_uri:
            problems.append("data_uri is empty")
        if not isinstance(self.quality, QualitySettings):
            problems.append(f"quality must be QualitySettings or a mapping, got {type(self.quality).__name__}")
        if problems:  # the checks below compare numbers: stop at the first wrong type or range
            raise ConfigError("invalid settings: " + "; ".join(problems))
        problems += check_choices(self)
        try:
            parse_quantile_levels(self.quantile_levels)
        except ValueError as exc:
            problems.append(str(exc))
        if self.champion_metric not in CHAMPION_METRICS:
            problems.append(f"champion_metric must be one of {list(CHAMPION_METRICS)}, got {self.champion_metric!r}")
        if tuple(self.models) == ("ensemble",):
            problems.append("models: ensemble combines the other families of the run; name at least two of them "
                            "too (e.g. nhits,dlinear,ensemble)")
        if self.d_model % self.n_heads:
            problems.append(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.patch_length > self.lookback:
            problems.append(f"patch_length ({self.patch_length}) must be at most the lookback ({self.lookback})")
        if self.target_column in self.feature_columns:
            problems.append(f"target column {self.target_column!r} is also listed as a feature")
        if self.series_column and self.series_column in (self.time_column, self.target_column,
                                                         *self.feature_columns):
            problems.append(f"series column {self.series_column!r} is also the time, target or a feature column")
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
    def sequence_patch(self) -> int:
        """Steps per LSTM/Transformer token: ``patch_length``, or ``lookback // 24`` (at least 1) for 0."""
        return sequence_patch(self.patch_length, self.lookback)

    @property
    def levels(self) -> tuple[float, ...]:
        """``quantile_levels`` as floats."""
        return parse_quantile_levels(self.quantile_levels)

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
        for key in ("feature_columns", "models", "targets"):
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
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path) -> PipelineConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))


# --- the settings as the CLI and the DAG show them ---------------------------------------------


class Setting(NamedTuple):
    """One setting, read from its field (see :func:`setting`)."""

    name: str  # quality.<name> for a QualitySettings field
    kind: type  # str, int, float, bool or tuple (a list of strings)
    nullable: bool  # None is a value (derived, inferred or the library's default)
    default: Any  # dataclasses.MISSING: required
    help: str
    cli: str | None
    group: str | None
    metavar: str | None
    dag: str | None  # the training DAG's param
    description: str  # the DAG's
    dag_default: Any  # the form's default
    low: float | None
    high: float | None
    low_open: bool
    high_open: bool
    choices: tuple[str, ...]
    labels: dict[str, str] | None
    pattern: str | None

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING


@functools.cache
def settings(cls: type = PipelineConfig) -> tuple[Setting, ...]:
    """Every setting of ``cls`` in declaration order, those of a nested settings class (quality)
    as ``<field>.<name>`` where the field is."""
    hints = typing.get_type_hints(cls)
    out: list[Setting] = []
    for f in dataclasses.fields(cls):
        kind, nullable = _kind(hints[f.name])
        if dataclasses.is_dataclass(kind):
            out += [s._replace(name=f"{f.name}.{s.name}") for s in settings(kind)]
            continue
        m = f.metadata
        if "help" not in m:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting()")
        default = f.default
        dag = f.name if m["dag"] is True else m["dag"] or None
        description = m["description"] or m["help"][:1].upper() + m["help"][1:]
        dag_default = default if m["dag_default"] is dataclasses.MISSING else m["dag_default"]
        out.append(Setting(f.name, kind, nullable, default, m["help"], m["cli"], m["group"], m["metavar"], dag,
                           description, dag_default, m["low"], m["high"], m["low_open"], m["high_open"],
                           m["choices"], m["labels"], m["pattern"]))
    return tuple(out)


def _kind(hint: Any) -> tuple[type, bool]:
    """(the type, whether None is allowed) of an annotation: ``int | None`` is (int, True)."""
    nullable = False
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable, hint = len(args) < len(typing.get_args(hint)), args[0]
    return typing.get_origin(hint) or hint, nullable


def data_source(uri: str) -> str:
    """Where the data of ``uri`` is: the built-in example data for ``example``, else ``uri``."""
    if uri == EXAMPLE_DATA:
        return example_data_path()
    return uri


def example_data_path() -> str:
    """Path of the Victoria electricity demand CSV shipped inside the statsmodels wheel."""
    import statsmodels

    path = Path(statsmodels.__file__).parent.parent / EXAMPLE_CSV
    if not path.exists():
        raise DataError(f"example data not found at {path}; is statsmodels installed?")
    return str(path)


def check_choices(cfg: Any) -> list[str]:
    """One problem per list setting that is not a non-empty subset of its choices."""
    problems = []
    for s in settings(type(cfg)):
        if s.choices and "." not in s.name:
            value = getattr(cfg, s.name)
            if not value or any(v not in s.choices for v in value):
                problems.append(f"{s.name} must be a non-empty subset of {list(s.choices)}, got {list(value)}")
    return problems


# --- ranges of the numeric settings ---------------------------------------------------------
# From the fields (low, high of setting()), so no numeric setting can slip through unchecked
# (tests/onnxcast/pipeline/test_config.py walks every field).


class Range(NamedTuple):
    kind: type
    low: float | None
    high: float | None
    low_open: bool
    high_open: bool
    nullable: bool = False


@functools.cache
def ranges(cls: type) -> dict[str, Range]:
    """name: the range of each number (and bool) setting of ``cls`` itself (not nested ones)."""
    return {s.name: Range(s.kind, s.low, s.high, s.low_open, s.high_open, s.nullable)
            for s in settings(cls) if "." not in s.name and s.kind in (int, float, bool)}


RANGES = ranges(PipelineConfig)
QUALITY_RANGES = ranges(QualitySettings)


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
    "base": ("horizon",),
    "ensemble": ("lookback", "horizon"),
}


TOKENS_PER_WINDOW = 24  # the LSTM's and the Transformer's default patch: lookback // 24 steps
PATCHED_FAMILIES = ("lstm", "transformer")


def sequence_patch(patch_length: int, lookback: int) -> int:
    """Steps per LSTM/Transformer token for the ``patch_length`` setting (0: automatic)."""
    return patch_length or max(1, lookback // TOKENS_PER_WINDOW)


def model_size_problems(cfg: PipelineConfig) -> list[str]:
    """One problem per selected family whose estimated size is over the limits, naming the
    setting that makes it so and the largest value of it that fits with the others."""
    problems = []
    if "base" in cfg.models and cfg.horizon > BASE_MAX_HORIZON:
        problems.append(f"horizon {cfg.horizon:,} is beyond the base model's {BASE_MAX_HORIZON} steps: use horizon "
                        f"{BASE_MAX_HORIZON} or less with --models base")
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
        inputs = features * sequence_patch(cfg.patch_length, lookback)
        lstm = 4 * h * (inputs + h + 2) + (layers - 1) * 4 * h * (2 * h + 2)
        return lstm + h * horizon + horizon + anchors, 0
    if family == "transformer":
        d, layers = v["d_model"], v["num_layers"]
        patch = sequence_patch(cfg.patch_length, lookback)
        tokens = lookback // patch
        layer = 4 * (d * d + d) + 2 * (2 * d * d) + 3 * d + 4 * d  # attention, feed-forward, two norms
        parameters = features * patch * d + d + layers * layer + 2 * d + 2 * d * horizon + horizon + anchors
        # scores, softmax and their gradients: 3 float32 [batch, heads, tokens, tokens] per layer
        attention = 3 * 4 * v["batch_size"] * v["n_heads"] * tokens * tokens * layers
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


def check_ranges(values: Any, table: dict[str, Range], prefix: str = "") -> list[str]:
    """One problem per setting of the wrong type or outside its range (NaN and inf included)."""
    problems = []
    for name, (kind, low, high, low_open, high_open, nullable) in table.items():
        value = getattr(values, name)
        label = f"{prefix}{name}"
        if value is None and nullable:
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
