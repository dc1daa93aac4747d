"""Shared fixtures: real servers on loopback (moto S3 over HTTP), example data, tiny settings."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server over real HTTP on a free loopback port, for the whole session."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """Point boto3 (through the environment, as production does) at the moto server."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    from onnxcast.s3 import s3_client

    s3_client.cache_clear()
    yield s3_server
    s3_client.cache_clear()


@pytest.fixture
def s3_bucket(s3_env):
    """A fresh bucket on the moto server; returns its name."""
    import uuid

    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def example_csv() -> str:
    from onnxcast.data import example_data_path

    return example_data_path()


@pytest.fixture(autouse=True)
def _quiet_threads(monkeypatch):
    # Tests run models with one thread: predictable on 2-core CI and no oversubscription.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
