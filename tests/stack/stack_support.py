"""Clients of the stack for the tests: the Airflow REST API with a user's token, S3 as one
identity, MLflow basic auth."""

from __future__ import annotations


class AirflowApi:
    """The Airflow REST API with a token of one user."""

    def __init__(self, info: dict, user: str = "admin") -> None:
        import requests

        self.url = info["api_url"]
        self.session = requests.Session()
        password = info["airflow_users"][user]["password"]
        response = self.session.post(f"{self.url}/auth/token", json={"username": user, "password": password},
                                     timeout=30)
        response.raise_for_status()
        self.session.headers["Authorization"] = f"Bearer {response.json()['access_token']}"

    def get(self, path: str, **kwargs):
        return self.session.get(self.url + path, timeout=30, **kwargs)

    def post(self, path: str, **kwargs):
        return self.session.post(self.url + path, timeout=30, **kwargs)

    def patch(self, path: str, **kwargs):
        return self.session.patch(self.url + path, timeout=30, **kwargs)


def s3_client(info: dict, identity: str | None):
    """boto3 S3 client of the stack as one identity (None: anonymous, unsigned requests)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    config = Config(retries={"max_attempts": 2}, request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    **({"signature_version": UNSIGNED} if identity is None else {}))
    keys = info["s3_keys"][identity] if identity else {"access_key": None, "secret_key": None}
    return boto3.client("s3", endpoint_url=info["s3_endpoint"], region_name=info["s3_region"], config=config,
                        aws_access_key_id=keys["access_key"], aws_secret_access_key=keys["secret_key"])


def mlflow_auth(info: dict, user: str) -> tuple[str, str]:
    entry = info["mlflow_users"][user]
    return entry["username"], entry["password"]


def live(info: dict) -> dict:
    """``stack.json`` as it is now: a restarted service (a fault drill's) has a new pid there."""
    import json
    from pathlib import Path

    return json.loads((Path(info["stack_dir"]) / "stack.json").read_text())


def mlflow_requests(info: dict, since: float, until: float | None = None) -> list[str]:
    """``"METHOD /path"`` of the requests the stack's MLflow server answered from ``since`` to
    ``until`` (Unix times, to the second: the access log of its uvicorn workers)."""
    import re
    import time
    from datetime import datetime
    from pathlib import Path

    until = time.time() if until is None else until
    access = re.compile(r'^(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d) .*"(GET|POST|PUT|PATCH|DELETE|HEAD) ([^ ?"]+)')
    found = []
    for line in Path(live(info)["processes"]["mlflow"]["log"]).read_bytes().decode(errors="replace").splitlines():
        match = access.match(line)
        if match:
            at = datetime.strptime(match.group(1), "%Y/%m/%d %H:%M:%S").timestamp()  # the server's local time
            if int(since) <= at <= until:
                found.append(f"{match.group(2)} {match.group(3)}")
    return found
