"""The rollout: the store, its signed release metadata, the device client and the writer.

The device's modules (``store``, ``signing``, ``trust``, ``device``, ``edge``, ``command``,
``cli``) import only :mod:`onnxcast.base`, the standard library, numpy, onnxruntime, boto3
and the crypto libraries (securesystemslib, tuf, cryptography), so they install without
torch, Airflow, MLflow or Great Expectations (``pip install ./distributions/edge``,
docs/rollout-security.md). The writer's ``promote`` and ``repository`` (the Triton model
repository of the cloud channel) stay out of the device distribution.
"""
