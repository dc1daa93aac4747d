"""The base layer: errors, the ONNX model contract, S3 access, file helpers and bounded
reading of untrusted input. Standard library (and boto3, lazily) only: the device
distribution ships it, and every other layer builds on it."""
