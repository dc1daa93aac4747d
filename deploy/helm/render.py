#!/usr/bin/env python3
"""Render onnxcast's Helm values with the official Apache Airflow chart, offline.

    python deploy/helm/render.py CHART_DIR deploy/helm/values-celery.yaml [--out manifests.yaml]

CHART_DIR is an unpacked official chart (`helm pull apache-airflow/airflow --untar`, or the
chart/ folder of apache/airflow). The chart depends on Bitnami's postgresql chart for its
optional bundled database; helm refuses to render while that dependency is missing from
charts/, even with `postgresql.enabled: false` (seen with helm 4.1.4). onnxcast uses an
external PostgreSQL, so this renders a temporary copy of the chart whose Chart.yaml lists no
dependencies (and no Chart.lock); the chart itself is not changed. helm validates the values
against the chart's values.schema.json while rendering. The helm binary: $ONNXCAST_HELM, else
`helm` on PATH (deploy/helm/install-helm.sh installs one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

RELEASE = "onnxcast"
NAMESPACE = "onnxcast"


def helm_binary() -> str | None:
    return os.environ.get("ONNXCAST_HELM") or shutil.which("helm")


def render(chart: Path, values: list[Path], helm: str | None = None) -> str:
    """The manifests `helm template` makes of ``chart`` with ``values`` (raises RenderError)."""
    helm = helm or helm_binary()
    if helm is None:
        raise RenderError("no helm binary: set ONNXCAST_HELM or run deploy/helm/install-helm.sh")
    if not (chart / "Chart.yaml").is_file():
        raise RenderError(f"{chart}: not a Helm chart (no Chart.yaml)")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / chart.name
        shutil.copytree(chart, copy, ignore=shutil.ignore_patterns("charts", "Chart.lock", "tests", "docs"))
        meta = yaml.safe_load((copy / "Chart.yaml").read_text())
        meta.pop("dependencies", None)
        (copy / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
        command = [helm, "template", RELEASE, str(copy), "--namespace", NAMESPACE]
        for path in values:
            command += ["--values", str(path)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RenderError(f"helm template failed (exit {result.returncode}): {result.stderr.strip()[-2000:]}")
    return result.stdout


class RenderError(RuntimeError):
    """helm is missing, the chart is not one, or helm refused the values."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chart", type=Path)
    parser.add_argument("values", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, help="write the manifests here instead of stdout")
    args = parser.parse_args(argv)
    try:
        manifests = render(args.chart, args.values)
    except RenderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.out:
        args.out.write_text(manifests)
        kinds = [d.get("kind") for d in yaml.safe_load_all(manifests) if d]
        print(f"wrote {args.out}: {len(kinds)} objects")
    else:
        sys.stdout.write(manifests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
