"""MLflow side of the production monitor (onnxcast.pipeline.monitor): the deployed version's
report from the registry, one monitor run per check, and the model version tag
``onnxcast.monitor.<channel>`` the rollout page reads (docs/design/loop.md section 2).

A monitor run lives in the model's experiment, tagged ``onnxcast.role=monitor`` with the model,
the registered version and the channel; its metrics carry the check's time, and the realised
MASE of every origin is the metric ``origin_mase`` at the origin's own timestamp, so the MLflow
UI draws the error over time. Artifacts: ``monitor.json`` (the whole result) and
``plots/monitor.png``. mlflow is imported inside functions.
"""

from __future__ import annotations

import calendar
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from onnxcast.base import environment
from onnxcast.base.errors import DataError, DataQualityError
from onnxcast.base.files import onnxcast_home, sha256_bytes
from onnxcast.base.untrusted import (
    MAX_REPORT_BYTES,
    UntrustedInputError,
    loads_json,
    quote,
    read_regular_file,
)
from onnxcast.pipeline.config import EXAMPLE_DATA, PipelineConfig
from onnxcast.registry.tracking import (
    REPORT_SHA_TAG,
    ROLE_TAG,
    TrackingError,
    client_for,
    ensure_experiment,
    redact_uri,
    run_url,
)

log = logging.getLogger(__name__)

MONITOR_ROLE = "monitor"
REPORT_FILE = "extra_files/report.json"  # where mlflow.onnx.log_model(extra_files=...) puts it
MONITOR_TAG_PREFIX = "onnxcast.monitor."
MODEL_TAG, VERSION_TAG, CHANNEL_TAG = "onnxcast.model", "onnxcast.version", "onnxcast.channel"
# Folders a report's own local data_uri may be in (os.pathsep-separated), besides ONNXCAST_HOME:
# a path read from a report is data like any other, never trusted because of where it was read.
DATA_ROOTS_ENV = "ONNXCAST_DATA_ROOTS"
# the fields of the version tag, in the order of docs/design/loop.md
TAG_FIELDS = ("at", "mase", "holdout_mase", "holdout_ci", "p_value", "degraded", "drift", "origins", "run_id",
              "from", "to")


def monitor_tag(channel: str) -> str:
    return f"{MONITOR_TAG_PREFIX}{channel}"


def deployed_report(model_name: str, version: str, dest: str | Path, tracking_uri: str | None = None) -> dict:
    """The report.json registered with ``version`` (the run that trained it), checked against
    the version's ``onnxcast.report_sha256`` tag before it is parsed, and parsed bounded (size
    and depth). TrackingError when the registry has no such version or report; DataError when
    the version has no tag (a report nobody can vouch for is refused), the digest differs, or
    the report is not bounded JSON of a pipeline report."""
    import mlflow
    from mlflow.exceptions import MlflowException

    client = client_for(tracking_uri)
    uri = f"models:/{model_name}/{version}"
    try:
        entry = client.get_model_version(model_name, str(version))
    except MlflowException as exc:
        raise TrackingError(f"{uri}: {exc.message.splitlines()[0]}") from None
    try:  # the report alone (register_model logs it as an extra file of the model)
        found = [Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{uri}/{REPORT_FILE}",
                                                          dst_path=str(dest)))]
    except MlflowException:  # laid out otherwise: every file of the version, then look
        try:
            folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dest)))
        except MlflowException as exc:
            raise TrackingError(f"{uri}: {exc.message.splitlines()[0]}") from None
        found = sorted(folder.rglob("report.json"))
    if not found:
        raise TrackingError(f"{uri}: no report.json among the version's files")
    expected = entry.tags.get(REPORT_SHA_TAG)
    if not expected:  # its data_uri, config and figures would all be taken on trust
        raise DataError(f"{uri}: the version has no {REPORT_SHA_TAG} tag: refusing its report.json, which nothing "
                        "verifies (versions registered by onnxcast carry it)")
    try:  # the bytes that are checked are the bytes that are parsed
        data = read_regular_file(found[0], what=f"{uri} report.json", limit=MAX_REPORT_BYTES, follow_symlinks=False)
    except UntrustedInputError as exc:
        raise DataError(str(exc)) from None
    if sha256_bytes(data) != expected:
        raise DataError(f"{uri}: report.json does not match its {REPORT_SHA_TAG} tag; refusing it")
    try:
        report = loads_json(data, what=f"{uri} report.json", limit=MAX_REPORT_BYTES)
    except UntrustedInputError as exc:
        raise DataError(str(exc)) from None
    if not isinstance(report, dict) or not isinstance(report.get("models"), list) \
            or not isinstance(report.get("config"), dict):
        raise DataError(f"{uri}: report.json is not a pipeline report (no 'models' list and 'config' object)")
    return report


def data_roots() -> list[Path]:
    """The folders a report's own local ``data_uri`` may be in: ONNXCAST_HOME, and those of
    ``$ONNXCAST_DATA_ROOTS`` (os.pathsep-separated), resolved."""
    named = environment.value(DATA_ROOTS_ENV) or []
    return [Path(os.path.realpath(root)) for root in [onnxcast_home(), *named]]


def report_data_uri(report: dict, uri: str) -> str:
    """The data the report's run trained on, as the monitor may read it: the example data, an
    ``s3://`` URI, or an absolute local path that resolves (symlinks followed) inside one of
    :func:`data_roots`, returned resolved. Anything else is refused (DataError): a report is
    not trusted to name a file because it was read from the registry (its ``data_uri`` was once
    changed to /etc/shadow, and the file was opened)."""
    data = report["config"].get("data_uri")
    if not isinstance(data, str) or not data.strip():
        raise DataError(f"{uri}: report.json names no config.data_uri; give the data to judge on (--data)")
    if data == EXAMPLE_DATA or data.startswith("s3://"):
        return data
    if "://" in data.removeprefix("file://"):
        raise DataError(f"{uri}: report.json's data_uri {quote(data)} is neither a local path nor s3://; "
                        "give the data to judge on (--data)")
    path = Path(data.removeprefix("file://"))
    if not path.is_absolute():
        raise DataError(f"{uri}: report.json's data_uri {quote(data)} is a relative path (relative to the "
                        "training's own folder); give the data to judge on (--data)")
    real = Path(os.path.realpath(path))
    roots = data_roots()
    if not any(real == root or real.is_relative_to(root) for root in roots):
        raise DataError(f"{uri}: report.json's data_uri {quote(data, 200)} is outside the folders a report's data may "
                        f"be in ({', '.join(quote(str(r), 200) for r in roots)}); give the data to judge on (--data), "
                        f"or add its folder to ${DATA_ROOTS_ENV}")
    return str(real)


def log_monitor_run(result: dict, *, model_name: str, version: str, channel: str, work_dir: str | Path,
                    run_key: str | None = None, tracking_uri: str | None = None, ui_url: str | None = None) -> dict:
    """One MLflow run for one check; ``{"run_id", "experiment_id", "url"}``."""
    client = client_for(tracking_uri)
    experiment_id = ensure_experiment(client, model_name)
    tags = {ROLE_TAG: MONITOR_ROLE, MODEL_TAG: model_name, VERSION_TAG: str(version), CHANNEL_TAG: channel,
            "onnxcast.degraded": str(bool(result.get("degraded"))), "onnxcast.drift": ",".join(result.get("drift") or []),
            "mlflow.runName": f"monitor {channel} v{version}"}
    if run_key:
        tags["onnxcast.run_key"] = run_key
    run = client.create_run(experiment_id, tags=tags)
    run_id = run.info.run_id
    try:
        _log_figures(client, run_id, result)
        work = Path(work_dir)
        work.mkdir(parents=True, exist_ok=True)
        summary = work / "monitor.json"
        summary.write_text(json.dumps({**result, "model": model_name, "version": str(version)}, indent=2,
                                      sort_keys=True, default=str))
        client.log_artifact(run_id, str(summary))
        if result.get("per_origin_mase"):
            client.log_artifact(run_id, str(plot_monitor(result, work / "monitor.png")), "plots")
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return {"run_id": run_id, "experiment_id": experiment_id,
            "url": run_url(client.tracking_uri, experiment_id, run_id, ui_url)}


def set_monitor_tag(model_name: str, version: str, channel: str, result: dict, run_id: str,
                    tracking_uri: str | None = None) -> dict:
    """Write ``onnxcast.monitor.<channel>`` on the version: the JSON the rollout page reads."""
    value = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mase": result.get("mase"),
             "holdout_mase": result.get("holdout_mase"), "holdout_ci": result.get("holdout_ci"),
             "p_value": result.get("p_value"), "degraded": bool(result.get("degraded")),
             "drift": list(result.get("drift") or []), "origins": result.get("origins"), "run_id": run_id,
             "from": result.get("from"), "to": result.get("to")}
    client_for(tracking_uri).set_model_version_tag(model_name, str(version), monitor_tag(channel),
                                                   json.dumps(value, sort_keys=True))
    return value


def plot_monitor(result: dict, path: str | Path) -> Path:
    """Realised MASE per origin over time, with the holdout's MASE and its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    times = np.array([np.datetime64(t.rstrip("Z")) for t in result["origin_times"]])
    figure, axis = plt.subplots(figsize=(12, 4))
    per_origin = [np.nan if v is None else v for v in result["per_origin_mase"]]
    axis.plot(times, per_origin, color="tab:blue", linewidth=1, label="realised MASE per origin")
    low, high = result["holdout_ci"]
    axis.axhspan(low, high, color="tab:green", alpha=0.2, label="holdout MASE 95% interval")
    axis.axhline(result["holdout_mase"], color="tab:green", linewidth=1, label="holdout MASE")
    if result["mase"] is not None:
        axis.axhline(result["mase"], color="tab:blue", linestyle="--", linewidth=1, label="realised MASE (mean)")
    verdict = "DEGRADED" if result.get("degraded") else "not degraded"
    axis.set_title(f"{result['channel']}: {result['family']} {result['variant']}, {verdict} "
                   f"(p={result.get('p_value') if result.get('p_value') is None else round(result['p_value'], 4)}); "
                   f"drift: {', '.join(result.get('drift') or []) or 'none'}")
    axis.legend(loc="upper left")
    figure.autofmt_xdate()
    path = Path(path)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def _log_figures(client, run_id: str, result: dict) -> None:
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    figures: dict[str, Any] = {"realised_mase": result.get("mase"), "holdout_mase": result.get("holdout_mase"),
                               "holdout_mase_ci_low": result["holdout_ci"][0], "holdout_mase_ci_high": result["holdout_ci"][1],
                               "baseline_mase": result.get("baseline_mase"), "p_value": result.get("p_value"),
                               "degraded": float(bool(result.get("degraded"))),
                               "drifted_columns": float(len(result.get("drift") or [])),
                               "origins": result.get("origins"), "new_rows": result.get("new_rows"),
                               "monitor_seconds": result.get("seconds")}
    metrics = [Metric(k, float(v), now, 0) for k, v in figures.items() if v is not None]
    for step, (value, at) in enumerate(zip(result.get("per_origin_mase") or [], result.get("origin_times") or [],
                                           strict=True)):
        if value is None:  # a non-finite forecast at that origin (the result says None, not NaN)
            continue
        stamp = calendar.timegm(time.strptime(at, "%Y-%m-%dT%H:%M:%SZ")) * 1000
        metrics.append(Metric("origin_mase", float(value), stamp, step))
    params = [Param(k, str(result.get(k))) for k in ("channel", "family", "variant", "trained_until", "from", "to",
                                                     "baseline")]
    params.append(Param("data_uri", redact_uri(str(result.get("data_uri")))))
    for start in range(0, len(metrics), 1000):  # MLflow's batch limit
        client.log_batch(run_id, metrics=metrics[start:start + 1000], params=params if start == 0 else [])


RETRAIN_REASON_TAG = "onnxcast.retrain_reason"


def record_retrain_reason(run_id: str, trigger: dict, tracking_uri: str | None = None) -> None:
    """Tag a training run the monitor's event started with why (``onnxcast.retrain_reason``)
    and which deployed version it replaces (``onnxcast.retrain_of``)."""
    client = client_for(tracking_uri)
    reason = "; ".join(trigger.get("reasons") or []) or "retraining asked for by the monitor"
    client.set_tag(run_id, RETRAIN_REASON_TAG, reason[:5000])
    client.set_tag(run_id, "onnxcast.retrain_of",
                   f"{trigger.get('model')} v{trigger.get('version')} ({trigger.get('channel')})")


def monitor_channel(model_name: str, channel: str, store_uri: str, *, trust: str | Path | None = None,
                    data_uri: str | None = None, tracking_uri: str | None = None, ui_url: str | None = None,
                    run_key: str | None = None, s3_settings_for=None, log_to_mlflow: bool = True) -> dict:
    """One check of one channel, as the monitor DAG and ``onnxcast monitor`` run it: pull the
    channel's version from the store with the device client (verified against ``trust``) into
    scratch, take its report from the registry, judge it on the data after its
    ``trained_until`` (onnxcast.pipeline.monitor), and record the result (a monitor run and
    the version tag) unless not ``log_to_mlflow``. Returns a small summary (XCom-sized) with
    ``result`` (the whole monitor result) and ``conf`` (the version's training settings).
    ``s3_settings_for``: ``uri -> S3Settings | None`` (None: boto3's chain)."""
    import tempfile

    from onnxcast.pipeline.monitor import MonitorInput, monitor, reasons
    from onnxcast.rollout.edge import installed, pull

    settings_for = s3_settings_for or (lambda uri: None)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="onnxcast-monitor-") as scratch:
        work = Path(scratch)
        pulled = pull(store_uri, model_name, channel, work / "device", trust=trust,
                      s3_settings=settings_for(store_uri) if store_uri.startswith("s3://") else None,
                      channel_artifact=True)
        model_path, _info = installed(work / "device")
        version = registered_version(model_path.parent / "manifest.json", pulled.version)
        report = deployed_report(model_name, version, work / "registry", tracking_uri)
        data = data_uri or report_data_uri(report, f"models:/{model_name}/{version}")
        try:
            result = monitor(MonitorInput(model_path, report, channel, data), work / "monitor",
                             s3_settings=settings_for(data) if str(data).startswith("s3://") else None)
        except DataQualityError as exc:  # the gate's report is in scratch, deleted on the way out: keep it
            raise DataQualityError(exc.source, exc.failures,
                                   keep_quality_report(exc.report_path, work, model_name, channel)) from None
        run = {"run_id": None, "url": None}
        if log_to_mlflow:
            run = log_monitor_run(result, model_name=model_name, version=version, channel=channel,
                                  work_dir=work / "mlflow", run_key=run_key, tracking_uri=tracking_uri, ui_url=ui_url)
            set_monitor_tag(model_name, version, channel, result, run["run_id"], tracking_uri)
    return {"model": model_name, "channel": channel, "version": str(version), "store_version": pulled.version,
            "mase": result["mase"], "holdout_mase": result["holdout_mase"], "holdout_ci": result["holdout_ci"],
            "baseline_mase": result["baseline_mase"], "p_value": result["p_value"], "degraded": result["degraded"],
            "drift": result["drift"], "origins": result["origins"], "new_rows": result["new_rows"],
            "from": result["from"], "to": result["to"], "reasons": reasons(result), "run_id": run["run_id"],
            "url": run["url"], "seconds": round(time.monotonic() - started, 2),
            # a retraining learns from the data the drift was seen in, not the version's old file
            "conf": {**retrain_conf(report), "data_uri": str(data)}}


def keep_quality_report(report_path: str | None, scratch: Path, model_name: str, channel: str) -> str | None:
    """Copy the folder of a failed data gate's report out of ``scratch`` (deleted when the check
    ends) to ``$ONNXCAST_HOME/monitor/<model>-<channel>/quality`` (replacing the last one kept) and
    return the report's path there; None (no path named at all) when it cannot be kept."""
    if not report_path:
        return None
    source = Path(report_path)
    if not source.is_relative_to(scratch):
        return report_path  # written outside scratch: it stays where it is
    kept = onnxcast_home() / "monitor" / f"{model_name}-{channel}"  # names checked by the pull
    target, fresh = kept / "quality", kept / f".quality.{os.getpid()}.tmp"
    try:
        kept.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(fresh, ignore_errors=True)
        shutil.copytree(source.parent, fresh, symlinks=True)
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            old = kept / f".quality.{os.getpid()}.old"
            os.replace(target, old)
            shutil.rmtree(old, ignore_errors=True)  # rmtree follows no symlink inside it (Linux, fd-based)
        os.replace(fresh, target)
    except OSError as exc:
        log.warning("the data gate's report could not be kept under %s (%s)", kept, exc.strerror or exc)
        shutil.rmtree(fresh, ignore_errors=True)
        return None
    log.info("the data gate's report is kept at %s", target / source.name)
    return str(target / source.name)


def registered_version(manifest: Path, store_version: str) -> str:
    """The MLflow model version the rollout manifest names (the device verified it), else the
    store's version id (the training DAG promotes under the registry's number)."""
    try:
        named = (json.loads(manifest.read_text()).get("mlflow") or {}).get("version")
    except (OSError, ValueError):
        named = None
    return str(named or store_version)


# what a retraining never takes over from the deployed version: its output folder and its end
NOT_CARRIED = ("out_dir", "trained_until")


def retrain_conf(report: dict) -> dict:
    """The training settings of the run that made the version, for a retraining on newer data."""
    known = set(PipelineConfig.__dataclass_fields__)
    return {k: v for k, v in (report.get("config") or {}).items() if k in known and k not in NOT_CARRIED}
