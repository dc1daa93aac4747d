"""onnxcast in the Airflow UI: the "MLflow run" extra link on every onnxcast task.

In Airflow 3 a task computes its links when it finishes and stores them as XComs; the
API server serves them from there. Registering the link class here keeps it known to
Airflow's plugin registry (``airflow plugins``). It names no ``operators``: the onnxcast
operators declare the link themselves, and a plugin link attached to them would replace
the XCom-backed link that the API server reads.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from operators.links import MlflowRunLink


class OnnxcastPlugin(AirflowPlugin):
    name = "onnxcast"
    operator_extra_links = [MlflowRunLink()]
