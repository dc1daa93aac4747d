"""The channel loop of MonitorChannelsOperator (onnxcast.airflow.monitor.judge_channels): a
channel that serves nothing (a version promoted to the edge channel only) is reported as
skipped and the others are judged; the task fails only when nothing is served or every
served channel failed."""

from __future__ import annotations

import logging

import pytest
from airflow.sdk.exceptions import AirflowFailException

from onnxcast.airflow.monitor import ChannelFailed, _line, judge_channels
from onnxcast.base.errors import StoreError

log = logging.getLogger("test")


def judged(channel: str) -> dict:
    return {"model": "m", "channel": channel, "version": "3", "p_value": 0.4, "reasons": []}


def failing(channel: str) -> dict:
    raise ChannelFailed(f"m channel {channel}: no report for version 3")


def test_an_unserved_channel_is_skipped_and_the_other_judged():
    out = judge_channels(["edge", "cloud"], lambda c: c == "edge", judged, model="m", log=log)
    assert out[0] == judged("edge")
    assert out[1] == {"model": "m", "channel": "cloud", "reasons": [], "skipped": "serves nothing"}
    assert _line(out[1]) == "cloud serves nothing"


def test_one_failed_channel_does_not_lose_the_others_result():
    out = judge_channels(["edge", "cloud"], lambda c: True, lambda c: failing(c) if c == "cloud" else judged(c),
                         model="m", log=log)
    assert out[0] == judged("edge") and out[1]["error"] == "m channel cloud: no report for version 3"


def test_nothing_served_fails():
    with pytest.raises(AirflowFailException, match="no channel of edge, cloud serves a version"):
        judge_channels(["edge", "cloud"], lambda c: False, judged, model="m", log=log)


def test_every_served_channel_failed_fails_naming_the_causes():
    def unreadable(channel):
        raise StoreError("s3://b/m/channels/edge.json: access denied")

    with pytest.raises(AirflowFailException, match="m channel edge: s3://b/m/channels/edge.json: access denied; "
                                                   "m channel cloud: no report"):
        judge_channels(["edge", "cloud"], lambda c: c == "cloud" or unreadable(c), failing, model="m", log=log)
