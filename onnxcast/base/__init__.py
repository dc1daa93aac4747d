"""The base layer: errors, the ONNX model contract, S3 access, file helpers and bounded
reading of untrusted input. Standard library at import (boto3, and onnx where it is
installed, inside functions): the device distribution ships it, and every other layer
builds on it."""
