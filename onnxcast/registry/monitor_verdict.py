"""The production monitor's verdict over a model's channels, and the retraining it asks for.

:func:`judge_channels` judges each channel that serves a version (the judging itself:
onnxcast.registry.monitoring.monitor_channel) and keeps going past a channel that cannot be
judged; :func:`retraining_request` is the retraining event's extra when a channel degraded or
drifted. The monitor DAG's operators (onnxcast.airflow.monitor) call these and map
:class:`NothingJudged` and :class:`NoRetraining` to a failed and a skipped task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from onnxcast.base.errors import OnnxcastError

log = logging.getLogger(__name__)


class ChannelFailed(OnnxcastError):
    """One channel could not be judged (its message names the model, channel and cause)."""


class NothingJudged(OnnxcastError):
    """No channel serves a version, or every served channel failed (the causes named)."""


class NoRetraining(OnnxcastError):
    """No channel degraded or drifted: nothing to retrain (the message says each channel's verdict)."""


def judge_channels(channels: Sequence[str], served: Callable[[str], bool], judge: Callable[[str], dict], *,
                   model: str, log: logging.Logger | Any = log) -> list[dict]:
    """Each channel's summary: ``judge(channel)`` where ``served(channel)``, else a skipped
    entry (``skipped: "serves nothing"``); a channel whose judging raised an OnnxcastError
    (ChannelFailed, or a store that could not be read) gets ``error``. NothingJudged when no
    channel is served, or when every served channel failed (the errors named); otherwise the
    failures are logged and kept beside the others' results."""
    summaries, failed = [], []
    for channel in channels:
        base = {"model": model, "channel": channel, "reasons": []}
        try:
            if not served(channel):
                log.warning("%s channel %s serves nothing (no pointer in the rollout store): skipped", model, channel)
                summaries.append({**base, "skipped": "serves nothing"})
                continue
            summaries.append(judge(channel))
        except OnnxcastError as exc:
            message = " ".join(str(exc).split())
            if not isinstance(exc, ChannelFailed):
                message = f"{model} channel {channel}: {message}"
            log.error("%s", message)
            failed.append(message)
            summaries.append({**base, "error": message})
    if all(s.get("skipped") for s in summaries):
        raise NothingJudged(f"{model}: no channel of {', '.join(channels)} serves a version (nothing promoted)")
    if failed and all(s.get("skipped") or s.get("error") for s in summaries):
        raise NothingJudged("; ".join(failed))
    return summaries


def retraining_request(results: Any) -> dict:
    """The retraining event's extra for the channel summaries ``results``: the first flagged
    channel's ``model``, ``channel``, ``version`` and ``conf`` (its training settings), every
    flagged channel and every reason. NoRetraining when no channel has a reason."""
    results = [r for r in (results or []) if isinstance(r, dict)]
    flagged = [r for r in results if r.get("reasons")]
    if not flagged:
        raise NoRetraining("no channel degraded or drifted: " + "; ".join(summary_line(r) for r in results))
    first = flagged[0]
    return {"model": first["model"], "channel": first["channel"], "version": first["version"],
            "channels": [r["channel"] for r in flagged],
            "reasons": [line for r in flagged for line in r["reasons"]], "conf": first["conf"]}


def summary_line(summary: dict) -> str:
    """One channel's verdict in a few words: ``edge v3 p=0.4``, ``cloud serves nothing``."""
    if summary.get("skipped") or summary.get("error"):
        return f"{summary['channel']} {summary.get('skipped') or 'not judged: ' + summary['error']}"
    return f"{summary['channel']} v{summary['version']} p={number(summary['p_value'])}"


def number(value: float | None) -> str:
    """A figure for a log line: four significant digits, ``n/a`` for none."""
    return "n/a" if value is None else f"{value:.4g}"
