"""Environment for running the project's Airflow on one machine (demo, UI, tests).

Airflow reads its settings when ``airflow`` is first imported, so :func:`configure` must
run before that. It points Airflow at the repository's ``airflow.cfg`` (AIRFLOW_CONFIG)
and keeps all state under ``$ONNXCAST_HOME/airflow`` (AIRFLOW_HOME): SQLite metadata DB,
logs, generated passwords. The operators come from the installed onnxcast provider
(``onnxcast.airflow``): no PYTHONPATH.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from onnxcast.base.files import onnxcast_home

REPO = Path(__file__).resolve().parent.parent


def configure(home: str | Path | None = None) -> dict[str, str]:
    """Set the environment variables for Airflow and onnxcast; returns what it set."""
    home = onnxcast_home(home, default=REPO / ".onnxcast")
    airflow_home = home / "airflow"
    airflow_home.mkdir(parents=True, exist_ok=True)
    values = {
        "ONNXCAST_HOME": str(home),
        "ONNXCAST_REPO": str(REPO),
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW_CONFIG": str(REPO / "airflow.cfg"),
        # no telemetry calls from a machine that may have no internet
        "SCARF_ANALYTICS": "false",
        "DO_NOT_TRACK": "true",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }
    os.environ.update(values)
    # Airflow 3 components authenticate task API calls with a JWT: scheduler/executor and
    # API server must share the secret, or every task fails with "Signature verification
    # failed". Without a configured one each process would invent its own.
    for variable, filename in (("AIRFLOW__API_AUTH__JWT_SECRET", "jwt_secret"),
                               ("AIRFLOW__API__SECRET_KEY", "api_secret_key")):
        if not os.environ.get(variable):
            os.environ[variable] = _local_secret(airflow_home / filename)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return values


def _local_secret(path: Path) -> str:
    """A random secret kept in ``path`` (mode 0600) so every process of this home shares it."""
    import secrets

    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def init_db() -> None:
    """Create or upgrade the Airflow metadata DB (``airflow db migrate``), in this process."""
    from airflow import settings
    from airflow.utils import db

    settings.configure_orm()
    db.upgradedb()
