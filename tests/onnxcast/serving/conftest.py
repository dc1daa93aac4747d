"""Fixtures for ``onnxcast serve`` tests: servers started through the console entry point."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from serve_support import Server, kill, launch


@pytest.fixture
def start_server(tmp_path):
    """Factory: start ``onnxcast serve`` on a free port; every server is stopped at teardown."""
    started: list[Server] = []

    def start(store: str, *extra: str, channel: str = "cloud", wait_live: bool = True, env: dict | None = None,
              token: str | None = None) -> Server:
        started.append(launch(store, tmp_path, *extra, channel=channel, wait_live=wait_live, env=env, token=token))
        return started[-1]

    yield start
    for server in started:
        kill(server)


@pytest.fixture
def window():
    """Three histories of 16 steps of (y, x1), as the tiny model takes them."""
    rng = np.random.default_rng(1)
    return np.stack([np.stack([100 + 10 * np.sin(np.arange(16) / 3 + k) + rng.normal(size=16),
                               5 + rng.normal(size=16)], axis=1) for k in range(3)]).astype(np.float32)


@pytest.fixture
def make_shifted_run(make_run):
    """Factory: a run whose models forecast ``shift`` more than ``make_run``'s (an Add after the
    graph's output), so two versions give different numbers; report digests updated."""
    import hashlib

    import onnx

    def make(tag: str, shift: float = 1.0) -> Path:
        report_path = make_run(tag)
        report = json.loads(report_path.read_text())
        for variant in report["models"][0]["variants"]:
            path = report_path.parent / variant["onnx_path"]
            proto = onnx.load(path)
            for node in proto.graph.node:
                node.output[:] = ["forecast_unshifted" if o == "forecast" else o for o in node.output]
            proto.graph.initializer.append(onnx.numpy_helper.from_array(np.float32(shift), "forecast_shift"))
            proto.graph.node.append(onnx.helper.make_node("Add", ["forecast_unshifted", "forecast_shift"], ["forecast"]))
            onnx.save(proto, path)
            data = path.read_bytes()
            variant["sha256"], variant["size_bytes"] = hashlib.sha256(data).hexdigest(), len(data)
        report_path.write_text(json.dumps(report, indent=2))
        return report_path

    return make
