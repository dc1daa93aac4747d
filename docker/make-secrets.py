#!/usr/bin/env python3
"""Make the secret files that docker-compose.yml mounts (docker `secrets:`), once.

    python3 docker/make-secrets.py                      # into $ONNXCAST_SECRETS or docker/secrets
    python3 docker/make-secrets.py --out /etc/onnxcast/secrets

Every secret is random, made on the first run and kept; the files that combine several
(database URLs, the Airflow connections, the MLflow auth ini, the S3 identities) are written
again on every run from those, so rotating one means deleting its file and running this again
(then restart the services that read it; a database password also needs ALTER ROLE).

The folder is created with mode 0700: only its owner (and root) can reach the files in it.
The files themselves are 0644 because each container reads its secrets as its own user
(postgres 999, redis 999, airflow 50000) through a bind mount that keeps the host's mode; a
container only ever sees the secrets its service lists. Standard library only, plus
`onnxcast` for the release signing key (run it with the project's virtualenv, or in the
image: see docker/README.md); without onnxcast the two key files are left for you to provide.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import sys
from pathlib import Path
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
BUCKETS = {"runs": "onnxcast-runs", "rollout": "onnxcast-rollout", "data": "onnxcast-data",
           "mlflow": "onnxcast-mlflow", "logs": "onnxcast-logs"}
# Least privilege on S3 (SeaweedFS identities; an action scoped to a bucket is "Action:bucket").
S3_IDENTITIES = {
    "pipeline": ("runs", "rollout", "data"),  # the Airflow tasks: run store, rollout store, input data
    "mlflow": ("mlflow",),                    # the MLflow server's proxied artifact store, nothing else
    "logs": ("logs",),                        # Airflow remote task logs (workers write, API server reads)
}
S3_ACTIONS = ("Read", "Write", "List", "Tagging")
AIRFLOW_USERS = ("admin", "engineer", "viewer")  # roles: docker-compose.yml SIMPLE_AUTH_MANAGER_USERS
MLFLOW_USERS = ("pipeline", "reader", "release")
DATABASES = ("airflow", "mlflow", "mlflow_auth")  # one PostgreSQL role per database, same name
REGION = "us-east-1"
S3_ENDPOINT = "http://seaweedfs:8333"
MLFLOW_URL = "http://mlflow:5000"
MLFLOW_UI_URL = "http://localhost:5000"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("ONNXCAST_SECRETS") or str(HERE / "secrets"),
                        help="the secrets folder (default $ONNXCAST_SECRETS, else docker/secrets)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    out.chmod(0o700)
    vault = Vault(out)
    write_all(vault)
    missing = release_key(out)
    print(f"secrets in {out} (folder mode 0700)")
    if missing:
        print("error: the release signing key is missing: " + missing, file=sys.stderr)
        return 1
    return 0


class Vault:
    """Secret files in one folder: ``get`` makes a random one once, ``write`` (re)writes a derived one."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def get(self, name: str, make=lambda: secrets.token_urlsafe(32)) -> str:
        path = self.folder / name
        if not path.exists():
            self.write(name, make())
        return path.read_text().strip()  # a file written by hand may end in a newline

    def write(self, name: str, text: str) -> None:
        path = self.folder / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)  # as is: Airflow's *_CMD settings use a command's output unstripped
        os.replace(tmp, path)


def write_all(vault: Vault) -> None:
    # PostgreSQL: the superuser (only the postgres container reads it) and one role per database.
    vault.get("postgres-password")
    db = {name: vault.get(f"{name.replace('_', '-')}-db-password") for name in DATABASES}
    vault.write("airflow-db-url", postgres_url("airflow", db["airflow"], driver="postgresql+psycopg2"))
    # SQLAlchemy 2.1 loads psycopg 3 for a bare postgresql:// (not installed): name the driver
    vault.write("celery-result-backend", "db+" + postgres_url("airflow", db["airflow"], driver="postgresql+psycopg2"))
    vault.write("mlflow-backend-store-uri", postgres_url("mlflow", db["mlflow"], driver="postgresql+psycopg2"))

    # Redis: the broker needs a password; redis-server reads it from its config file.
    redis_password = vault.get("redis-password")
    vault.write("redis.conf", f"requirepass {redis_password}\nappendonly yes\nprotected-mode yes\n")
    vault.write("celery-broker-url", f"redis://:{quote(redis_password, safe='')}@redis:6379/0")

    # Airflow: keys shared by every component; HS512 JWTs want a key of 64 bytes or more.
    vault.get("airflow-fernet-key", lambda: base64.urlsafe_b64encode(os.urandom(32)).decode())
    vault.get("airflow-jwt-secret", lambda: secrets.token_urlsafe(64))
    vault.get("airflow-api-secret-key", lambda: secrets.token_urlsafe(64))
    airflow_passwords = {user: vault.get(f"airflow-{user}-password") for user in AIRFLOW_USERS}
    vault.write("airflow-passwords.json", json.dumps(airflow_passwords, indent=2) + "\n")

    # S3 identities (SeaweedFS) and the SSE-S3 key-encryption key.
    keys = {identity: s3_keys(vault, identity) for identity in S3_IDENTITIES}
    identities = []
    for identity, buckets in S3_IDENTITIES.items():
        identities.append({
            "name": f"onnxcast-{identity}",
            "credentials": [{"accessKey": keys[identity]["access_key"], "secretKey": keys[identity]["secret_key"]}],
            "actions": [f"{action}:{BUCKETS[b]}" for b in buckets for action in S3_ACTIONS],
        })
    vault.write("seaweedfs-s3.json", json.dumps({"identities": identities}, indent=2) + "\n")
    kek = vault.get("seaweedfs-kek", lambda: secrets.token_hex(32))
    vault.write("seaweedfs-security.toml", f'[s3.sse]\nkek = "{kek}"\n')
    vault.write("mlflow-s3.credentials", "[default]\n"
                f"aws_access_key_id = {keys['mlflow']['access_key']}\n"
                f"aws_secret_access_key = {keys['mlflow']['secret_key']}\n")

    # MLflow: basic auth (its own database), the admin, the pipeline and reader users.
    mlflow_admin = vault.get("mlflow-admin-password")
    mlflow_users = {user: vault.get(f"mlflow-{user}-password") for user in MLFLOW_USERS}
    vault.write("mlflow-users.json", json.dumps(mlflow_users, indent=2) + "\n")
    vault.get("mlflow-flask-secret-key")
    auth_db = postgres_url("mlflow_auth", db["mlflow_auth"], driver="postgresql+psycopg2")
    vault.write("mlflow-basic-auth.ini",  # read by configparser: a literal % is written %%
                "[mlflow]\n"
                "default_permission = READ\n"
                f"database_uri = {auth_db.replace('%', '%%')}\n"
                "admin_username = admin\n"
                f"admin_password = {mlflow_admin.replace('%', '%%')}\n"
                # a verified login is trusted for 60 s per worker, not hashed again on every
                # request (0.33-0.55 s each on 2 cores; docs/deployment.md, MLflow basic auth)
                "auth_cache_ttl_seconds = 60\n"
                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")

    # Airflow connections (LocalFilesystemBackend): MLflow as the pipeline user, S3 per identity.
    s3_extra = json.dumps({"endpoint_url": S3_ENDPOINT, "region_name": REGION})
    connections = {
        "mlflow_default": {"conn_type": "mlflow", "host": MLFLOW_URL, "login": "pipeline",
                           "password": mlflow_users["pipeline"], "extra": json.dumps({"ui_url": MLFLOW_UI_URL})},
        "aws_default": {"conn_type": "aws", "login": keys["pipeline"]["access_key"],
                        "password": keys["pipeline"]["secret_key"], "extra": s3_extra},
        "aws_logs": {"conn_type": "aws", "login": keys["logs"]["access_key"],
                     "password": keys["logs"]["secret_key"], "extra": s3_extra},
    }
    vault.write("airflow-connections.json", json.dumps(connections, indent=2) + "\n")


def postgres_url(role: str, password: str, *, driver: str) -> str:
    return f"{driver}://{quote(role, safe='')}:{quote(password, safe='')}@postgres:5432/{role}"


def s3_keys(vault: Vault, identity: str) -> dict[str, str]:
    access = vault.get(f"s3-{identity}-access-key", lambda: "OC" + secrets.token_hex(9).upper())
    secret = vault.get(f"s3-{identity}-secret-key", lambda: secrets.token_urlsafe(30))
    return {"access_key": access, "secret_key": secret}


def release_key(out: Path) -> str | None:
    """The release signing key (release/signing.key) and its trust root (release/root.json):
    made with onnxcast when it is importable; None when both exist, else what to do."""
    folder = out / "release"
    if (folder / "signing.key").exists() and (folder / "root.json").exists():
        return None
    try:
        from onnxcast.rollout.signing import generate_key
    except ImportError:
        return (f"make it with `onnxcast keys generate --out {folder}` (the project's virtualenv or the "
                "image, see docker/README.md), or put an existing signing.key and root.json there")
    generate_key(str(folder))
    for path in folder.iterdir():
        path.chmod(0o644)  # read by the workers' user through the bind mount (see the module docstring)
    folder.chmod(0o700)
    return None


if __name__ == "__main__":
    sys.exit(main())
