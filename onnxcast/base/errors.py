"""Typed errors. Each carries a one-line message that names the file, column or value at fault."""

from __future__ import annotations


class OnnxcastError(Exception):
    """Base class: the CLI prints ``str(error)`` on one line and exits non-zero."""


class ConfigError(OnnxcastError, ValueError):
    """A setting is missing, of the wrong type or out of range."""


class DataError(OnnxcastError, ValueError):
    """The input file cannot be read as the time series the settings describe."""


class DataQualityError(DataError):
    """The data was read but failed one or more quality checks."""

    def __init__(self, source: str, failures: list[str], report_path: str | None = None):
        self.source = source
        self.failures = list(failures)
        self.report_path = report_path
        detail = "; ".join(failures)
        super().__init__(f"{source}: {len(failures)} data check(s) failed: {detail}")


class ExportError(OnnxcastError):
    """The model could not be exported to a valid ONNX graph."""


class GateError(OnnxcastError):
    """A validation gate failed (parity, accuracy, baseline)."""

    def __init__(self, failures: list[str]):
        self.failures = list(failures)
        super().__init__("validation gate(s) failed: " + "; ".join(failures))


class StoreError(OnnxcastError):
    """The rollout store refused or failed an operation."""


class ConflictError(StoreError):
    """Another writer moved a channel pointer or wrote a version first."""


class VerificationError(StoreError):
    """Downloaded bytes or an ONNX signature do not match the manifest."""


class RefusedError(VerificationError):
    """Release metadata is not trusted: unsigned, wrongly signed, expired, replayed, older
    than what the device verified, or a file differs from its signed length or digest."""
