"""Start Airflow for local use with the project's settings: `airflow standalone` (API server
with the UI, scheduler, triggerer, DAG processor) on SQLite under $ONNXCAST_HOME/airflow.

    make airflow            # then http://127.0.0.1:8080 (user admin; the password is printed,
                            # and kept in $ONNXCAST_HOME/airflow/simple_auth_manager_passwords.json.generated)

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


def main() -> int:
    env = airflow_env.configure()
    airflow = Path(sys.executable).with_name("airflow")
    if not airflow.exists():
        airflow = Path(shutil.which("airflow") or "airflow")
    print(f"ONNXCAST_HOME={env['ONNXCAST_HOME']}\nAIRFLOW_HOME={env['AIRFLOW_HOME']}\n"
          f"AIRFLOW_CONFIG={env['AIRFLOW_CONFIG']}", flush=True)
    # standalone starts its components as `airflow ...` subprocesses: the venv must be on PATH
    os.environ["PATH"] = os.pathsep.join([str(airflow.parent), os.environ.get("PATH", "")])
    # The DAGs start paused (dags_are_paused_at_creation): unpause onnxcast_training in the UI
    # to let the weekly schedule run it.
    os.execv(str(airflow), [str(airflow), "standalone"])
    return 1


if __name__ == "__main__":
    sys.exit(main())
