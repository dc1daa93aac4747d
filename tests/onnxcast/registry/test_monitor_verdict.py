"""The production monitor's verdict over channels (onnxcast.registry.monitor_verdict), no Airflow:
a channel that serves nothing (a version promoted to the edge channel only) is reported as
skipped and the others are judged; the verdict fails only when nothing is served or every
served channel failed; a retraining is asked for only when a channel degraded or drifted."""

from __future__ import annotations

import logging

import pytest

from onnxcast.base.errors import StoreError
from onnxcast.registry.monitor_verdict import (
    ChannelFailed,
    NoRetraining,
    NothingJudged,
    judge_channels,
    retraining_request,
    summary_line,
)

log = logging.getLogger("test")


def judged(channel: str, reasons: tuple[str, ...] = ()) -> dict:
    return {"model": "m", "channel": channel, "version": "3", "p_value": 0.4, "reasons": list(reasons),
            "conf": {"horizon": 24}}


def failing(channel: str) -> dict:
    raise ChannelFailed(f"m channel {channel}: no report for version 3")


class TestJudgeChannels:
    def test_an_unserved_channel_is_skipped_and_the_other_judged(self):
        out = judge_channels(["edge", "cloud"], lambda c: c == "edge", judged, model="m", log=log)
        assert out[0] == judged("edge")
        assert out[1] == {"model": "m", "channel": "cloud", "reasons": [], "skipped": "serves nothing"}
        assert summary_line(out[1]) == "cloud serves nothing"

    def test_one_failed_channel_does_not_lose_the_others_result(self):
        out = judge_channels(["edge", "cloud"], lambda c: True, lambda c: failing(c) if c == "cloud" else judged(c),
                             model="m")
        assert out[0] == judged("edge") and out[1]["error"] == "m channel cloud: no report for version 3"
        assert summary_line(out[1]) == "cloud not judged: m channel cloud: no report for version 3"

    def test_nothing_served_fails(self):
        with pytest.raises(NothingJudged, match="no channel of edge, cloud serves a version"):
            judge_channels(["edge", "cloud"], lambda c: False, judged, model="m", log=log)

    def test_every_served_channel_failed_fails_naming_the_causes(self):
        def unreadable(channel):
            raise StoreError("s3://b/m/channels/edge.json: access denied")

        with pytest.raises(NothingJudged, match="m channel edge: s3://b/m/channels/edge.json: access denied; "
                                                "m channel cloud: no report"):
            judge_channels(["edge", "cloud"], lambda c: c == "cloud" or unreadable(c), failing, model="m", log=log)

    def test_an_error_that_is_not_onnxcasts_is_not_swallowed(self):
        def broken(channel):
            raise KeyError("p_value")

        with pytest.raises(KeyError):
            judge_channels(["edge"], lambda c: True, broken, model="m", log=log)


class TestRetrainingRequest:
    def test_no_flagged_channel_asks_for_nothing_and_says_each_verdict(self):
        results = [judged("edge"), {"model": "m", "channel": "cloud", "reasons": [], "skipped": "serves nothing"}]
        with pytest.raises(NoRetraining, match="no channel degraded or drifted: edge v3 p=0.4; cloud serves nothing"):
            retraining_request(results)

    def test_the_first_flagged_channel_names_the_event_and_every_reason_is_kept(self):
        results = [judged("edge"), judged("cloud", ("degraded: p=0.001",)), "not a summary",
                   {**judged("gpu", ("drift: load",)), "version": "4"}]
        assert retraining_request(results) == {
            "model": "m", "channel": "cloud", "version": "3", "channels": ["cloud", "gpu"],
            "reasons": ["degraded: p=0.001", "drift: load"], "conf": {"horizon": 24}}

    def test_nothing_given_asks_for_nothing(self):
        with pytest.raises(NoRetraining):
            retraining_request(None)
