"""The forecasting-to-ONNX pipeline as steps over a run directory.

Each step reads what earlier steps wrote under ``cfg.out_dir`` and writes its own files
atomically, so a step can be retried (Airflow) and run in another process. The files are
named by :class:`onnxcast.pipeline.layout.RunLayout` (``cfg.layout``): prepare_data writes config,
data and quality; train_family (or a fetch) the model; export_family and optimize_family
the ONNX variants; validate_family the family's validation; assemble_report the report,
last.

``run_pipeline`` runs them all for the CLI, in a staging folder that replaces the output
only when the run succeeded.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from onnxcast import __version__
from onnxcast.base.contract import format_quantile_levels
from onnxcast.base.errors import ConfigError, DataError, DataQualityError, GateError, OnnxcastError
from onnxcast.base.files import read_json, write_json
from onnxcast.base.s3 import S3Settings
from onnxcast.pipeline import fleet_quality
from onnxcast.pipeline.checkpoint import load_model, save_model
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.data import utc_iso, windows
from onnxcast.pipeline.ensemble import (
    ENSEMBLE,
    ensemble_last,
    ensemble_metadata,
    ensemble_summary,
    skipped_families,
    train_ensemble,
)
from onnxcast.pipeline.evaluation import reference_model
from onnxcast.pipeline.fleet_data import (
    FleetData,
    load_split,
)
from onnxcast.pipeline.fleet_eval import (
    AcrossSeries,
    evaluate_shard,
    fleet_report,
    reference_shard,
)
from onnxcast.pipeline.fleet_train import train_global, validation_windows
from onnxcast.pipeline.intervals import calibrate
from onnxcast.pipeline.judging import ACROSS_SERIES, OVER_ORIGINS, judging_for
from onnxcast.pipeline.layout import FAILED_REPORT, REPORT, RunLayout
from onnxcast.pipeline.ownership import FOLDER, OwnedOutput, entries_of
from onnxcast.pipeline.pretrained.weights import BASE_PROVENANCE_METADATA
from onnxcast.pipeline.report import attach_targets, compare_families, select_variants
from onnxcast.pipeline.seasons import evaluation_seasons
from onnxcast.pipeline.validate import (
    OverOrigins,
    baselines_for,
    holdout_origins_for,
    validate_family_variants,
)

log = logging.getLogger(__name__)

STAGING = ".staging"
# ``intervals_calibrated_on`` (model.json, ONNX metadata) of intervals recalibrated on the most
# recent windows after a coverage miss (recalibrate_family); "validation" otherwise
RECENT = "recent"
# The top-level entries a run writes into its output folder (RunLayout names them): the only
# names a run may replace there, and only where an earlier run wrote them (ownership.py).
OUTPUT_ENTRIES = tuple(getattr(RunLayout("."), name).name
                       for name in ("config", "data", "quality", "models", "report", "failed_report"))


class RunDirBusyError(OnnxcastError):
    """Another pipeline run holds the output folder."""


def prepare_data(cfg: PipelineConfig, *, s3_settings: S3Settings | None = None) -> dict:
    """The data gate in one process, for any number of series (read from S3 with
    ``s3_settings``, None: boto3's chain): the table, the series of every shard, the merge
    (:func:`merge_data`); returns the dataset summary."""
    started = time.monotonic()
    for shard in fleet_quality.check_fleet_table(cfg, s3_settings=s3_settings):
        fleet_quality.check_fleet_shard(cfg, shard)
    summary = merge_data(cfg)
    log.info("data checked in %.1fs", time.monotonic() - started)
    return summary


def merge_data(cfg: PipelineConfig) -> dict:
    """Merge the shards' verdicts into the series the run keeps (``data/fleet/``, the split,
    ``data/dataset.json``); return the dataset summary. A run judged over its origins (one
    series kept) then measures its baselines and the statistical reference on those origins
    (``baselines.json``); across series, the shard steps do (fleet_eval.reference_shard)."""
    summary = fleet_quality.merge_fleet_checks(cfg)
    series, split = load_split(cfg.layout.fleet, cfg)
    if judging_for(series.n_series) == OVER_ORIGINS:
        _measure_baselines(cfg, series, split)
    dataset, quality = summary["dataset"], summary["quality"]
    log.info("data: %d rows of %d series %s..%s freq=%s season=%d; %d check(s), %d warning(s)", dataset["rows"],
             dataset["n_series"], dataset["start"], dataset["end"], dataset["freq"], dataset["season"],
             len(quality["checks"]), len(quality["warnings"]))
    return summary


def _measure_baselines(cfg: PipelineConfig, series: FleetData, split) -> None:
    """One series judged over its origins: the baselines and the statistical reference on its
    holdout origins (baselines.json)."""
    if cfg.lookback < series.season:
        raise ConfigError(f"lookback {cfg.lookback} is shorter than the season {series.season} of "
                          f"{series.freq!r} data: the models start from the last season of history; "
                          f"use a lookback of at least {series.season} or set season")
    # The statistical reference forecasts from every holdout origin: 25-80 s of this step on
    # the example data, silent before. Say what runs, and keep saying that it still does.
    log.info("baselines and the statistical reference: %s", _reference_plan(cfg, series, split))
    with _heartbeat("still fitting the statistical reference", every=15.0):
        baselines = baselines_for(cfg, series, split, reference=True)
    write_json(cfg.layout.baselines, baselines)
    best = baselines["seasonal_naive"]
    log.info("baselines on %d origins (stride %d): best %s MAE %.4g; reference %s MAE %.4g",
             baselines["origins"]["count"], baselines["origins"]["stride"], baselines["best"], best["mae"],
             baselines["reference"]["model"], baselines["reference"]["mae"])


def _reference_plan(cfg: PipelineConfig, series, split) -> str:
    """What the reference step will fit, in words: the model, how many origins, how much history."""
    origins = holdout_origins_for(cfg, series, split)
    name, _, window = reference_model(evaluation_seasons(series.freq, series.season), int(origins.index.min()))
    return (f"{name} on the last {window} rows at each of {len(origins.index)} holdout origins "
            f"(parameters estimated once per horizon)")


@contextlib.contextmanager
def _heartbeat(message: str, every: float) -> Iterator[None]:
    """Log ``message`` with the elapsed time every ``every`` seconds while the block runs."""
    import threading

    done = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            log.info("%s (%.0fs so far)", message, time.monotonic() - started)

    thread = threading.Thread(target=beat, name="onnxcast-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def train_family(cfg: PipelineConfig, family: str) -> dict:
    """Train one model family on the saved series, one or many (onnxcast.pipeline.fleet_train.
    train_global); save its state dict and config. The ensemble combines the families trained
    before it (onnxcast.pipeline.ensemble.train_ensemble): ``skipped`` with fewer than two."""
    if family == ENSEMBLE:
        return train_ensemble(cfg, family)
    return train_global(cfg, family)


def export_family(cfg: PipelineConfig, family: str, recent: bool = False) -> str:
    """Calibrate the model's quantiles on this run's validation windows (``recent``: on the most
    recent windows, :func:`calibrate_family`), then export it to ``onnx/fp32.onnx`` with the
    contract's metadata (``intervals_calibrated_on`` says which), trained until the latest end
    over its series; a global model (judged across series) also says so (``global``,
    ``n_series``, ``series_column``)."""
    from onnxcast.pipeline.export import export_onnx

    model, spec = calibrate_family(cfg, family, recent=recent)
    fleet = FleetData.load(cfg.layout.fleet, mmap=True)
    # one calendar per distinct (start, length): few on a real fleet, whatever its size
    firsts = dict(zip(zip(fleet.starts.tolist(), fleet.lengths.tolist(), strict=True), range(fleet.n_series),
                      strict=True))
    latest = max(fleet.end(i) for i in firsts.values())
    global_keys = ({"global": "true", "n_series": fleet.n_series, "series_column": cfg.series_column}
                   if judging_for(fleet.n_series) == ACROSS_SERIES else {})
    metadata = {
        "model_family": spec.family, "lookback": spec.lookback, "horizon": spec.horizon,
        "freq": fleet.freq, "target": cfg.target_column, "features": ",".join(cfg.feature_columns),
        "precision": "fp32", "trained_until": utc_iso(latest),
        "dataset_sha256": fleet.sha256, "season": fleet.season, "version": __version__,
        "quantile_levels": format_quantile_levels(spec.quantile_levels),
        "intervals_calibrated_on": RECENT if recent else "validation", **global_keys,
        **ensemble_metadata(spec),
        **base_metadata(cfg, spec.family, family),
    }
    path = export_onnx(model, cfg.layout.onnx(family), n_features=spec.n_features,
                       lookback=spec.lookback, metadata=metadata, opset=cfg.opset)
    return str(path)


def base_metadata(cfg: PipelineConfig, architecture: str, family: str) -> dict:
    """The pretrained base forecaster's provenance (model.json's ``pretrained``: corpus, seed,
    command, sha256, training seconds, held-out panel) and use (zero-shot or fine-tuned) as ONNX
    metadata; nothing for other families."""
    if architecture != "base":
        return {}
    document = read_json(cfg.layout.model_json(family))
    return {BASE_PROVENANCE_METADATA: json.dumps(document.get("pretrained", {}), sort_keys=True),
            "base_use": str(document.get("use", ""))}


def calibrate_family(cfg: PipelineConfig, family: str, recent: bool = False):
    """Set the model's quantile offsets from this run's validation windows (split-conformal,
    onnxcast.pipeline.intervals.calibrate) at ``cfg.levels`` and save model.pt and model.json
    with them; returns ``(model, spec)``. ``recent`` (one series): from the most recent windows
    instead, every window whose forecast steps lie in the holdout (:func:`recalibrate_family`).

    Here, not in training, so a fetched model (trained before forecast distributions, or on
    other data) is calibrated on the data it is judged on, exactly as a trained one; the same
    windows give the same offsets, so a retried export writes the same files."""
    from dataclasses import replace as replace_spec

    model, spec = load_model(cfg, family)
    series, split = load_split(cfg.layout.fleet, cfg, mmap=True)
    if judging_for(series.n_series) == ACROSS_SERIES:
        x, y, _ = validation_windows(series, split, spec.lookback, spec.horizon, season=spec.season,
                                     max_series=cfg.fleet_validation_series, seed=cfg.seed)
    else:
        start, end = (int(split.validation_end[0]), len(series.values)) if recent else (int(split.train_end[0]),
                                                                                         int(split.validation_end[0]))
        x, y = windows(series.values, spec.lookback, spec.horizon, start, end)[:2]
    try:
        info = calibrate(model, x, y, cfg.levels)
    except ValueError as exc:
        raise DataError(f"{family}: cannot calibrate the forecast intervals: {exc}") from None
    info["calibrated_on"] = RECENT if recent else "validation"
    spec = replace_spec(spec, quantile_levels=cfg.levels)
    document = read_json(cfg.layout.model_json(family))
    document.pop("spec", None)
    document.pop("onnxcast_version", None)
    save_model(cfg, family, model, spec, {**document, "intervals": info})
    return model, spec


def optimize_family(cfg: PipelineConfig, family: str) -> list[str]:
    """Build fp32-opt, int8 and fp16 from fp32.onnx."""
    from onnxcast.pipeline.optimize import make_variants

    onnx_dir = cfg.layout.onnx_dir(family)
    # the rewrites and INT8 settings follow the architecture (a fetched champion's task is "champion")
    architecture = read_json(cfg.layout.model_json(family))["spec"]["family"]
    made = make_variants(cfg.layout.onnx(family), onnx_dir, architecture)
    write_json(cfg.layout.variants(family), [{"name": v.name, "path": v.path.name, "note": v.note} for v in made])
    return [v.name for v in made]


def validate_family(cfg: PipelineConfig, family: str) -> dict:
    """Validate every variant of ``family``; write and return its report entry. One path
    (validate.validate_family_variants), its holdout figures as the sample supports
    (:func:`judging`): across series (onnxcast.pipeline.fleet_eval, from the per-shard
    evaluations), else over the holdout origins of the one series (recalibrating the intervals
    where :func:`needs_recalibration`)."""
    model, spec = load_model(cfg, family)
    variants = read_json(cfg.layout.variants(family))
    how = judging(cfg)
    if how == ACROSS_SERIES:
        entry = validate_family_variants(cfg, family, model, variants, AcrossSeries(cfg, family, spec, variants))
    else:
        series, split = load_split(cfg.layout.fleet, cfg)
        baselines = load_baselines(cfg)
        entry = validate_family_variants(cfg, family, model, variants, OverOrigins(cfg, series, split, baselines))
        if needs_recalibration(cfg, entry):
            entry = recalibrate_family(cfg, family, entry, baselines)
    entry["judging"] = how
    entry["training"] = read_json(cfg.layout.model_json(family))
    combination = ensemble_summary(entry["training"])
    if combination:  # members, combination and weights of the ensemble, at the top of its entry
        entry["ensemble"] = combination
    write_json(cfg.layout.validation(family), entry)
    return entry


def judging(cfg: PipelineConfig) -> str:
    """How this run is judged: ``judging.judging_for`` the number of series it saved in
    ``data/fleet/`` (over origins or across series), whatever the input's form."""
    return judging_for(FleetData.load(cfg.layout.fleet, mmap=True).n_series)


def _judged_across_series(cfg: PipelineConfig) -> bool:
    """:func:`judging` from the merge's ``data/dataset.json``, for the shard steps, which do
    not stage ``data/fleet/`` (the whole fleet)."""
    return judging_for(int(read_json(cfg.layout.dataset)["dataset"]["n_series"])) == ACROSS_SERIES


def reference_step(cfg: PipelineConfig, shard: int) -> list[Path]:
    """The baselines and the statistical reference on one shard's series (fleet_eval), for a
    run judged across series; nothing for one judged over its origins (:func:`merge_data`
    measured them there)."""
    return [Path(reference_shard(cfg, shard))] if _judged_across_series(cfg) else []


def evaluate_step(cfg: PipelineConfig, shard: int, families: list[str] | None = None) -> list[Path]:
    """Every variant on one shard's series (fleet_eval), for a run judged across series;
    nothing for one judged over its origins (validate_family evaluates its origins)."""
    return [Path(p) for p in evaluate_shard(cfg, shard, families)] if _judged_across_series(cfg) else []


def needs_recalibration(cfg: PipelineConfig, entry: dict) -> bool:
    """Whether a family's intervals are recalibrated: its point forecasts passed every gate, its
    coverage was judged and missed, and the settings are not strict (one series only: a fleet's
    are marked, onnxcast.pipeline.fleet_eval). Nor when champion/challenger is decided on the
    95% interval's MSIS: recalibrated on the holdout, the challenger's MSIS there would be
    in-sample against the champion's out-of-sample one; its intervals are marked instead."""
    verdict = entry.get("intervals") or {}
    return (not cfg.strict_intervals and cfg.champion_metric != "msis" and entry["gates_passed"]
            and verdict.get("status") == "uncalibrated")


def recalibrate_family(cfg: PipelineConfig, family: str, first: dict, baselines: dict) -> dict:
    """Calibrate the family's intervals again on the most recent windows (the holdout's), export
    and optimize it again and validate the new files; the family's ``intervals`` say so, with
    the judged coverage that missed (``before``).

    Why the holdout: it is where the validation-calibrated intervals were shown to miss, and it
    is the latest data, the nearest to what the model will forecast. Its coverage is then
    in-sample: reported, never judged (validate.coverage_gate). Costs one more export, optimize
    and validation of the family, on this path only."""
    before = first["intervals"]
    log.info("%s: intervals missed their coverage (%s) while the forecasts passed: recalibrating them on the most "
             "recent windows", family, "; ".join(before.get("missed", [])))
    export_family(cfg, family, recent=True)
    optimize_family(cfg, family)
    series, split = load_split(cfg.layout.fleet, cfg)
    model, _ = load_model(cfg, family)
    entry = validate_family_variants(cfg, family, model, read_json(cfg.layout.variants(family)),
                                     OverOrigins(cfg, series, split, baselines, intervals_in_sample=True))
    calibration = read_json(cfg.layout.model_json(family))["intervals"]
    entry["intervals"] = {**entry["intervals"], "status": "recalibrated", "before": before,
                          "calibration_windows": calibration["windows"],
                          "note": f"recalibrated on the {calibration['windows']} most recent windows (every window "
                                  "whose forecast steps lie in the holdout) after the coverage missed on validation-"
                                  "calibrated intervals; the holdout coverage shown is in-sample"}
    for variant in entry["variants"]:
        variant["intervals_status"] = "recalibrated"
    return entry


def load_baselines(cfg: PipelineConfig) -> dict:
    """The baselines prepare_data measured (computed again, without the reference, for a run
    directory from before they were saved)."""
    path = cfg.layout.baselines
    if path.exists():
        return read_json(path)
    series, split = load_split(cfg.layout.fleet, cfg)
    return baselines_for(cfg, series, split, reference=False)


def assemble_report(cfg: PipelineConfig, families: list[str] | None = None) -> dict:
    """Combine the steps' outputs into report.json.

    A family that failed a required gate is left out of the choice and recorded in
    ``excluded`` with why; GateError only when no family passed.

    Judged across series (:func:`judging`): the legacy keys hold aggregates over series (``models[*].fp32_holdout_mae``
    and every variant's ``holdout.mae`` are the MEAN MASE over series; ``baselines`` are the
    best naive of each series, onnxcast.pipeline.fleet_eval.fleet_baselines), families are
    compared on per-series fp32 MASE, and an extra ``fleet`` object holds the aggregates,
    intervals and paired tests (docs/design/fleet.md 4.3). The report's ``judging`` (and each
    family's in validation.json) says which: ``over_origins`` or ``across_series``; readers
    route on it (``judging.report_judging``), not on the ``fleet`` object's presence.
    """
    models = [read_json(cfg.layout.validation(f)) for f in (families or cfg.models)]
    how = judging(cfg)
    summary, baselines, family_choice, fleet = _judged_figures(cfg, how, models)
    selected, ranking = select_variants(models, family_choice)
    attach_targets(cfg.layout, cfg.targets, models, selected)
    excluded = [{"family": m["family"], "failures": m["failures"]} for m in models if not m["gates_passed"]]
    failures = [f"{m['family']}: {reason}" for m in models for reason in m["failures"]]
    if len(excluded) < len(models):
        failures = []  # at least one family passed: the others are excluded, not fatal
    report = {
        "onnxcast_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": cfg.to_dict(),
        "dataset": summary["dataset"],
        "split": summary["split"],
        "judging": how,
        "quality": summary["quality"],
        "baselines": {k: v for k, v in baselines.items() if k not in ("per_origin_mae", "reference")},
        "reference": baselines.get("reference"),
        "models": models,
        "family_choice": family_choice,
        "excluded": excluded,
        "selected": selected,
        "targets": list(cfg.targets),
        "ranking": ranking,
        "status": "failed" if failures else "passed",
        "failures": failures,
    }
    if fleet is not None:
        report["fleet"] = fleet
    skipped = skipped_families(cfg)
    if skipped:  # a family that could not be made (the ensemble with fewer than two members): why
        report["skipped"] = skipped
    if cfg.layout.trigger.exists():  # a retraining the monitor asked for: why
        report["trigger"] = read_json(cfg.layout.trigger)
    if failures:
        write_json(cfg.layout.failed_report, report)
        raise GateError(failures)
    write_json(cfg.layout.report, report)
    return report


def _judged_figures(cfg: PipelineConfig, how: str, models: list[dict]) -> tuple[dict, dict, dict, dict | None]:
    """The dataset summary, the baselines, the family comparison and (judged across series) the
    ``fleet`` block of the report."""
    if how == ACROSS_SERIES:
        parts = fleet_report(cfg, models)
        return parts["summary"], parts["baselines"], parts["family_choice"], parts["fleet"]
    baselines = load_baselines(cfg)
    return (read_json(cfg.layout.dataset), baselines, compare_families(models, baselines["origins"]["block"]),
            None)


# --- the whole run ------------------------------------------------------------------------

# the deployment-target step (onnxcast.targets.step.validate_on_target, above the pipeline in the layers:
# its caller passes it): (cfg, family, target) -> the evidence it wrote
TargetStep = Callable[[PipelineConfig, str, str], dict]


def run_pipeline(cfg: PipelineConfig, *, target_step: TargetStep | None = None) -> dict:
    """Run every step for every family; on success the output folder holds the new run.

    The run happens in ``<out>/.staging``. On failure the staging folder is removed and only
    the data-quality report (and ``failed-report.json`` for a gate failure) is kept, so a
    failed run never leaves a model or report.json behind. ``target_step`` runs after the
    validation for every family and target of ``cfg.targets``; without it only x86_64 (the
    validation itself) can be asked for.
    """
    if target_step is None and set(cfg.targets) != {"x86_64"}:
        raise ConfigError(f"targets {', '.join(cfg.targets)}: the pipeline's caller must pass the target step "
                          "(onnxcast.targets.step.validate_on_target; `onnxcast pipeline` does)")
    out = cfg.run_dir
    with run_dir_lock(out):
        return _run_locked(cfg, out, target_step)


def _run_locked(cfg: PipelineConfig, out: Path, target_step: TargetStep | None = None) -> dict:
    staging = out / STAGING
    # Before anything is read or trained: every name this run may replace in ``out`` must hold
    # only what an earlier onnxcast run wrote there (the first release replaced a user's data/).
    owned = OwnedOutput.read(out)
    owned.check((STAGING, *OUTPUT_ENTRIES), wholly=(STAGING,))
    # Holding the lock, no live run owns a staging folder here: one that exists was left by a
    # run that was killed (SIGKILL, a power cut) and is removed without following symlinks.
    if _remove(staging):
        log.info("removed %s left by an interrupted run", staging)
    owned = owned.claim({STAGING: FOLDER})
    staging.mkdir()
    _IN_PROGRESS[staging] = (out, owned)
    work = replace(cfg, out_dir=str(staging))
    started = time.monotonic()
    try:
        report = _run_steps(work, target_step)
    except BaseException as exc:
        _keep_diagnostics(staging, out, owned)
        if isinstance(exc, DataQualityError) and exc.report_path:  # it moved out of staging
            exc.report_path = str(out / Path(exc.report_path).relative_to(staging))
        raise
    finally:
        _IN_PROGRESS.pop(staging, None)
    _publish(staging, out, owned)
    log.info("pipeline finished in %.1fs: %s", time.monotonic() - started, cfg.layout.report)
    return report


def _run_steps(work: PipelineConfig, target_step: TargetStep | None = None) -> dict:
    """Every step of a run, in order, for any number of series: the per-shard steps one shard
    after another (Airflow maps them over the workers, onnxcast.airflow.steps). The per-shard
    reference and evaluation serve a run judged across series only."""
    shards = _step(1, "check the data", fleet_quality.check_fleet_table, work)
    for shard in shards:
        fleet_quality.check_fleet_shard(work, shard)
    _step(1, "check every series", merge_data, work)
    for shard in shards:
        reference_step(work, shard)
    families = []
    for family in ensemble_last(work.models):  # the ensemble combines the families trained before it
        if "skipped" in _step(2, f"train {family}", train_family, work, family):
            continue
        _step(3, f"export {family}", export_family, work, family)
        _step(4, f"optimize {family}", optimize_family, work, family)
        families.append(family)
    if judging(work) == ACROSS_SERIES:
        log.info("[5/6] evaluate every series")
    for shard in shards:
        evaluate_step(work, shard, families)
    for family in families:
        _step(5, f"validate {family}", validate_family, work, family)
    for family in families if target_step else ():
        for name in work.targets:
            _step(5, f"validate {family} on {name}", target_step, work, family, name)
    return _step(6, "report", assemble_report, work, families)


# The runs in progress in this process: staging folder -> (output folder, its ownership record).
_IN_PROGRESS: dict[Path, tuple[Path, OwnedOutput]] = {}


def abandon_runs() -> None:
    """Tidy every run in progress as a failure does (quality report kept, staging removed): for
    a process about to exit on SIGTERM (onnxcast.cli), which unwinds no stack."""
    for staging, (out, owned) in list(_IN_PROGRESS.items()):
        try:
            _keep_diagnostics(staging, out, owned)
        except (OSError, OnnxcastError) as error:  # tidied by the failure being handled, or not ours to touch
            log.warning("could not tidy %s: %s", staging, error)
        _IN_PROGRESS.pop(staging, None)


@contextlib.contextmanager
def run_dir_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on the folder ``out`` (created if need be) for a whole run.

    flock on the folder itself: no lock file is left behind, and the kernel releases the lock
    when the process dies however it dies, so the next run knows that a staging folder it
    finds is stale. A second run on the same folder is refused at once, before it touches
    anything, rather than deleting the first one's staging folder under it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise ConfigError(f"--out {out}: cannot be used as the output folder ({error.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirBusyError(f"{out}: another onnxcast pipeline run is writing to this folder; wait for it "
                                  "to finish or choose another --out") from None
        yield
    finally:
        os.close(fd)


def _remove(path: Path) -> bool:
    """Remove ``path`` if it exists, never following a symlink: a link is unlinked, not its
    target emptied (shutil.rmtree is fd-based here and does not follow links inside)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()
    return True


def _step(number: int, name: str, function, *args):
    log.info("[%d/6] %s", number, name)
    return function(*args)


def _publish(staging: Path, out: Path, owned: OwnedOutput) -> None:
    """Move the staged run into ``out``, report.json last (its presence means complete).

    Only entries the record of ``out`` owns are replaced (checked before the run, and again
    here: the user may have written into ``out`` while it trained); the record lists the new
    entries before they move, so a crash half-way leaves nothing unrecorded."""
    report = RunLayout(staging).report
    names = sorted(entry.name for entry in staging.iterdir())
    owned = _make_room(staging, out, owned, {*names, FAILED_REPORT, REPORT})
    for name in names:
        if staging / name != report:
            _move_in(staging / name, out / name)
    report.replace(RunLayout(out).report)
    staging.rmdir()
    owned.settle()


def _keep_diagnostics(staging: Path, out: Path, owned: OwnedOutput) -> None:
    """After a failed run: keep its data-quality report and failed-report.json in ``out``,
    replacing only what onnxcast owns there, and remove the staging folder."""
    kept = [name for name in (RunLayout(staging).quality.name, FAILED_REPORT) if (staging / name).exists()]
    try:
        owned = _make_room(staging, out, owned, kept)
        for name in kept:
            _move_in(staging / name, out / name)
    finally:
        _remove(staging)
        owned.settle()


def _make_room(staging: Path, out: Path, owned: OwnedOutput, names: Iterable[str]) -> OwnedOutput:
    """Check that every name of ``names`` in ``out`` is onnxcast's, record the staged entries
    that will replace them, and remove report.json and failed-report.json (the new run's
    report is moved in last); returns the record."""
    names = list(names)
    owned.check(names)
    owned = owned.claim(entries_of(staging, names))
    for name in (FAILED_REPORT, REPORT):
        if name in names:
            (out / name).unlink(missing_ok=True)
    return owned


def _move_in(source: Path, target: Path) -> None:
    """Rename ``source`` over ``target``: a file is replaced by the rename; a folder (checked to
    be onnxcast's) is removed first, without following links."""
    if os.path.lexists(target) and (target.is_symlink() or target.is_dir()):
        _remove(target)
    source.replace(target)
