"""scripts/demo.py (what `make demo` runs) as a person would run it with output piped: a short
live record of task states and the summary on the terminal, everything else in a log file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    home = tmp_path_factory.mktemp("onnxcast-home")
    # the demo configures Airflow itself: nothing of this test session's Airflow may leak in
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "ONNXCAST", "MLFLOW_TRACKING"))}
    env["ONNXCAST_HOME"] = str(home)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--quick", "--families", "nhits",
                           "--epochs", "6"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return done, home


def test_demo_succeeds_with_a_compact_output(demo):
    done, _ = demo
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) < 60, done.stdout
    assert done.stderr == ""
    assert not [line for line in lines if re.match(r"^\d{4}-\d\d-\d\dT", line)], "structured log lines on the terminal"
    assert "Validation (" in done.stdout and "selected for edge:" in done.stdout


def test_every_task_reaches_success_in_the_state_lines(demo):
    done, _ = demo
    finished = dict(re.findall(r"^\d\d:\d\d  (\S+)\s+(success|failed|skipped|upstream_failed)\b", done.stdout, re.M))
    expected = {"check_data", "train_or_fetch[nhits]", "export[nhits]", "optimize[nhits]", "validate[nhits]",
                "register", "champion_challenger", "promote"}
    assert expected <= set(finished), done.stdout
    assert set(finished.values()) == {"success"}, finished
    assert f"({len(finished)} tasks: {len(finished)} success)" in done.stdout


def test_the_log_file_is_named_and_holds_the_task_logs(demo):
    done, home = demo
    named = set(re.findall(r"^Airflow and task logs: (\S+)$", done.stdout, re.M))
    assert len(named) == 1, done.stdout  # the same path at the start and at the end
    log_file = Path(named.pop())
    assert log_file.parent == home / "logs" and log_file.is_file()
    text = log_file.read_text()
    assert "nhits epoch 1/6 train_loss=" in text  # the training task's own log line
    assert "Task instance state updated" in text  # Airflow's
    assert "\x1b[" not in text  # no progress bar or live view in the file
