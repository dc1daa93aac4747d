"""MLflow's REST API as the tests meet a server with basic auth: register a model version as
one user, then try to move its `champion` alias as others."""

from __future__ import annotations

import uuid


def register_version(base: str, auth: tuple[str, str], prefix: str) -> tuple[str, str]:
    """Create a registered model, an experiment, a run and one version of the model, all as
    ``auth`` (a pipeline user). ``base`` ends in ``/api/2.0/mlflow``. Returns (name, version)."""
    import requests

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    created = requests.post(f"{base}/registered-models/create", json={"name": name}, auth=auth, timeout=30)
    assert created.status_code == 200, created.text
    experiment = requests.post(f"{base}/experiments/create", json={"name": name}, auth=auth, timeout=30)
    assert experiment.status_code == 200, experiment.text
    run = requests.post(f"{base}/runs/create", json={"experiment_id": experiment.json()["experiment_id"]},
                        auth=auth, timeout=30)
    assert run.status_code == 200, run.text
    info = run.json()["run"]["info"]
    version = requests.post(f"{base}/model-versions/create", auth=auth, timeout=30,
                            json={"name": name, "source": f"{info['artifact_uri']}/model", "run_id": info["run_id"]})
    assert version.status_code == 200, version.text
    return name, version.json()["model_version"]["version"]


def move_champion(base: str, auth: tuple[str, str], name: str, version: str) -> int:
    """Point `champion` of ``name`` at ``version`` as ``auth``; the HTTP status."""
    import requests

    return requests.post(f"{base}/registered-models/alias", auth=auth, timeout=30,
                         json={"name": name, "alias": "champion", "version": version}).status_code
