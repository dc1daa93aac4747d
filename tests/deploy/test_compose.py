"""docker/docker-compose.yml: valid Compose, every service watched and restarted, the init
jobs fail loudly, secrets only as files, nothing published beyond 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
SCHEMA = Path(__file__).resolve().parent / "compose-spec.schema.json"
ONE_SHOT = {"airflow-init", "mlflow-init", "s3-init"}
WORKERS = {"airflow-worker-a", "airflow-worker-b"}
AIRFLOW_COMPONENTS = {"airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", *WORKERS}
SECRET_WORD = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|KEY|CRED|CONN", re.IGNORECASE)


class UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping (PyYAML keeps the last);
    merge keys (<<) may repeat what they merge."""

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value if key.tag != "tag:yaml.org,2002:merge"]
        duplicates = sorted({str(k) for k in keys if keys.count(k) > 1})
        if duplicates:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {duplicates}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.load(COMPOSE.read_text(), Loader=UniqueKeyLoader)


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def schema_errors(document: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_file_is_valid_against_the_compose_spec_schema(compose):
    assert schema_errors(compose) == []


def test_the_schema_rejects_a_broken_compose_file(compose):
    broken = yaml.safe_load(COMPOSE.read_text())
    broken["services"]["redis"]["helthcheck"] = broken["services"]["redis"].pop("healthcheck")
    broken["services"]["mlflow"]["depends_on"]["postgres"]["condition"] = "service_happy"
    errors = schema_errors(broken)
    assert any("helthcheck" in e for e in errors) and any("service_happy" in e for e in errors), errors


def test_every_long_running_service_has_a_healthcheck_and_a_restart_policy(services):
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service.get("restart") == "no", f"{name}: a one-shot job must not be restarted"
            continue
        assert service.get("restart") in ("always", "unless-stopped"), f"{name}: restart {service.get('restart')}"
        check = service.get("healthcheck", {})
        assert check.get("test") and not check.get("disable"), f"{name}: no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert all(check.get(k) for k in ("interval", "timeout", "retries")), f"{name}: {check}"


def test_components_start_after_a_healthy_api_server_and_successful_init_jobs(services):
    def condition(service: str, on: str) -> str | None:
        return services[service].get("depends_on", {}).get(on, {}).get("condition")

    assert condition("airflow-api-server", "airflow-init") == "service_completed_successfully"
    for name in AIRFLOW_COMPONENTS:
        assert condition(name, "airflow-api-server") == "service_healthy", name
        assert condition(name, "airflow-init") == "service_completed_successfully", name
    for name in WORKERS:
        assert condition(name, "s3-init") == "service_completed_successfully"
        assert condition(name, "mlflow-init") == "service_completed_successfully"
    assert condition("mlflow-init", "mlflow") == "service_healthy"
    assert condition("mlflow", "s3-init") == "service_completed_successfully"
    assert condition("s3-init", "seaweedfs") == "service_healthy"
    assert condition("airflow-init", "postgres") == "service_healthy"


def test_airflow_init_fails_on_a_failed_migration_and_creates_the_users(services):
    assert services["airflow-init"]["command"] == ["airflow-init"]
    script = (DOCKER / "bin" / "airflow-init").read_text()
    lines = [line.strip() for line in script.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert lines[0] == "set -euo pipefail"
    assert "airflow db migrate" in lines
    assert any(line.startswith("airflow-users") for line in lines)
    assert lines.index("airflow db migrate") < next(i for i, line in enumerate(lines) if line.startswith("airflow-users"))


def test_no_failure_is_swallowed():
    files = [COMPOSE, DOCKER / "postgres-init.sh", *sorted((DOCKER / "bin").iterdir())]
    for path in files:
        text = path.read_text()
        assert not re.search(r"\|\|\s*(true|:|exit 0)\b", text), f"{path.name}: a failure is ignored"
        if text.startswith("#!/bin/sh") or text.startswith("#!/usr/bin/env bash"):
            assert re.search(r"^set -eu", text, re.MULTILINE), f"{path.name}: no set -eu"


@pytest.fixture
def airflow_users():
    return [sys.executable, str(DOCKER / "bin" / "airflow-users")]


def test_airflow_users_writes_the_passwords_file_for_the_configured_users(tmp_path, airflow_users, services):
    users = services["airflow-api-server"]["environment"]["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]
    assert users == "admin:admin,engineer:user,viewer:viewer"
    secret = tmp_path / "secret.json"
    passwords = {"admin": "a" * 20, "engineer": "e" * 20, "viewer": "v" * 20}
    secret.write_text(json.dumps(passwords))
    out = tmp_path / "auth" / "passwords.json"
    result = subprocess.run([*airflow_users, "--users", users, "--passwords", str(secret), "--out", str(out)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == passwords
    assert out.stat().st_mode & 0o777 == 0o600
    assert "a" * 20 not in result.stdout + result.stderr


@pytest.mark.parametrize("passwords, message", [
    ({"admin": "a" * 20, "viewer": "v" * 20}, "users without a password ['engineer']"),
    ({"admin": "a" * 20, "engineer": "e" * 20, "viewer": "v" * 20, "root": "r" * 20}, "unconfigured users ['root']"),
    ({"admin": "short", "engineer": "e" * 20, "viewer": "v" * 20}, "['admin'] is shorter than 16"),
])
def test_airflow_users_refuses_a_secret_that_does_not_match(tmp_path, airflow_users, passwords, message):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(passwords))
    out = tmp_path / "passwords.json"
    result = subprocess.run([*airflow_users, "--users", "admin:admin,engineer:user,viewer:viewer",
                             "--passwords", str(secret), "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and message in result.stderr and not out.exists(), result.stderr


def test_published_ports_are_bound_to_loopback(services):
    published = [(name, port) for name, service in services.items() for port in service.get("ports", [])]
    assert {name for name, _ in published} == {"airflow-api-server", "mlflow", "seaweedfs"}
    for name, port in published:
        assert isinstance(port, str) and port.startswith("127.0.0.1:"), f"{name}: {port}"
    assert not any("expose" in s or s.get("network_mode") == "host" for s in services.values())


def interpolations(text: str) -> list[tuple[str, str]]:
    """(name, modifier) of every ${...} (not $${...}, which Compose leaves to the container)."""
    return re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)((?::?[-?+])?)", text)


def test_every_interpolated_variable_is_required_or_defaulted_and_secrets_are_required():
    found = interpolations(COMPOSE.read_text())
    assert found
    for name, modifier in found:
        assert modifier in (":?", ":-"), f"${{{name}}} has neither :? nor :-"
        if SECRET_WORD.search(name):
            assert modifier == ":?", f"${{{name}}} looks secret: it must be required (${{{name}:?...}})"
    messages = re.findall(r"\$\{ONNXCAST_SECRETS:\?([^}]+)\}", COMPOSE.read_text())
    assert messages and all(m.strip() for m in messages)


def test_the_interpolation_check_catches_an_optional_secret():
    names = interpolations("x: ${POSTGRES_PASSWORD:-postgres}\ny: ${API_TOKEN}\nz: $${HOSTNAME}\n")
    assert names == [("POSTGRES_PASSWORD", ":-"), ("API_TOKEN", "")]


def test_no_secret_value_is_in_the_compose_file(compose, services):
    text = COMPOSE.read_text()
    assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", text), "a URL with credentials"
    assert "AIRFLOW_CONN_" not in text and "--requirepass" not in text
    for name, service in services.items():
        env = service.get("environment", {})
        assert isinstance(env, dict), f"{name}: environment as a mapping, please"
        for key, value in env.items():
            if not SECRET_WORD.search(key):
                continue
            value = str(value)
            by_file = key.endswith(("_CMD", "_FILE", "_PATH")) or value.startswith(("/run/secrets/", "/nonexistent/"))
            assert by_file or key in NOT_SECRET, f"{name}: {key}={value!r} holds a secret value inline"
            if key.endswith("_CMD"):
                assert re.fullmatch(r"cat /run/secrets/[\w.-]+", value), f"{name}: {key}={value}"
        command = json.dumps(service.get("command", "")) + json.dumps(service.get("entrypoint", ""))
        assert not re.search(r"pass(word)?=|--password|requirepass", command, re.IGNORECASE), f"{name}: {command}"
    for secret in compose["secrets"].values():
        assert set(secret) == {"file"}, "secrets come from files only"


# Environment keys that match SECRET_WORD but hold no secret.
NOT_SECRET = {
    "AIRFLOW__SECRETS__BACKEND",          # a class name
    "AIRFLOW__SECRETS__BACKEND_KWARGS",   # the connections file's path
    "AIRFLOW__LOGGING__REMOTE_LOG_CONN_ID",  # a connection id
}


def test_the_secret_value_check_catches_an_inline_password():
    assert SECRET_WORD.search("POSTGRES_PASSWORD") and SECRET_WORD.search("AIRFLOW__CORE__FERNET_KEY")
    assert not "AIRFLOW__CORE__FERNET_KEY".endswith(("_CMD", "_FILE", "_PATH"))


def test_every_airflow_secret_setting_is_read_from_a_file(services):
    env = services["airflow-scheduler"]["environment"]
    for setting in ("AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__BROKER_URL",
                    "AIRFLOW__CELERY__RESULT_BACKEND", "AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY"):
        assert setting not in env and env[f"{setting}_CMD"].startswith("cat /run/secrets/"), setting
    assert env["AIRFLOW__SECRETS__BACKEND"] == "airflow.secrets.local_filesystem.LocalFilesystemBackend"
    kwargs = json.loads(env["AIRFLOW__SECRETS__BACKEND_KWARGS"])
    assert kwargs == {"connections_file_path": "/run/secrets/airflow-connections.json"}
    assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("SimpleAuthManager")
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"


def test_tasks_use_s3_for_run_store_rollout_store_and_logs(services):
    for name in AIRFLOW_COMPONENTS | {"airflow-api-server"}:
        env = services[name]["environment"]
        assert env["ONNXCAST_MODE"] == "deployed"
        assert env["ONNXCAST_RUN_ROOT"].startswith("s3://") and env["ONNXCAST_STORE_URI"].startswith("s3://")
        assert env["AIRFLOW__LOGGING__REMOTE_LOGGING"] == "True"
        assert env["AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER"].startswith("s3://")


def test_images_are_pinned(services):
    for name, service in services.items():
        image = service["image"]
        if image.startswith("${ONNXCAST_IMAGE"):
            assert "build" in service and re.search(r":-[\w.-]+:\d[\w.-]*\}$", image), f"{name}: {image}"
            continue
        repository, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.match(r"\d", tag), f"{name}: {image} is not pinned"


def test_two_workers_share_no_volume(services):
    assert WORKERS <= set(services)
    # distinct hosts, and names the network resolves (the API server fetches running tasks' logs)
    assert all(services[w]["hostname"] == w for w in WORKERS)
    for worker in WORKERS:
        assert not services[worker].get("volumes"), f"{worker} mounts a volume"
    mounts: dict[str, list[str]] = {}
    for name, service in services.items():
        if name in ONE_SHOT:
            continue
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume["source"]
            mounts.setdefault(source, []).append(name)
    shared = {source: users for source, users in mounts.items() if len(users) > 1}
    assert not shared, f"volumes shared between long-running services: {shared}"


def test_the_signing_key_is_mounted_on_the_workers_only(services):
    holders = {name for name, service in services.items()
               for s in service.get("secrets", []) if (s if isinstance(s, str) else s["source"]) == "onnxcast-signing-key"}
    assert holders == WORKERS


@pytest.fixture(scope="module")
def made_secrets(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("deploy") / "secrets"
    result = subprocess.run([sys.executable, str(DOCKER / "make-secrets.py"), "--out", str(folder)],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    return folder


def test_make_secrets_makes_every_file_the_compose_file_mounts(compose, services, made_secrets):
    declared = compose["secrets"]
    for name, secret in declared.items():
        relative = re.fullmatch(r"\$\{ONNXCAST_SECRETS:\?[^}]+\}/(.+)", secret["file"]).group(1)
        assert (made_secrets / relative).is_file(), f"secret {name}: make-secrets.py makes no {relative}"
    used = {s if isinstance(s, str) else s["source"] for service in services.values() for s in service.get("secrets", [])}
    assert used == set(declared), f"declared but unused {set(declared) - used}, used but undeclared {used - set(declared)}"
    assert made_secrets.stat().st_mode & 0o777 == 0o700


def test_make_secrets_keeps_its_secrets_and_the_derived_files_agree(made_secrets):
    before = {p.name: p.read_text() for p in made_secrets.iterdir() if p.is_file()}
    result = subprocess.run([sys.executable, str(DOCKER / "make-secrets.py"), "--out", str(made_secrets)],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert {p.name: p.read_text() for p in made_secrets.iterdir() if p.is_file()} == before
    connections = json.loads((made_secrets / "airflow-connections.json").read_text())
    users = json.loads((made_secrets / "mlflow-users.json").read_text())
    assert connections["mlflow_default"]["login"] == "pipeline"
    assert connections["mlflow_default"]["password"] == users["pipeline"]
    identities = {i["name"]: i for i in json.loads((made_secrets / "seaweedfs-s3.json").read_text())["identities"]}
    assert set(identities) == {"onnxcast-pipeline", "onnxcast-mlflow", "onnxcast-logs"}  # no admin identity
    pipeline = identities["onnxcast-pipeline"]["credentials"][0]["accessKey"]
    assert connections["aws_default"]["login"] == pipeline
    assert {a.split(":")[1] for a in identities["onnxcast-mlflow"]["actions"]} == {"onnxcast-mlflow"}
    assert all(":" in a for i in identities.values() for a in i["actions"]), "every action scoped to a bucket"
    assert not (made_secrets / "airflow-db-url").read_text().endswith("\n")  # *_CMD output is used unstripped
    assert (made_secrets / "release" / "signing.key").is_file() and (made_secrets / "release" / "root.json").is_file()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_local_settings_and_secrets_are_ignored_by_git():
    for path in ("docker/.env", "docker/secrets/postgres-password"):
        result = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, capture_output=True, timeout=30)
        assert result.returncode == 0, f"{path} is not ignored by git"
    result = subprocess.run(["git", "check-ignore", "-q", "docker/.env.example"], cwd=REPO, capture_output=True,
                            timeout=30)
    assert result.returncode == 1, "docker/.env.example must stay tracked"


def test_env_example_holds_settings_only():
    settings = dict(line.split("=", 1) for line in (DOCKER / ".env.example").read_text().splitlines()
                    if line.strip() and not line.startswith("#"))
    assert set(settings) == {"ONNXCAST_SECRETS", "ONNXCAST_IMAGE"}
    assert not any(SECRET_WORD.search(k) and k != "ONNXCAST_SECRETS" for k in settings)
    used = {name for name, _ in interpolations(COMPOSE.read_text())}
    assert used == set(settings)
