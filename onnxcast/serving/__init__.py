"""The cloud inference service: ``onnxcast serve`` follows a rollout channel (verified pulls
through :mod:`onnxcast.rollout.edge`), swaps versions atomically, batches concurrent requests into one
ONNX Runtime call, and speaks the Open Inference Protocol (KServe V2) over HTTP.

Modules: ``protocol`` (V2 request/response codec and validation), ``model`` (loading a
verified model, following the channel), ``batching`` (adaptive batching), ``app`` (the HTTP
service and its metrics), ``repository`` (Triton / KServe model repository layout),
``cli`` (the ``serve`` command). See docs/serving.md.
"""
