"""Start Airflow for local use with the project's settings: `airflow standalone` (API server
with the UI, scheduler, triggerer, DAG processor) on SQLite under $ONNXCAST_HOME/airflow.

    make airflow            # then http://127.0.0.1:8080 (user admin; the password is printed,
                            # and kept in $ONNXCAST_HOME/airflow/simple_auth_manager_passwords.json.generated)
    AIRFLOW__API__PORT=8090 make airflow     # another port: the tasks follow it

The MLflow UI runs separately: .venv/bin/mlflow ui --backend-store-uri sqlite:///$ONNXCAST_HOME/mlflow/mlflow.db
and the "MLflow run" button of every task points at http://127.0.0.1:5000 (ONNXCAST_MLFLOW_UI_URL
or the ui_url extra of the mlflow_default connection to change it).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import airflow_env  # noqa: E402

# Airflow 3.3.2's log servers (the scheduler's for LocalExecutor tasks, the triggerer's) bind
# every interface (airflow.utils.serve_logs.core passes host="" to uvicorn; no setting changes
# it). On one machine the API server reads the task logs from the shared log folder, so
# `make airflow` runs neither, as `make stack` does (docs/stack.md).
SKIP_LOG_SERVER = {"scheduler": "--skip-serve-logs", "triggerer": "--skip-serve-logs"}


def execution_api_url(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """The execution API URL the tasks must call, from the API server's host and port; None
    when the user set it (or a base URL, which Airflow derives it from) themselves.

    Airflow 3.3.2 defaults `[core] execution_api_server_url` to http://localhost:8080/execution/
    whatever `[api] port` says: with AIRFLOW__API__PORT alone every task failed with
    httpx.ConnectError, its log showing only "Pre Execute".
    """
    from airflow.configuration import conf

    if conf.get("core", "execution_api_server_url", fallback=None) or conf.get("api", "base_url", fallback=None):
        return None
    host = conf.get("api", "host", fallback="127.0.0.1") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: loopback reaches it
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{conf.getint('api', 'port', fallback=8080)}/execution/"


def main() -> int:
    env = airflow_env.configure()
    airflow = Path(sys.executable).with_name("airflow")
    if not airflow.exists():
        airflow = Path(shutil.which("airflow") or "airflow")
    url = execution_api_url()
    if url:
        # the standalone's components inherit this environment
        os.environ["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = url
    print(f"ONNXCAST_HOME={env['ONNXCAST_HOME']}\nAIRFLOW_HOME={env['AIRFLOW_HOME']}\n"
          f"AIRFLOW_CONFIG={env['AIRFLOW_CONFIG']}\n"
          f"execution API: {os.environ.get('AIRFLOW__CORE__EXECUTION_API_SERVER_URL') or 'from [api] base_url'}",
          flush=True)
    # standalone starts its components as `airflow ...` subprocesses: the venv must be on PATH
    os.environ["PATH"] = os.pathsep.join([str(airflow.parent), os.environ.get("PATH", "")])
    # The DAGs start paused (dags_are_paused_at_creation): unpause onnxcast_training in the UI
    # to let the weekly schedule run it.
    run_standalone()
    return 0


def run_standalone() -> None:
    """`airflow standalone`, its scheduler and triggerer started without their log servers."""
    from airflow.cli.commands import standalone_command

    class SubCommand(standalone_command.SubCommand):
        def __init__(self, parent, name: str, command: list[str], env: dict[str, str]) -> None:
            extra = [SKIP_LOG_SERVER[name]] if name in SKIP_LOG_SERVER else []
            super().__init__(parent, name=name, command=[*command, *extra], env=env)

    # standalone builds its subcommands in run() from this module-level name; 3.3.2 offers no
    # option to pass flags to them
    standalone_command.SubCommand = SubCommand
    standalone_command.StandaloneCommand().run()


if __name__ == "__main__":
    sys.exit(main())
