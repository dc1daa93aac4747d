"""The rollout: store, signed release metadata, promotion and the edge client.

Everything a device needs (``store``, ``signing``, ``edge``, ``contract``) imports only the
standard library, numpy, onnxruntime, boto3 and the crypto libraries (securesystemslib,
tuf, cryptography), so it installs without torch, Airflow, MLflow or Great Expectations
(``pip install ./distributions/edge``, docs/rollout-security.md).
"""
