"""Champion/challenger: which models a run evaluates, and whether the challenger wins.

A run evaluates its challengers (trained or fetched families) and, when a champion
exists, the champion itself: it is fetched into the run as the family ``champion`` and
goes through the same export, optimize and validate steps on the same holdout window.
The decision then compares numbers measured in this run, never numbers from the past.

Which families a run has, and which is the champion, is the run's plan (onnxcast.registry.plan).
"""

from __future__ import annotations

from pathlib import Path

from onnxcast.base.errors import ConfigError, DataError
from onnxcast.base.files import read_json, write_json
from onnxcast.pipeline.config import CHAMPION_METRICS, PipelineConfig
from onnxcast.pipeline.layout import RunLayout
from onnxcast.registry.fetch import FetchError, parse_source
from onnxcast.registry.interval_figures import (
    MSIS_KEY,
    family_intervals,
    per_origin_msis,
    variant_intervals,
)
from onnxcast.registry.plan import CHAMPION_FAMILY, PlanError, champion_entry, read_plan
from onnxcast.registry.tracking import (
    FAMILY_TAG,
    SERIES,
    TrackingError,
    client_for,
    is_fleet_report,
    read_per_series,
    resolve_version,
)

MSIS_TAG = "onnxcast.fp32_msis_95"  # a version's fp32 95% MSIS (tracking.interval_tags)
FLEET_METRIC = "mase"
MSIS = "msis"  # champion_metric: the 95% interval's MSIS (onnxcast.pipeline.config.CHAMPION_METRICS)


def decide(run_dir: str | Path, *, min_improvement: float = 0.0, require_beats_champion: bool = True,
           tracking_uri: str | None = None, metric: str | None = None) -> dict:
    """Compare the report's selected challenger with the champion evaluated in this run; one
    decision for any number of series.

    The figures are those the run recorded (:func:`challenger_figures`): one series, the fp32
    holdout MAE and its per-origin errors (:func:`_judge_series_champion`); several (a fleet
    report), the fp32 mean MASE and the per-series tables, the champion version's tags read
    from the registry at ``tracking_uri`` (:func:`_judge_fleet_champion`). The paired test is the
    one the sample supports (:func:`paired_on`: over the origins of one series, across series of
    several). The challenger wins when its figure is lower than the champion's by more than
    ``min_improvement`` (relative; 0.0: any improvement, a tie loses) and the test finds the
    difference significant; otherwise the champion stays. No champion: the challenger wins.
    ``metric`` (default: the run's ``champion_metric`` setting, else ``mase``): ``msis`` compares
    the fp32 95% interval's MSIS instead, recorded as ``metric``.
    Writes ``champion_challenger.json`` and returns the decision.
    """
    layout = RunLayout(run_dir)
    report = read_json(layout.report)
    decision = challenger_figures(report, champion_metric(layout, metric), min_improvement)
    champion, plan = champion_entry(run_dir), read_plan(run_dir)
    incomparable = plan.get("incomparable_champion")
    if champion is None and incomparable and require_beats_champion:
        decision.update(promote=False, champion_version=incomparable.get("version"),
                        reason=_not_comparable(incomparable.get("version"), incomparable.get("differences")))
        if "comparison" in decision:
            decision["comparison"] = "not comparable"
    elif champion is None:
        decision.update(promote=True, reason="no champion to compare with: " + ("; ".join(plan.get("notes", []))
                                                                               or "none registered"))
    else:
        judge = _judge_fleet_champion if is_fleet_report(report) else _judge_series_champion
        judge(layout, report, champion, decision, min_improvement=min_improvement,
              require_beats_champion=require_beats_champion, tracking_uri=tracking_uri)
    write_json(layout.decision, decision)
    return decision


def challenger_figures(report: dict, metric: str, min_improvement: float) -> dict:
    """The decision's first keys: the challenger's fp32 holdout figure and the holdout's span.
    Several series: ``challenger_mae`` holds the mean MASE (as ``fp32_holdout_mae`` does in a
    fleet report), beside ``challenger_mase`` with its interval and the series count."""
    family = report["selected"]["edge"]["family"]
    split = report["split"]
    empty = {"champion_version": None, "champion_family": None, "champion_mae": None}
    if not is_fleet_report(report):
        return {"metric": metric, "challenger_family": family,
                "challenger_mae": _family_entry(report, family)["fp32_holdout_mae"],
                "holdout_start": split["holdout_start"], "holdout_end": split["holdout_end"],
                "min_improvement": float(min_improvement), **empty, "improvement": None}
    mase, interval = _fleet_mase(report, family)
    return {"metric": metric, "challenger_family": family, "challenger_mae": mase, "challenger_mase": mase,
            "challenger_mase_ci95": interval, "series": (report.get("fleet") or {}).get("n_series"),
            "holdout_start": split.get("holdout_start"), "holdout_end": split.get("holdout_end"),
            "min_improvement": float(min_improvement), "comparison": None, **empty, "champion_mase": None,
            "improvement": None}


def paired_on(a, b, report: dict, block: int = 1) -> dict:
    """The paired test of A's figures against B's that the run's sample supports
    (significance.paired_comparison): Diebold-Mariano over the origins of one series (Newey-West
    over ``block - 1`` lags), across series of several (series the independent units, pairs
    that are not finite left out). Across series, ``origins`` repeats ``series``: the decision's
    tag ``onnxcast.decision.paired_test.origins`` keeps its name for a release (docs/changes-31.md)."""
    import numpy as np

    from onnxcast.pipeline.significance import paired_comparison

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    test = paired_comparison(a, b, series=series_count(report, len(a)), block=block)
    return {**test, "origins": test["series"]} if "series" in test else test


def series_count(report: dict, pairs: int) -> int:
    """The series the run judged: its ``fleet.n_series`` (else ``dataset.n_series``); a report
    of several series that does not say how many: the ``pairs`` it has; else one."""
    counted = (report.get("fleet") or {}).get("n_series") or (report.get("dataset") or {}).get("n_series")
    if counted:
        return int(counted)
    return pairs if is_fleet_report(report) else 1


def _judge_series_champion(layout: RunLayout, report: dict, champion: dict, decision: dict, *,
                           min_improvement: float, require_beats_champion: bool, tracking_uri: str | None) -> None:
    """One series: the fp32 holdout MAE of both on this run's holdout, paired on its origins."""
    entry = _family_entry(report, decision["challenger_family"])
    validation = read_json(layout.validation(CHAMPION_FAMILY))
    spec = read_json(layout.model_json(CHAMPION_FAMILY))["spec"]
    number, mine, theirs = champion.get("version"), decision["challenger_mae"], validation["fp32_holdout_mae"]
    improvement = 1.0 - mine / theirs if theirs else 0.0
    decision.update(champion_version=number, champion_family=spec["family"], champion_mae=theirs,
                    improvement=improvement)
    if decision["metric"] == MSIS:
        return _judge_on_msis(layout, report, validation, {}, None, decision, min_improvement=min_improvement,
                              require_beats_champion=require_beats_champion, tracking_uri=tracking_uri)
    test = _paired(entry, validation, report)
    decision["paired_test"] = test
    _verdict(decision, mine < theirs and improvement > min_improvement, bool(test["significant"]),
             f"challenger MAE {mine:.4g}", f"champion v{number} {theirs:.4g} ({improvement:+.2%})",
             "on the same holdout", _p_text(test), min_improvement=min_improvement,
             require_beats_champion=require_beats_champion)


# --- several series: comparability, per-series tables ----------------------------------------

def fleet_differences(tags: dict[str, str], *, series_column: str | None, horizon: int | None,
                      freq: str | None) -> dict[str, list]:
    """What makes a registered version incomparable with a fleet run, as ``{field: [the
    version's, the run's]}``; empty when comparable.

    A version without the tag ``onnxcast.global=true`` was trained on one series (every
    version from before fleet mode): its MAE is in that series' units, never a mean MASE over
    a fleet. Series column, horizon and frequency are compared where the version records them.
    """
    differences: dict[str, list] = {}
    is_global = str(tags.get("onnxcast.global", "false")).lower() == "true"
    if not is_global:
        differences["global"] = [False, True]
    for key, value in (("series_column", series_column), ("horizon", horizon), ("freq", freq)):
        recorded = tags.get(f"onnxcast.{key}")
        if value not in (None, "") and recorded not in (None, "") and str(recorded) != str(value):
            differences[key] = [recorded, value]
    return differences


def _judge_fleet_champion(layout: RunLayout, report: dict, champion: dict, decision: dict, *,
                          min_improvement: float, require_beats_champion: bool, tracking_uri: str | None) -> None:
    """Several series: the fp32 mean MASE of both, paired across the series both have, when the
    champion is comparable (:func:`fleet_differences`, and a mean MASE, never a MAE)."""
    number = decision["champion_version"] = champion.get("version")
    version, note = _champion_version(champion, tracking_uri)
    if note:
        decision["note"] = note
    validation, judged = _champion_numbers(layout, version, decision)
    differences = _run_differences(report, version, judged)
    if differences:
        decision.update(comparison="not comparable", differences=differences)
        if require_beats_champion:
            decision.update(promote=False, reason=_not_comparable(number, differences))
        else:
            decision.update(promote=True, reason=f"champion v{number} is not comparable ({differences}); the "
                                                 "challenger is promoted as asked (require_beats_champion is off)")
        return
    spec_path = layout.model_json(CHAMPION_FAMILY)
    champion_family = read_json(spec_path)["spec"]["family"] if spec_path.exists() else (
        version.tags.get("onnxcast.family") if version is not None else None)
    fp32 = (judged.get("variants") or {}).get("fp32") or {}
    theirs = fp32.get("mase_mean", validation.get("fp32_holdout_mase", validation.get("fp32_holdout_mae")))
    mine = decision["challenger_mase"]
    improvement = 1.0 - mine / theirs if theirs else 0.0
    decision.update(champion_family=champion_family, champion_mae=theirs, champion_mase=theirs,
                    champion_mase_ci95=fp32.get("mase_ci95"), improvement=improvement)
    if decision["metric"] == MSIS:
        return _judge_on_msis(layout, report, validation, judged, version, decision,
                                    min_improvement=min_improvement, require_beats_champion=require_beats_champion,
                                    tracking_uri=tracking_uri)
    significant, evidence = _mase_evidence(layout, report, decision, version, fp32, tracking_uri)
    _verdict(decision, mine < theirs and improvement > min_improvement, significant,
             f"challenger mean MASE {mine:.4g}", f"champion v{number} {theirs:.4g} ({improvement:+.2%})",
             "across series", evidence, min_improvement=min_improvement, require_beats_champion=require_beats_champion)


def _run_differences(report: dict, version, judged: dict) -> dict[str, list]:
    """:func:`fleet_differences` of the champion version's tags against this run's settings,
    plus ``metric`` when the champion's figure is not a mean MASE (never a MAE against a MASE)."""
    config = report.get("config") or {}
    differences = fleet_differences(version.tags if version is not None else {"onnxcast.global": "true"},
                                    series_column=config.get("series_column"), horizon=config.get("horizon"),
                                    freq=(report.get("dataset") or {}).get("freq") or config.get("freq"))
    if not judged or judged.get("metric", FLEET_METRIC) != FLEET_METRIC:
        differences["metric"] = [judged.get("metric") or "mae (one series)", FLEET_METRIC]
    return differences


def _mase_evidence(layout: RunLayout, report: dict, decision: dict, version, fp32: dict,
                   tracking_uri: str | None) -> tuple[bool, str]:
    """(significant, why): the paired test on the per-series MASE both have, else whether the two
    95% intervals over series do not overlap (the aggregates only)."""
    pairs, source = _paired_tables(layout, decision["challenger_family"], version, tracking_uri)
    if pairs is not None:
        test = paired_on(*pairs, report)
        count = test.get("series", len(pairs[0]))
        decision.update(paired_test=test, comparison=f"paired across {count} series ({source})")
        return bool(test["significant"]), _p_text(test)
    low = (decision.get("challenger_mase_ci95") or [None, None])[1]
    high = (fp32.get("mase_ci95") or [None, None])[0]
    significant = low is not None and high is not None and low < high
    decision.update(paired_test=None, comparison=f"aggregate only ({source}): a difference counts when the "
                                                  "95% intervals over series do not overlap")
    return significant, "aggregate only, the 95% intervals " + ("do not overlap" if significant else "overlap")


def _champion_numbers(layout: RunLayout, version, decision: dict) -> tuple[dict, dict]:
    """(the champion's validation entry, its ``fleet`` block): from this run when the champion
    was evaluated in it, else from its registry tags (mean MASE and interval of its own run)."""
    import json

    path = layout.validation(CHAMPION_FAMILY)
    if path.exists():
        validation = read_json(path)
        return validation, validation.get("fleet") or {}
    if version is None or "onnxcast.fp32_holdout_mase" not in version.tags:
        raise PlanError(f"{path}: the champion was not evaluated in this run, and its registry entry holds no "
                        "fleet figures (onnxcast.fp32_holdout_mase)")
    tags = version.tags
    mase = float(tags["onnxcast.fp32_holdout_mase"])
    interval = json.loads(tags.get("onnxcast.fp32_mase_ci95") or "null")
    decision["champion_figures"] = f"from its own run {version.run_id}: the champion was not evaluated in this run"
    fp32 = {"mase_mean": mase, "mase_ci95": interval}
    if tags.get(MSIS_TAG):  # a version registered with forecast distributions (tracking.interval_tags)
        fp32["intervals"] = {"msis_95": float(tags[MSIS_TAG])}
    return {"fp32_holdout_mase": mase}, {"metric": tags.get("onnxcast.metric"), "variants": {"fp32": fp32}}


def _family_entry(report: dict, family: str) -> dict:
    return next(m for m in report["models"] if m["family"] == family)


def _fleet_mase(report: dict, family: str) -> tuple[float, list | None]:
    """The family's fp32 mean MASE (and its interval) in a fleet report."""
    fp32 = (((report.get("fleet") or {}).get("families") or {}).get(family) or {}).get("fp32") or {}
    entry = next(m for m in report["models"] if m["family"] == family)
    mase = fp32.get("mase_mean", entry.get("fp32_holdout_mase", entry.get("fp32_holdout_mae")))
    return float(mase), fp32.get("mase_ci95")


def _champion_version(champion: dict, tracking_uri: str | None):
    """(the champion's ModelVersion, None), or (None, why it could not be read)."""
    try:
        source = parse_source(champion.get("source") or "")
    except FetchError as error:
        return None, f"champion source not readable ({error}): its registry tags were not checked"
    if source["kind"] != "mlflow":
        return None, f"champion from {source['uri']}: no registry tags to check"
    try:
        return resolve_version(source["name"], champion.get("version") or source.get("version")
                               or source.get("alias"), tracking_uri), None
    except TrackingError as error:
        return None, f"{error}: the champion's registry tags were not checked"


def _paired_tables(layout: RunLayout, family: str, version, tracking_uri: str | None, column: str = "fp32.mase"):
    """((challenger's ``column``, champion's ``column``) on the series both have, where from), or
    (None, why not). A table without ``column`` (``fp32.msis_95`` of a run from before forecast
    distributions) is a why-not for the interval columns, a DataError for MASE."""
    import tempfile

    mine = layout.per_series(family)
    if not mine.is_file():
        return None, f"no per-series table of the challenger ({mine})"
    theirs, source = layout.per_series(CHAMPION_FAMILY), "this run's series and origins"
    required = [column] if column == "fp32.mase" else []
    with tempfile.TemporaryDirectory(prefix="onnxcast-champion-") as scratch:
        if not theirs.is_file():
            theirs = _download_per_series(version, Path(scratch), tracking_uri)
            if theirs is None:
                return None, "no per-series table of the champion in this run or in its MLflow run"
            source = f"the champion's table from its own MLflow run {version.run_id}, its own holdout"
        champion_table = read_per_series(theirs, required)
    challenger_table = read_per_series(mine, required)
    for who, table in (("challenger", challenger_table), ("champion", champion_table)):
        if column not in table.columns:
            return None, f"the {who}'s per-series table has no column {column!r}"
    joined = challenger_table[[SERIES, column]].merge(
        champion_table[[SERIES, column]], on=SERIES, how="inner", suffixes=(".challenger", ".champion")).dropna()
    return (joined[f"{column}.challenger"].to_numpy(), joined[f"{column}.champion"].to_numpy()), source


def _download_per_series(version, folder: Path, tracking_uri: str | None) -> Path | None:
    """The champion family's ``per_series/<family>.parquet`` from the version's MLflow run."""
    if version is None:
        return None
    from mlflow.exceptions import MlflowException

    family = version.tags.get(FAMILY_TAG)
    if not family:
        return None
    try:
        return Path(client_for(tracking_uri).download_artifacts(version.run_id, f"per_series/{family}.parquet",
                                                               str(folder)))
    except (MlflowException, OSError):  # an older version: logged before per-series tables existed
        return None


def _not_comparable(version, differences) -> str:
    return (f"champion v{version} is not comparable with this run ({differences}); its consumers expect its "
            "shapes: promote this version explicitly (onnxcast_promote) if that is intended")


def _paired(challenger: dict, champion: dict, report: dict) -> dict:
    """Diebold-Mariano test of the two fp32 models' per-origin MAEs on this run's origins."""
    import numpy as np

    def errors(entry: dict):
        fp32 = next((v for v in entry.get("variants", []) if v["name"] == "fp32"), None)
        return np.asarray((fp32 or {}).get("per_origin_mae") or [], dtype=np.float64)

    block = int(((report.get("baselines") or {}).get("origins") or {}).get("block", 1))
    a, b = errors(challenger), errors(champion)
    if len(a) != len(b):
        a = b = np.zeros(0)
    return paired_on(a, b, report, block)


def _p_text(test: dict) -> str:
    """The evidence of a paired test in words: p on how many paired origins (or series)."""
    unit, count = ("series", test["series"]) if "series" in test else ("origins", test.get("origins", 0))
    if test.get("p_value") is None:
        return test.get("note") or f"{count} paired {unit}"
    robust = f", Wilcoxon p={test['robust_p']:.3g}" if test.get("robust_p") is not None else ""
    return f"p={test['p_value']:.3g} on {count} paired {unit}{robust}, alpha {test['alpha']}"


# --- deciding on the 95% interval (champion_metric "msis") ---------------------------------

def champion_metric(layout: RunLayout, metric: str | None = None) -> str:
    """``metric`` when given, else the run's ``champion_metric`` setting (config.json), else
    ``mase`` (a run directory from before the setting); ConfigError for anything else."""
    if metric is None and layout.config.is_file():
        metric = read_json(layout.config).get("champion_metric")
    metric = metric or FLEET_METRIC
    if metric not in CHAMPION_METRICS:
        raise ConfigError(f"champion_metric must be one of {list(CHAMPION_METRICS)}, got {metric!r}")
    return metric


def _judge_on_msis(layout: RunLayout, report: dict, validation: dict, judged: dict, version, decision: dict, *,
                   min_improvement: float, require_beats_champion: bool, tracking_uri: str | None) -> None:
    """The fp32 95% MSIS of both (several series: the mean over series), paired on the scores
    the run has (:func:`_msis_scores`: per origin of one series, per series of several), else
    on the aggregates only."""
    number, family = decision["champion_version"], decision["challenger_family"]
    several = is_fleet_report(report)
    mine_block = family_intervals(report, family)
    theirs_block = (((judged.get("variants") or {}).get("fp32") or {}).get("intervals")
                    or variant_intervals(validation))
    mine, theirs = mine_block.get(MSIS_KEY), theirs_block.get(MSIS_KEY)
    decision.update(challenger_msis_95=mine, champion_msis_95=theirs, improvement=None, paired_test=None)
    missing = _missing_msis(mine, theirs, number, "fleet" if several else "holdout")
    if missing:
        return _not_comparable_on_msis(decision, number, missing, require_beats_champion)
    scores, why = _msis_scores(layout, report, validation, version, tracking_uri)
    if scores is not None:
        block = int(((report.get("baselines") or {}).get("origins") or {}).get("block", 1))
        test = paired_on(scores[0], scores[1], report, block)
        compared = (f"across {test['series']} series" if "series" in test else f"on {test['origins']} origins")
        decision.update(paired_test=test, comparison=f"paired {compared} ({why})")
        significant, evidence = bool(test["significant"]), _p_text(test)
    else:
        significant, evidence = _aggregate_evidence(decision, {"intervals": mine_block}, {"intervals": theirs_block},
                                                    why)
    _msis_verdict(decision, number, mine, theirs, significant, evidence,
                  where="across series" if several else "on the same holdout",
                  min_improvement=min_improvement, require_beats_champion=require_beats_champion)


def _msis_scores(layout: RunLayout, report: dict, validation: dict, version, tracking_uri: str | None):
    """((challenger's, champion's) 95% interval scores, where from), or (None, why not): several
    series, the per-series ``fp32.msis_95`` joined by series id; one series, per holdout origin."""
    family = report["selected"]["edge"]["family"]
    if is_fleet_report(report):
        return _paired_tables(layout, family, version, tracking_uri, column=f"fp32.{MSIS_KEY}")
    return _per_origin_msis(layout, report, _family_entry(report, family), validation)


def _per_origin_msis(layout: RunLayout, report: dict, challenger: dict, champion: dict):
    """((challenger's, champion's) 95% interval score per holdout origin, where from), or
    (None, why not): the variant entries' ``per_origin_msis_95`` when both have them, else both
    fp32 ONNX models' quantiles at this run's holdout origins (the origins validation used)."""
    key = f"per_origin_{MSIS_KEY}"
    recorded = [next((v.get(key) for v in e.get("variants", []) if v.get("name") == "fp32"), None)
                for e in (challenger, champion)]
    if all(recorded) and len(recorded[0]) == len(recorded[1]):
        return (recorded[0], recorded[1]), "the validation's per-origin scores"
    paths = [layout.onnx(challenger["family"]), layout.onnx(CHAMPION_FAMILY)]
    absent = [str(p) for p in (*paths, layout.config) if not p.exists()]
    if absent:
        return None, f"no per-origin interval scores: {', '.join(absent)} not in the run directory"
    from onnxcast.pipeline.fleet_data import load_split
    from onnxcast.pipeline.validate import holdout_windows

    cfg = PipelineConfig.load(layout.config)
    scale = (report.get("baselines") or {}).get("mase_scale")
    try:  # data/fleet/, or an older run's data/series.npz
        saved = load_split(layout.fleet, cfg)
    except DataError as exc:
        return None, f"no per-origin interval scores: {exc}"
    holdout = holdout_windows(cfg, *saved, mase_scale=scale)
    scores = []
    for path in paths:
        found, why = per_origin_msis(path, holdout.history, holdout.actual, holdout.mase_scale)
        if found is None:
            return None, f"no per-origin interval scores: {why}"
        scores.append(found)
    return tuple(scores), "both fp32 models' quantiles at this run's holdout origins"


def _missing_msis(mine, theirs, number, where: str) -> str | None:
    """Why the two cannot be compared on MSIS, or None."""
    if not isinstance(theirs, int | float) or theirs != theirs:
        return (f"champion v{number} has no fp32 95% interval figures ({where} msis_95): a model evaluated "
                "before forecast distributions")
    if not isinstance(mine, int | float) or mine != mine:
        return f"the challenger has no fp32 95% interval figures ({where} msis_95)"
    return None


def _not_comparable_on_msis(decision: dict, number, why: str, require_beats_champion: bool) -> None:
    decision.update(comparison="not comparable on msis", msis_missing=why)
    if require_beats_champion:
        decision.update(promote=False, reason=f"not comparable on msis: {why}; the champion stays (decide on "
                                              "champion_metric mase, or promote explicitly with onnxcast_promote)")
    else:
        decision.update(promote=True, reason=f"not comparable on msis ({why}); the challenger is promoted as "
                                             "asked (require_beats_champion is off)")


def _aggregate_evidence(decision: dict, challenger: dict, champion: dict, why: str) -> tuple[bool, str]:
    """Without per-origin or per-series scores: significant when both 95% intervals of the MSIS
    (``msis_95_ci95``) are given and do not overlap; without them nothing shows the difference
    is more than noise, so it is not significant (as a MAE without per-origin errors)."""
    def interval(entry: dict):
        block = entry.get("intervals") or variant_intervals(entry)
        return block.get("msis_95_ci95")

    mine, theirs = interval(challenger), interval(champion)
    if mine and theirs:
        significant = mine[1] < theirs[0]
        decision.update(comparison=f"aggregate only ({why}): a difference counts when the 95% intervals do "
                                   "not overlap")
        return significant, "aggregate only, the 95% intervals " + ("do not overlap" if significant else "overlap")
    decision.update(comparison=f"aggregate only ({why}): no test of significance possible")
    return False, "aggregate only, nothing to test the difference on"


def _msis_verdict(decision: dict, number, mine: float, theirs: float, significant: bool, evidence: str, *,
                  where: str, min_improvement: float, require_beats_champion: bool) -> None:
    improvement = 1.0 - mine / theirs if theirs else 0.0
    decision["improvement"] = improvement
    _verdict(decision, mine < theirs and improvement > min_improvement, significant,
             f"challenger fp32 MSIS (95% interval) {mine:.4g}", f"champion v{number} {theirs:.4g} ({improvement:+.2%})",
             where, evidence, min_improvement=min_improvement, require_beats_champion=require_beats_champion)


def _verdict(decision: dict, better: bool, significant: bool, head: str, them: str, where: str, evidence: str, *,
             min_improvement: float, require_beats_champion: bool) -> None:
    """promote and reason from what was measured: better and significant promotes; better but
    not significant keeps the champion (unless require_beats_champion is off, which promotes)."""
    if better and significant:
        decision.update(promote=True, reason=f"{head} beats {them} {where} ({evidence})")
    elif better and require_beats_champion:
        decision.update(promote=False, reason=f"{head} is lower than {them} but not significantly ({evidence}): "
                                              "the champion stays")
    elif not require_beats_champion:
        decision.update(promote=True, reason=f"{head} does not beat {them}, promoted as asked "
                                             "(require_beats_champion is off)")
    else:
        decision.update(promote=False, reason=f"{head} does not beat {them} by more than {min_improvement:.2%}")
