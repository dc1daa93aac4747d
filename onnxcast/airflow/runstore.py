"""The run store's backend for URLs of filesystems an Airflow provider registers (gs://,
abfs://, ...): Airflow's ObjectStoragePath, with the task's connection for credentials."""

from __future__ import annotations

from onnxcast.runstore import RunStoreError


def object_storage_backend(url: str, conn_id: str | None = None) -> ObjectStorageBackend:
    """:class:`ObjectStorageBackend` for ``url``; RunStoreError if no filesystem serves its scheme."""
    try:
        return ObjectStorageBackend(url, conn_id=conn_id)
    except ValueError as exc:  # no filesystem registered for the scheme
        raise RunStoreError(f"{url}: {exc}; use s3://, a local folder (embedded mode), or install the Airflow "
                            "provider that registers this filesystem") from None


class ObjectStorageBackend:
    """Any URL fsspec understands, through Airflow's ObjectStoragePath (``conn_id`` for credentials)."""

    def __init__(self, url: str, conn_id: str | None = None) -> None:
        from airflow.sdk import ObjectStoragePath

        self.base = ObjectStoragePath(url, conn_id=conn_id)

    def read(self, key: str) -> bytes:
        path = self.base / key
        if not path.exists():
            raise FileNotFoundError(str(path))
        return path.read_bytes()

    def write(self, key: str, data: bytes) -> None:
        path = self.base / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            f.write(data)

    def list(self, prefix: str) -> list[str]:
        base = self.base / prefix if prefix else self.base
        if not base.exists():
            return []
        root = str(self.base).rstrip("/") + "/"
        return sorted(str(p)[len(root):] for p in base.rglob("*") if p.is_file())

    def url(self, key: str = "") -> str:
        return str(self.base / key) if key else str(self.base)
