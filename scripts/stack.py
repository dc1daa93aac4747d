"""A production-like, multi-host onnxcast stack from local processes, without Docker.

    make stack                      # = python scripts/stack.py up
    make stack-down                 # = python scripts/stack.py down   (STACK_ARGS=--wipe: data too)
    python scripts/stack.py status  # what runs, health, Celery workers

Everything lives under ``$ONNXCAST_HOME/stack`` (docs/stack.md): PostgreSQL databases for Airflow,
MLflow and MLflow's users on the running server; Redis (a db of its own) as the Celery broker;
SeaweedFS as S3 with authentication and least-privilege identities; an MLflow tracking server
with basic auth and artifacts in S3; Airflow 3 with the CeleryExecutor: API server, scheduler,
DAG processor, triggerer and two Celery workers, each its own "host" (own folders, own
hostname, the other's files out of sight). ``stack.json`` (mode 0600) says how to reach it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack_processes as processes  # noqa: E402
import stack_services as services  # noqa: E402
from stack_processes import StackError  # noqa: E402
from stack_services import BUCKETS, WORKERS, Secrets, StackLayout, StackSettings  # noqa: E402

TRAINING_DAG = "onnxcast_training"
CENTRAL = ("seaweedfs", "mlflow", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
           "airflow-triggerer")
WORKER_SERVICES = {f"airflow-worker-{w.rsplit('-', 1)[-1]}": w for w in WORKERS}  # service -> hostname
SERVICES = (*CENTRAL, *WORKER_SERVICES)
# The services that can be stopped and started on their own (fault drills).
RESTARTABLE = ("seaweedfs", "mlflow", *WORKER_SERVICES)
# Bounded waits (seconds) per step, measured with room to spare on 2 busy cores.
TIMEOUTS = {"seaweedfs": 120, "mlflow": 180, "airflow-db-migrate": 600, "airflow-api-server": 300,
            "components": 300, "workers": 300, "dag": 300}
# Shutdown order: workers drain first while the API server they report to still answers.
STOP_STAGES = (("airflow-worker-",), ("airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"),
               ("airflow-api-server",), ("mlflow",), ("seaweedfs",))
# Inherited variables that would point a stack process at something else than the stack.
FOREIGN_ENV_PREFIXES = ("AIRFLOW", "MLFLOW_", "AWS_", "ONNXCAST_", "BOTO_", "PYTHONPATH")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the stack (or report the one running)")
    up.add_argument("--name", default=os.environ.get("ONNXCAST_STACK_NAME"),
                    help="prefix of the PostgreSQL databases (default onnxcast_stack; kept after first up)")
    up.add_argument("--redis-db", type=int, default=_int_env("ONNXCAST_STACK_REDIS_DB"),
                    help="Redis database number of the Celery broker (default 7; kept after first up)")
    up.add_argument("--keep-paused", action="store_true", help=f"do not unpause {TRAINING_DAG}")
    up.add_argument("--heartbeat-timeout", type=int, default=_int_env("ONNXCAST_STACK_HEARTBEAT_TIMEOUT"),
                    help="seconds without a heartbeat before a task of a dead worker is failed "
                         "(default 75; kept after first up)")
    up.add_argument("--retry-delay", type=int, default=_int_env("ONNXCAST_STACK_RETRY_DELAY"),
                    help="seconds before a failed task is retried, for every onnxcast DAG "
                         "(default: each DAG's own, 1-5 minutes; kept after first up)")
    down = commands.add_parser("down", help="stop every process of the stack (data stays)")
    down.add_argument("--wipe", action="store_true",
                      help="also drop the stack's databases, its Redis db and the whole stack folder")
    status = commands.add_parser("status", help="what runs and whether it is healthy")
    status.add_argument("--json", action="store_true", help="print JSON")
    for command, text in (("stop-service", "stop one service (its whole namespace)"),
                          ("start-service", "start one stopped service again and wait until it answers"),
                          ("restart", "stop one service, start it again, wait until it answers")):
        one = commands.add_parser(command, help=text)
        one.add_argument("service", choices=[s for s in SERVICES if s in RESTARTABLE])
        if command != "start-service":
            one.add_argument("--kill", action="store_true", help="SIGKILL at once (a crash), no SIGTERM first")
    args = parser.parse_args(argv)
    layout = StackLayout.for_home()
    try:
        if args.command == "up":
            return stack_up(layout, name=args.name, redis_db=args.redis_db, unpause=not args.keep_paused,
                            heartbeat_timeout=args.heartbeat_timeout, retry_delay=args.retry_delay)
        if args.command == "down":
            return stack_down(layout, wipe=args.wipe)
        if args.command in ("stop-service", "restart"):
            stop_service(layout, args.service, kill=args.kill)
        if args.command in ("start-service", "restart"):
            start_service(layout, args.service)
        if args.command in ("stop-service", "start-service", "restart"):
            return 0
        return stack_status(layout, as_json=args.json)
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


# --- up ----------------------------------------------------------------------------------------

def stack_up(layout: StackLayout, *, name: str | None, redis_db: int | None, unpause: bool,
             heartbeat_timeout: int | None = None, retry_delay: int | None = None) -> int:
    started_at = time.monotonic()
    running = [s for s in processes.recorded(layout.run) if s.alive()]
    if running:
        if {s.name for s in running} >= set(SERVICES) and layout.info_file.exists() and _api_healthy(layout):
            print(f"The stack in {layout.root} is already running:")
            print_summary(json.loads(layout.info_file.read_text()))
            return 0
        print(f"A stack in {layout.root} runs only in part ({', '.join(s.name for s in running)}): "
              "stopping it, then starting everything (data is kept)")
        processes.stop_all(layout.run, layout.root, stages=STOP_STAGES)
    elif processes.stack_pids(layout.root):
        processes.stop_all(layout.run, layout.root, stages=STOP_STAGES)
    _check_prerequisites()
    # a folder without secrets yet is a new stack, whatever databases its path once had
    fresh = not (layout.secrets.is_dir() and any(layout.secrets.iterdir()))
    layout.create()
    vault = Secrets(layout.secrets)
    settings = StackSettings.load(layout, name=name, redis_db=redis_db, heartbeat_timeout=heartbeat_timeout,
                                  retry_delay=retry_delay)
    _check_backing_services(settings)
    settings.assign_ports(["seaweedfs." + p for p in services.SEAWEED_PORTS]
                          + ["mlflow", "airflow-api", "airflow-trigger-logs"]
                          + [f"log-server.{w}" for w in WORKERS])
    settings.save(layout)
    try:
        info = _start_everything(layout, vault, settings, unpause=unpause, fresh=fresh)
    except BaseException:
        print(f"error: the stack did not start; stopping what was started (logs stay in {layout.logs})",
              file=sys.stderr)
        processes.stop_all(layout.run, layout.root, stages=STOP_STAGES, say=lambda m: print(m, file=sys.stderr))
        raise
    info["startup_seconds"] = round(time.monotonic() - started_at, 1)
    services.write_private(layout.info_file, json.dumps(info, indent=2) + "\n")
    print(f"The stack is up after {info['startup_seconds']:.0f}s.")
    print_summary(info)
    return 0


def _start_everything(layout: StackLayout, vault: Secrets, settings: StackSettings, *, unpause: bool,
                      fresh: bool = False) -> dict:
    base = _base_env(layout)

    _step(f"PostgreSQL {settings.postgres_host}:{settings.postgres_port}: databases "
          f"{settings.airflow_db}, {settings.mlflow_db}, {settings.mlflow_auth_db}")
    databases = (settings.airflow_db, settings.mlflow_db, settings.mlflow_auth_db)
    try:
        services.ensure_databases(settings, {db: vault.get(f"postgres-{db}.password") for db in databases},
                                  layout, fresh=fresh)
        services.claim_redis_db(settings, layout, fresh=fresh)
    except services.OwnershipError as exc:
        raise StackError(str(exc)) from None

    _step(f"SeaweedFS S3 on {settings.url('seaweedfs.s3.port')}")
    weed = _start_restartable(layout, vault, settings, "seaweedfs")
    _wait_answering(weed, vault, settings)
    admin_s3 = services.s3_client(settings, services.s3_keys(vault, "admin"))
    # a just-started server may refuse for a moment
    processes.wait_until(weed, lambda: services.ensure_buckets(admin_s3) is None, timeout=20,
                         what="done creating the buckets", interval=2)

    _step("release key")
    _ensure_release_key(layout, base)

    _step(f"MLflow on {settings.url('mlflow')}")
    mlflow = _start_restartable(layout, vault, settings, "mlflow")

    central = services.airflow_env(base, layout, vault, settings, airflow_home=layout.airflow,
                                   onnxcast_home=layout.home, log_folder=layout.airflow / "logs")
    _step("airflow db migrate")
    _migrate(layout, central)
    _wait_answering(mlflow, vault, settings)
    services.ensure_mlflow_users(settings, vault)

    _step(f"Airflow on {settings.url('airflow-api')} and workers {', '.join(WORKERS)}")
    api = _start(layout, "airflow-api-server", services.airflow_command("api-server"), central, layout.airflow)
    central_components = [_start(layout, f"airflow-{c}", services.airflow_command(*args), central, layout.airflow)
                          for c, args in (("scheduler", ["scheduler"]), ("dag-processor", ["dag-processor"]),
                                          ("triggerer", ["triggerer", "--skip-serve-logs"]))]
    workers = {hostname: _start_restartable(layout, vault, settings, name)
               for name, hostname in WORKER_SERVICES.items()}

    api_url = settings.url("airflow-api")
    processes.wait_until(api, lambda: _http_status(f"{api_url}/api/v2/monitor/health") == 200,
                         timeout=TIMEOUTS["airflow-api-server"], what="answering /api/v2/monitor/health")
    for component in central_components:
        key = component.name.removeprefix("airflow-").replace("-", "_")
        processes.wait_until(component, lambda key=key: _component_healthy(api_url, key),
                             timeout=TIMEOUTS["components"], what="healthy in /api/v2/monitor/health")
    for worker in workers.values():
        _wait_answering(worker, vault, settings)

    passwords = json.loads(vault.path("airflow-passwords.json").read_text())
    token = _airflow_token(api_url, "admin", passwords["admin"])
    dag_processor = central_components[1]
    processes.wait_until(dag_processor, lambda: _dag_exists(api_url, token, TRAINING_DAG),
                         timeout=TIMEOUTS["dag"], what=f"done parsing {TRAINING_DAG}", interval=2)
    if unpause:
        _unpause(api_url, token, TRAINING_DAG)

    all_services = {s.name: s for s in processes.recorded(layout.run)}
    mlflow_passwords = services.mlflow_passwords(vault)
    return {
        "stack_dir": str(layout.root),
        "api_url": api_url,
        "username": "admin",
        "password": passwords["admin"],
        "airflow_users": {user: {"password": passwords[user], "role": role}
                          for user, role in services.AIRFLOW_USERS.items()},
        "mlflow_url": settings.url("mlflow"),
        "mlflow_users": {user: {"username": user, "password": mlflow_passwords[user]}
                         for user in ("admin", *services.MLFLOW_USERS)},
        "s3_endpoint": settings.url("seaweedfs.s3.port"),
        "s3_region": services.REGION,
        "s3_keys": {identity: services.s3_keys(vault, identity) for identity in ("admin", *services.S3_IDENTITIES)},
        "s3_identity_buckets": {identity: [BUCKETS[b] for b in buckets]
                                for identity, buckets in services.S3_IDENTITIES.items()},
        "buckets": BUCKETS,
        "broker_url": settings.broker_url,
        "postgres": {"host": settings.postgres_host, "port": settings.postgres_port,
                     "databases": list(databases)},
        "onnxcast_settings": {k: central[k] for k in ("ONNXCAST_MODE", "ONNXCAST_RUN_ROOT", "ONNXCAST_STORE_URI",
                                                      "ONNXCAST_SIGNING_KEY", "ONNXCAST_TRUST")},
        "airflow_connections_file": str(layout.secrets / "connections.json"),
        "workers": [{"hostname": h, "service": w.name, "pid": w.pid, "log": str(w.log),
                     "onnxcast_home": str(layout.worker(h) / "home"), "tmpdir": str(layout.worker(h) / "tmp"),
                     "airflow_home": str(layout.worker(h) / "airflow"),
                     "log_server_port": settings.ports[f"log-server.{h}"]} for h, w in workers.items()],
        "processes": {n: {"pid": s.pid, "log": str(s.log)} for n, s in all_services.items()},
        "ports": settings.ports,
        "logs": str(layout.logs),
        "training_dag": TRAINING_DAG,
        "training_dag_unpaused": unpause,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _start(layout: StackLayout, name: str, command: list[str], env: dict[str, str],
           cwd: Path) -> processes.ServiceProcess:
    if command[0] != "unshare":
        command = services.contained(layout, command)
    return processes.start(name, command, env=env, cwd=cwd, log=layout.logs / f"{name}.log", run_dir=layout.run)


def _base_env(layout: StackLayout) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_ENV_PREFIXES)}
    env["PATH"] = os.pathsep.join([str(services.BIN), env.get("PATH", "/usr/bin:/bin")])
    env[processes.STACK_MARKER] = str(layout.root)
    return env


def _check_prerequisites() -> None:
    missing = [tool for tool in ("airflow", "mlflow", "onnxcast") if not (services.BIN / tool).exists()]
    if missing:
        raise StackError(f"{', '.join(missing)} not found in {services.BIN}: run `make install` first")
    try:
        import flask_wtf  # noqa: F401 - MLflow's basic-auth app needs it (pip extra mlflow[auth])
    except ImportError:
        raise StackError("MLflow's basic-auth app needs Flask-WTF: pip install 'mlflow[auth]'") from None
    probe = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--", "true"]
    if shutil.which("unshare") is None or os.geteuid() != 0 or subprocess.run(probe, capture_output=True).returncode:
        raise StackError("the stack needs `unshare --pid --fork --mount-proc --uts` (util-linux) as root: every "
                         "service runs in its own PID namespace, each worker host also with its own mounts "
                         "and hostname")


def _check_backing_services(settings: StackSettings) -> None:
    from urllib.parse import urlparse

    redis = urlparse(settings.redis_url)
    for what, host, port in (("PostgreSQL", settings.postgres_host, settings.postgres_port),
                             ("Redis", redis.hostname or "127.0.0.1", redis.port or 6379)):
        try:
            socket.create_connection((host, port), timeout=3).close()
        except OSError as exc:
            raise StackError(f"{what} is not reachable at {host}:{port} ({exc}); the stack uses the running "
                             f"server") from None


def _ensure_release_key(layout: StackLayout, base: dict[str, str]) -> None:
    if (layout.keys / "signing.key").exists():
        return
    env = {**base, "PYTHONPATH": str(services.REPO)}
    result = subprocess.run([str(services.BIN / "onnxcast"), "keys", "generate", "--out", str(layout.keys)],
                            env=env, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise StackError(f"onnxcast keys generate failed: {result.stderr.strip()[-500:]}")


def _migrate(layout: StackLayout, env: dict[str, str]) -> None:
    log = layout.logs / "airflow-db-migrate.log"
    with open(log, "ab") as out:
        try:
            result = subprocess.run(services.airflow_command("db", "migrate"), env=env, cwd=layout.airflow,
                                    stdout=out, stderr=subprocess.STDOUT, timeout=TIMEOUTS["airflow-db-migrate"])
        except subprocess.TimeoutExpired:
            raise StackError(f"airflow db migrate did not finish within {TIMEOUTS['airflow-db-migrate']}s; "
                             f"see {log}") from None
    if result.returncode != 0:
        raise StackError(f"airflow db migrate failed (exit {result.returncode}); see {log}\n{processes.tail(log)}")


def _step(message: str) -> None:
    print(f"-- {message}", flush=True)


# --- one service: stop, start (fault drills) ---------------------------------------------------


def stop_service(layout: StackLayout, name: str, *, kill: bool = False) -> None:
    """Stop one service of a running stack: its process group and everything in its PID
    namespace. ``kill``: SIGKILL at once, as a crashed host."""
    service = {s.name: s for s in processes.recorded(layout.run)}.get(name)
    if service is None or not service.alive():
        print(f"{name} is not running")
        return
    processes.stop_service(service, kill=kill)
    print(f"stopped {name} (process group {service.pid}{', SIGKILL' if kill else ''})")


def start_service(layout: StackLayout, name: str) -> processes.ServiceProcess:
    """Start one stopped service of a stack that is up, as ``up`` started it (same command,
    environment, ports), and wait until it answers."""
    if name not in RESTARTABLE:
        raise StackError(f"{name}: only {', '.join(RESTARTABLE)} can be started on their own")
    service = {s.name: s for s in processes.recorded(layout.run)}.get(name)
    if service is not None and service.alive():
        raise StackError(f"{name} is running (process group {service.pid}); stop it first")
    if not layout.settings_file.exists():
        raise StackError(f"no stack in {layout.root}: `stack.py up` first")
    vault = Secrets(layout.secrets)
    settings = StackSettings.load(layout)
    started = _start_restartable(layout, vault, settings, name)
    _wait_answering(started, vault, settings)
    _record_pid(layout, started)
    print(f"started {name} (process group {started.pid})")
    return started


def _start_restartable(layout: StackLayout, vault: Secrets, settings: StackSettings,
                       name: str) -> processes.ServiceProcess:
    """Start seaweedfs, mlflow or a worker host: the same command, environment and folder for
    ``up`` and for ``start-service``."""
    base = _base_env(layout)
    if name == "seaweedfs":
        identities = services.write_seaweedfs_config(layout, vault)
        return _start(layout, name, services.seaweedfs_command(layout, settings, identities), base, layout.seaweedfs)
    if name == "mlflow":
        env = services.mlflow_env(base, layout, vault, settings)
        return _start(layout, name, services.mlflow_command(settings), env, layout.mlflow)
    hostname = WORKER_SERVICES[name]
    folder = layout.worker(hostname)
    env = services.airflow_env(base, layout, vault, settings, airflow_home=folder / "airflow",
                               onnxcast_home=folder / "home", log_folder=folder / "airflow" / "logs")
    env.update({"TMPDIR": str(folder / "tmp"), "ONNXCAST_WORKER_HOSTNAME": hostname,
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(settings.ports[f"log-server.{hostname}"])})
    return _start(layout, name, services.worker_command(layout, hostname), env, folder)


def _wait_answering(service: processes.ServiceProcess, vault: Secrets, settings: StackSettings) -> None:
    """Wait until a just-started seaweedfs, mlflow or worker host answers."""
    if service.name == "seaweedfs":
        admin_s3 = services.s3_client(settings, services.s3_keys(vault, "admin"))
        processes.wait_until(service, lambda: admin_s3.list_buckets() is not None, timeout=TIMEOUTS["seaweedfs"],
                             what="serving S3")
    elif service.name == "mlflow":
        processes.wait_until(service, lambda: _http_status(f"{settings.url('mlflow')}/health") == 200,
                             timeout=TIMEOUTS["mlflow"], what="answering /health")
    else:
        celery_name = f"celery@{WORKER_SERVICES[service.name]}"
        processes.wait_until(service, lambda: celery_name in _celery_ping(settings), timeout=TIMEOUTS["workers"],
                             what="answering a Celery ping", interval=2)


def _record_pid(layout: StackLayout, started: processes.ServiceProcess) -> None:
    """Keep ``stack.json`` true after a restart: its process (and worker) entry gets the new
    process group id and log."""
    if not layout.info_file.exists():
        return
    info = json.loads(layout.info_file.read_text())
    info.setdefault("processes", {})[started.name] = {"pid": started.pid, "log": str(started.log)}
    for worker in info.get("workers", []):
        if worker.get("service") == started.name:
            worker.update(pid=started.pid, log=str(started.log))
    services.write_private(layout.info_file, json.dumps(info, indent=2) + "\n")


# --- HTTP probes -------------------------------------------------------------------------------

def _http_status(url: str) -> int:
    import requests

    return requests.get(url, timeout=5).status_code


def _api_healthy(layout: StackLayout) -> bool:
    try:
        info = json.loads(layout.info_file.read_text())
        return _http_status(f"{info['api_url']}/api/v2/monitor/health") == 200
    except Exception:  # noqa: BLE001 - anything but a healthy answer means "not running"
        return False


def _component_healthy(api_url: str, key: str) -> bool:
    import requests

    health = requests.get(f"{api_url}/api/v2/monitor/health", timeout=5).json()
    return health.get(key, {}).get("status") == "healthy"


def _celery_ping(settings: StackSettings) -> set[str]:
    from celery import Celery

    app = Celery(broker=settings.broker_url)
    try:
        return {name for reply in app.control.ping(timeout=2) for name in reply}
    finally:
        app.close()


def _airflow_token(api_url: str, username: str, password: str) -> str:
    import requests

    response = requests.post(f"{api_url}/auth/token", json={"username": username, "password": password}, timeout=30)
    if response.status_code not in (200, 201):
        raise StackError(f"Airflow API server: no token for {username!r} (HTTP {response.status_code})")
    return response.json()["access_token"]


def _dag_exists(api_url: str, token: str, dag_id: str) -> bool:
    import requests

    headers = {"Authorization": f"Bearer {token}"}
    response = requests.get(f"{api_url}/api/v2/dags/{dag_id}", headers=headers, timeout=10)
    if response.status_code == 200:
        return True
    errors = requests.get(f"{api_url}/api/v2/importErrors", headers=headers, timeout=10).json()
    for error in errors.get("import_errors", []):
        if dag_id in error.get("filename", ""):
            raise StackError(f"{dag_id} does not import: {error.get('stack_trace', '')[-800:]}")
    return False


def _unpause(api_url: str, token: str, dag_id: str) -> None:
    import requests

    response = requests.patch(f"{api_url}/api/v2/dags/{dag_id}", json={"is_paused": False},
                              headers={"Authorization": f"Bearer {token}"}, timeout=30)
    if response.status_code != 200:
        raise StackError(f"cannot unpause {dag_id}: HTTP {response.status_code} {response.text[:300]}")


# --- down and status ---------------------------------------------------------------------------

def stack_down(layout: StackLayout, *, wipe: bool) -> int:
    found = processes.stop_all(layout.run, layout.root, stages=STOP_STAGES)
    left = processes.stack_pids(layout.root)
    if left:
        raise StackError(f"processes of the stack still run after SIGKILL: {sorted(left)}")
    print(f"stopped {found} process group(s) of the stack in {layout.root}" if found
          else f"nothing of the stack in {layout.root} was running")
    if wipe:
        _wipe(layout)
    elif layout.root.exists():
        print(f"data kept in {layout.root} (`make stack-down STACK_ARGS=--wipe` removes it)")
    return 0


def _wipe(layout: StackLayout) -> None:
    if layout.settings_file.exists():
        settings = StackSettings.load(layout)
        databases = [settings.airflow_db, settings.mlflow_db, settings.mlflow_auth_db]
        try:
            services.drop_databases(settings, databases)
            print(f"dropped databases {', '.join(databases)}")
        except Exception as exc:  # noqa: BLE001 - report, and still remove the files
            print(f"warning: could not drop the databases {databases}: {exc}", file=sys.stderr)
        try:
            import redis

            redis.Redis.from_url(settings.broker_url).flushdb()
            print(f"flushed Redis {settings.broker_url}")
        except Exception as exc:  # noqa: BLE001
            print(f"warning: could not flush Redis {settings.broker_url}: {exc}", file=sys.stderr)
    if layout.root.exists():
        shutil.rmtree(layout.root)
        print(f"removed {layout.root}")


def stack_status(layout: StackLayout, *, as_json: bool) -> int:
    recorded = {s.name: s for s in processes.recorded(layout.run)}
    report = {"stack_dir": str(layout.root), "services": {}}
    for name in SERVICES:
        service = recorded.get(name)
        report["services"][name] = {"running": bool(service and service.alive()),
                                    "pid": service.pid if service else None,
                                    "log": str(layout.logs / f"{name}.log")}
    if layout.info_file.exists():
        info = json.loads(layout.info_file.read_text())
        report.update({k: info[k] for k in ("api_url", "mlflow_url", "s3_endpoint")})
        try:
            import requests

            report["airflow_health"] = requests.get(f"{info['api_url']}/api/v2/monitor/health", timeout=5).json()
        except Exception as exc:  # noqa: BLE001
            report["airflow_health"] = f"unreachable: {exc}"
        try:
            report["celery_workers"] = sorted(_celery_ping(StackSettings.load(layout)))
        except Exception as exc:  # noqa: BLE001
            report["celery_workers"] = f"unreachable: {exc}"
    running = sum(s["running"] for s in report["services"].values())
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(f"stack {layout.root}: {running} of {len(SERVICES)} services running")
        for name, state in report["services"].items():
            print(f"  {name:24} {'running' if state['running'] else 'stopped':8} {state['log']}")
        for key in ("api_url", "mlflow_url", "s3_endpoint", "celery_workers"):
            if key in report:
                print(f"  {key}: {report[key]}")
    return 0 if running == len(SERVICES) else 3


def print_summary(info: dict) -> None:
    users = info["airflow_users"]
    mlflow = info["mlflow_users"]
    print(f"""
  Airflow UI/API  {info['api_url']}   admin / {users['admin']['password']}   viewer / {users['viewer']['password']}
  MLflow          {info['mlflow_url']}   admin / {mlflow['admin']['password']}   (pipeline, reader: see stack.json)
  S3 (SeaweedFS)  {info['s3_endpoint']}   buckets {', '.join(info['buckets'].values())}
  Celery workers  {', '.join(w['hostname'] for w in info['workers'])}   broker {info['broker_url']}
  Everything else (keys, pids, logs): {info['stack_dir']}/stack.json (mode 0600)
  Logs: {info['logs']}/      Stop: make stack-down   (data too: make stack-down STACK_ARGS=--wipe)
""".rstrip() + "\n")


def _int_env(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


if __name__ == "__main__":
    sys.exit(main())
