"""onnxcast: time-series forecasters from training to validated ONNX, edge and cloud.

The library never imports Airflow; heavy dependencies (torch, onnxruntime, mlflow,
pandas, great_expectations) are imported by the modules that need them, so importing
``onnxcast`` or ``onnxcast.pipeline.config`` stays cheap for DAG parsing.
"""

__version__ = "0.1.0"
