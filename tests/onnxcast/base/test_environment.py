"""Environment variables declared once (onnxcast.base.environment, issue 31): every name the
package, its documents and its tools use is declared; only the environment module touches
os.environ; docs/environment.md is the table generated from the declarations; values are read
at call time, and a bad one fails in one line naming the variable and the value."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from onnxcast.base import environment
from onnxcast.base.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "onnxcast"
ENVIRONMENT_MODULE = PACKAGE / "base" / "environment.py"
# where a name is used: the package, what users read, and what deploys or develops it
USED_IN = ["onnxcast", "docs", "README.md", "dags", "deploy", "docker", "scripts", "airflow.cfg", "Makefile"]
NAME = re.compile(r"(?<![A-Za-z0-9_])ONNXCAST_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_])")
DIRECT = re.compile(r"\bos\.environ\b|\bgetenv\b|\bputenv\b|from os import [^\n]*\benviron\b")


def names_used(root: Path, places: list[str]) -> dict[str, str]:
    """``ONNXCAST_*`` name -> the first file (relative to ``root``) that mentions it."""
    found: dict[str, str] = {}
    for place in places:
        path = root / place
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
        for file in files:
            if "__pycache__" in file.parts or file.suffix in (".pyc", ".png", ".gz", ".parquet", ".onnx"):
                continue
            try:
                text = file.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            for name in NAME.findall(text):
                found.setdefault(name, str(file.relative_to(root)))
    return found


def direct_environment_access(package: Path, allowed: Path) -> list[str]:
    """``file:line`` of every mention of os.environ / getenv in ``package`` outside ``allowed``."""
    hits = []
    for path in sorted(package.rglob("*.py")):
        if path == allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if DIRECT.search(line):
                hits.append(f"{path.relative_to(package.parent)}:{number}: {line.strip()}")
    return hits


def test_every_name_used_is_declared():
    used = names_used(REPO, USED_IN)
    undeclared = {name: where for name, where in used.items() if name not in environment.VARIABLES}
    assert not undeclared, f"declare these in onnxcast/base/environment.py: {undeclared}"
    assert {"ONNXCAST_TRUST", "ONNXCAST_HOME", "ONNXCAST_RETRY_DELAY_SECONDS"} <= set(used)


def test_every_declared_name_is_used_somewhere():
    used = names_used(REPO, [p for p in USED_IN if p != "onnxcast"] + ["onnxcast/airflow", "onnxcast/cli.py",
                                                                       "tests"])
    package = {p for p in PACKAGE.rglob("*.py") if p != ENVIRONMENT_MODULE}
    in_package = "\n".join(p.read_text() for p in package)
    stale = [name for name in environment.VARIABLES if name not in used and f'"{name}"' not in in_package]
    assert not stale, f"declared, but nothing reads or documents them: {stale}"


def test_a_new_name_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("set `ONNXCAST_NEW_THING=1` (not AIRFLOW__ONNXCAST__MODE)\n")
    assert names_used(tmp_path, ["docs"]) == {"ONNXCAST_NEW_THING": "docs/x.md"}


def test_only_the_environment_module_reads_or_writes_the_environment():
    assert direct_environment_access(PACKAGE, ENVIRONMENT_MODULE) == []


def test_a_direct_read_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "environment.py").write_text("import os\nos.environ.get('X')\n")
    (package / "a.py").write_text("import os\n\n\ndef home():\n    return os.environ.get('ONNXCAST_HOME')\n")
    (package / "b.py").write_text("from os import getenv\n")
    assert direct_environment_access(package, package / "environment.py") == [
        "pkg/a.py:5: return os.environ.get('ONNXCAST_HOME')", "pkg/b.py:1: from os import getenv"]


def test_the_documentation_table_is_generated_from_the_declarations():
    """Regenerate with: python -m onnxcast.base.environment --markdown > docs/environment.md"""
    done = subprocess.run([sys.executable, "-m", "onnxcast.base.environment", "--markdown"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout == environment.markdown()
    assert (REPO / "docs" / "environment.md").read_text() == done.stdout, (
        "docs/environment.md is stale: python -m onnxcast.base.environment --markdown > docs/environment.md")


def test_every_package_variable_says_what_it_is_for_and_who_reads_it():
    for variable in environment.VARIABLES.values():
        assert variable.help.strip() and variable.readers, variable.name
        assert variable.name in environment.markdown()
    secrets = [v for v in environment.VARIABLES.values() if v.secret]
    assert [v.name for v in secrets] == ["ONNXCAST_SERVE_TOKEN"]


def test_values_are_read_at_call_time_with_their_defaults(monkeypatch):
    monkeypatch.delenv("ONNXCAST_MAX_DATA_ROWS", raising=False)
    assert environment.value("ONNXCAST_MAX_DATA_ROWS") == 20_000_000
    monkeypatch.setenv("ONNXCAST_MAX_DATA_ROWS", " 1000 ")
    assert environment.value("ONNXCAST_MAX_DATA_ROWS") == 1000
    monkeypatch.setenv("ONNXCAST_MAX_DATA_ROWS", "  ")  # blank is unset
    assert environment.value("ONNXCAST_MAX_DATA_ROWS") == 20_000_000
    assert environment.get("ONNXCAST_MAX_DATA_ROWS") is None
    monkeypatch.setenv("ONNXCAST_DATA_ROOTS", os.pathsep.join(["/a", " ", "/b"]))
    assert environment.value("ONNXCAST_DATA_ROOTS") == ["/a", "/b"]


@pytest.mark.parametrize(("name", "text", "line"), [
    ("ONNXCAST_MAX_DATA_BYTES", "2GB", "ONNXCAST_MAX_DATA_BYTES: '2GB' is not a whole number of bytes"),
    ("ONNXCAST_MAX_DATA_CELLS", "0", "ONNXCAST_MAX_DATA_CELLS: '0' is not a positive number of cells"),
    ("ONNXCAST_REGISTRY_POLL_SECONDS", "soon",
     "ONNXCAST_REGISTRY_POLL_SECONDS: 'soon' is not a number of seconds from 1 to 3600"),
    ("ONNXCAST_RETRY_DELAY_SECONDS", "nan", "ONNXCAST_RETRY_DELAY_SECONDS: 'nan' is not a number of seconds from 1"),
    ("ONNXCAST_POINTER_EXPIRES_DAYS", "a month", "ONNXCAST_POINTER_EXPIRES_DAYS: 'a month' is not a number of days"),
    ("ONNXCAST_STORE_SSE", "kms", "ONNXCAST_STORE_SSE: 'kms' is not one of AES256, aws:kms"),
])
def test_a_bad_value_fails_in_one_line_naming_the_variable_and_the_value(monkeypatch, name, text, line):
    monkeypatch.setenv(name, text)
    with pytest.raises(ConfigError) as caught:
        environment.value(name)
    assert str(caught.value).startswith(line) and "\n" not in str(caught.value)


def test_a_secret_is_never_shown(monkeypatch, capsys):
    monkeypatch.setenv("ONNXCAST_SERVE_TOKEN", "s3cr3t-token")
    assert environment.get("ONNXCAST_SERVE_TOKEN") == "s3cr3t-token"
    assert "ONNXCAST_SERVE_TOKEN=(set)" in environment.describe()
    assert environment.main([]) == 0
    out = capsys.readouterr().out
    assert "ONNXCAST_SERVE_TOKEN=(set)" in out and "s3cr3t" not in out
    row = next(r for r in environment.markdown().splitlines() if r.startswith("| `ONNXCAST_SERVE_TOKEN`"))
    assert "(secret" in row


def test_an_undeclared_name_is_refused():
    with pytest.raises(KeyError, match="ONNXCAST_NOPE is not declared"):
        environment.get("ONNXCAST_NOPE")


def test_a_scoped_value_is_put_back_even_when_the_block_fails(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "before")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    with pytest.raises(RuntimeError), environment.scoped({"MLFLOW_TRACKING_USERNAME": "pipeline",
                                                          "MLFLOW_TRACKING_PASSWORD": "pw"}):
        assert os.environ["MLFLOW_TRACKING_USERNAME"] == "pipeline" and os.environ["MLFLOW_TRACKING_PASSWORD"] == "pw"
        raise RuntimeError("the block failed")
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "before" and "MLFLOW_TRACKING_PASSWORD" not in os.environ
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with environment.restoring("MLFLOW_TRACKING_URI"):  # what mlflow.set_tracking_uri does inside
        os.environ["MLFLOW_TRACKING_URI"] = "http://elsewhere"
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_defaults_agree_with_the_code_that_checks_them():
    from onnxcast.base.s3 import SSE_ALGORITHMS
    from onnxcast.registry.alias_rollout import DEFAULT_CHANNEL_ALIASES

    assert environment.default("ONNXCAST_CHANNEL_ALIASES") == DEFAULT_CHANNEL_ALIASES
    for algorithm in SSE_ALGORITHMS:
        assert environment.variable("ONNXCAST_STORE_SSE").parse(algorithm) == algorithm


def test_the_module_is_light_for_the_device_package():
    """The edge distribution ships onnxcast.base: the module loads nothing outside the standard library."""
    code = ("import sys; before = set(sys.modules); import onnxcast.base.environment; "
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['onnxcast']"


def test_an_empty_variable_is_unset_for_the_command_line_as_for_airflow(monkeypatch):
    """ONNXCAST_CHANNEL_ALIASES="" meant "no channel aliases" to the command line and the default
    to Airflow; now both read it through the declaration: empty is unset, the default."""
    from onnxcast.registry.release import registry_from_environment

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    monkeypatch.setenv("ONNXCAST_CHANNEL_ALIASES", "")
    assert registry_from_environment().channel_aliases == {"edge": "edge", "cloud": "cloud"}
    monkeypatch.setenv("ONNXCAST_CHANNEL_ALIASES", "edge=edge,cloud=champion")
    assert registry_from_environment().channel_aliases == {"edge": "edge", "cloud": "champion"}


def test_a_bad_data_limit_fails_the_read_naming_the_variable(monkeypatch, tmp_path):
    from onnxcast.pipeline.reading import max_data_bytes

    monkeypatch.setenv("ONNXCAST_MAX_DATA_BYTES", "2GB")
    with pytest.raises(ConfigError, match=r"^ONNXCAST_MAX_DATA_BYTES: '2GB' is not a whole number of bytes$"):
        max_data_bytes()
    monkeypatch.setenv("ONNXCAST_MAX_DATA_BYTES", "1000")
    assert max_data_bytes() == 1000
