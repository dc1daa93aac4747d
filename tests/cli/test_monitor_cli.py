"""`onnxcast monitor` through ``onnxcast.cli.main`` against reports nobody should trust (issue 30,
item 13): a real signed rollout store (the session's tiny model, promoted as a release does) and
a real MLflow registry (SQLite) whose version holds a crafted ``report.json``.

Before: a report without its ``onnxcast.report_sha256`` tag was used unchecked (its ``data_uri``
changed to /etc/shadow and the file opened); a deep-JSON report with a matching tag ended in a
RecursionError traceback; a data-gate failure named a report in a temporary folder already
deleted when the message was read."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from onnxcast import cli
from onnxcast.rollout.promote import promote

CONFIG = {"horizon": 4, "lookback": 16, "target_column": "y", "feature_columns": ["x1"], "freq": "h",
          "time_column": "ds", "models": ["lstm"]}


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A SQLite MLflow registry with the registered model ``m`` (versions added per test)."""
    from mlflow import MlflowClient

    folder = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("m")
    return uri, client, folder


@pytest.fixture
def deploy(registry, make_run, tmp_path, monkeypatch):
    """Factory: register ``report`` (a dict, or raw bytes) as a new version of ``m`` (tagged with
    its digest unless ``tagged=False``), promote the tiny model to ``edge`` naming that version;
    returns the ``onnxcast monitor`` arguments."""
    uri, client, folder = registry
    monkeypatch.setenv("ONNXCAST_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ONNXCAST_DATA_ROOTS", raising=False)

    def make(report: dict | bytes, *, tagged: bool = True) -> list[str]:
        data = report if isinstance(report, bytes) else json.dumps(report).encode()
        number = len(client.search_model_versions("name = 'm'")) + 1
        files = folder / f"v{number}"
        (files / "extra_files").mkdir(parents=True)
        (files / "extra_files" / "report.json").write_bytes(data)
        tags = {"onnxcast.report_sha256": hashlib.sha256(data).hexdigest()} if tagged else {}
        version = client.create_model_version("m", source=str(files), tags=tags).version
        store = tmp_path / "store"
        promote(make_run("a", mlflow_version=str(version)), str(store), "m", "edge", version=str(version))
        return ["monitor", "--store", str(store), "--model", "m", "--channel", "edge", "--tracking-uri", uri,
                "--no-log"]

    return make


def report_with(make_run, data_uri: str) -> dict:
    """The make_run report with the config a pipeline run records (``data_uri`` as given)."""
    report = json.loads(make_run("a").read_text())
    return {**report, "config": {**CONFIG, "data_uri": data_uri}}


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in captured.err, captured.err[-2000:]
    return lines[0]


def test_a_report_without_its_digest_tag_is_refused(deploy, make_run, tmp_path, capsys):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$not-for-you:19000:0:99999:7:::\n")
    argv = deploy(report_with(make_run, str(secret)), tagged=False)
    assert cli.main(argv) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: models:/m/") and line.endswith(
        ": the version has no onnxcast.report_sha256 tag: refusing its report.json, which nothing verifies "
        "(versions registered by onnxcast carry it)"), line
    assert "root:" not in line


def test_a_deep_json_report_with_a_matching_tag_is_one_line(deploy, capsys):
    argv = deploy(b'{"models": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert cli.main(argv) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: models:/m/") and line.endswith(" report.json is nested deeper than 64 levels")


@pytest.mark.parametrize("where, reason", [
    ("/etc/shadow", "is outside the folders a report's data may be in"),
    ("link", "is outside the folders a report's data may be in"),  # a symlink in ONNXCAST_HOME to /etc/shadow
    ("data/meters.csv", "is a relative path"),
    ("http://evil.example/x.csv", "is neither a local path nor s3://"),
])
def test_a_verified_report_names_no_file_outside_the_data_folders(deploy, make_run, tmp_path, capsys, where, reason):
    home = tmp_path / "home"
    home.mkdir()
    if where == "link":
        (home / "link").symlink_to("/etc/shadow")
        where = str(home / "link")
    argv = deploy(report_with(make_run, where))
    assert cli.main(argv) == 2
    line = one_error_line(capsys)
    assert f"report.json's data_uri {where!r} {reason}" in line and "give the data to judge on (--data)" in line, line


def test_the_data_gates_report_outlives_the_check(deploy, make_run, tmp_path, capsys, monkeypatch):
    data = tmp_path / "data" / "meters.csv"
    data.parent.mkdir()
    rows = [f"2026-01-01T{h % 24:02d}:00:00Z" if h < 24 else f"2026-01-02T{h % 24:02d}:00:00Z" for h in range(40)]
    data.write_text("ds,y,x1\n" + "".join(f"{t},{'n/a' if i % 4 == 0 else i},1.0\n" for i, t in enumerate(rows)))
    argv = deploy(report_with(make_run, str(data)))
    assert cli.main(argv) == 2  # outside the data folders: refused before the gate
    assert "outside the folders" in one_error_line(capsys)
    monkeypatch.setenv("ONNXCAST_DATA_ROOTS", str(data.parent))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error: {data}: ") and "data check(s) failed (report: " in err[0], err
    named = Path(err[0].split("(report: ")[1].rstrip(")"))
    assert named.exists() and named.is_relative_to(tmp_path / "home" / "monitor" / "m-edge" / "quality"), named
    assert any("empty values at most" in line and "'y' empty in 25.00% of rows" in line for line in err[1:]), err
    # the user's own --data is taken as given (the gate runs on it) and its report is kept the same way
    assert cli.main([*argv, "--data", str(data)]) == 2
    assert "data check(s) failed (report: " in capsys.readouterr().err
