"""A real ``onnxcast serve`` process on loopback for tests (``import serve_support``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running ``python -m onnxcast serve``; ``stop()`` sends SIGTERM and returns the exit code.
    With a ``token`` every request sends ``Authorization: Bearer <token>``."""

    def __init__(self, process: subprocess.Popen, url: str, log: Path, token: str | None = None):
        self.process, self.url, self.log, self.token = process, url, log, token

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def get(self, path: str, headers: dict | None = None) -> tuple[int, dict, dict]:
        return request(self.url + path, headers={**self.auth, **(headers or {})})

    def infer(self, history: np.ndarray | None = None, *, body: dict | bytes | None = None, model: str = "m",
              headers: dict | None = None) -> tuple[int, dict, dict]:
        if body is None:
            body = infer_body(history)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return request(f"{self.url}/v2/models/{model}/infer", data, {**self.auth, **(headers or {})})

    def wait_ready(self, version: str | None = None, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, body, _ = self.get("/v2/models/m")
            if status == 200 and (version is None or body["versions"] == [version]):
                return body
            assert self.process.poll() is None, self.log.read_text()
            time.sleep(0.1)
        raise AssertionError(f"server not ready at version {version} in {timeout} s: {self.log.read_text()}")

    def metrics(self) -> str:
        with urllib.request.urlopen(urllib.request.Request(self.url + "/metrics", headers=self.auth),
                                    timeout=10) as response:
            return response.read().decode()

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def infer_body(history: np.ndarray, **extra) -> dict:
    return {"inputs": [{"name": "history", "datatype": "FP32", "shape": list(history.shape),
                        "data": history.ravel().tolist()}], **extra}


def request(url: str, data: bytes | None = None, headers: dict | None = None) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null"), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), dict(exc.headers)


def launch(store: str, folder: Path, *extra: str, channel: str = "cloud", wait_live: bool = True,
           env: dict | None = None, token: str | None = None) -> Server:
    """Start ``python -m onnxcast serve`` on a free port, its log and device folder in ``folder``.
    ``env``: extra environment; ``token``: the bearer token the server was given (sent by the client)."""
    port = free_port()
    log = folder / f"serve-{port}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           **(env or {})}
    command = [sys.executable, "-m", "onnxcast", "serve", "--store", store, "--model", "m", "--channel", channel,
               "--port", str(port), "--dest", str(folder / f"serve-{port}"), "--poll-interval", "0.2", *extra]
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    server = Server(process, f"http://127.0.0.1:{port}", log, token)
    if wait_live:
        deadline = time.monotonic() + 60
        while True:
            try:
                if server.get("/v2/health/live")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise AssertionError(log.read_text())
            time.sleep(0.1)
    return server


def kill(server: Server) -> None:
    if server.process.poll() is None:
        server.process.kill()
        server.process.wait(10)


def forecast_of(report: Path, history: np.ndarray, variant: str = "fp32") -> np.ndarray:
    """What ONNX Runtime gives for ``history`` with the run's ``variant`` file (the cloud choice)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(report.parent / f"models/lstm/onnx/{variant}.onnx"),
                                   providers=["CPUExecutionProvider"])
    return session.run(["forecast"], {"history": history})[0]


def burst(url: str, bodies: list[bytes]) -> list[tuple[int, dict]]:
    """Send every body on its own keep-alive connection at (nearly) the same instant: all
    connections are opened first, then the requests are written back to back, so the server
    sees them together. Returns (status, JSON answer) in order."""
    import asyncio
    from urllib.parse import urlsplit

    parts = urlsplit(url)

    async def run():
        streams = [await asyncio.open_connection(parts.hostname, parts.port) for _ in bodies]
        for (_, writer), body in zip(streams, bodies, strict=True):
            writer.write(f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        answers = []
        for reader, writer in streams:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            length = next(int(line.split(":")[1]) for line in head.split("\r\n") if line.lower().startswith("content-length"))
            answers.append((int(head[9:12]), json.loads(await reader.readexactly(length))))
            writer.close()
        return answers

    return asyncio.run(run())
