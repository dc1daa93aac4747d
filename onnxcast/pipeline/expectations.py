"""Great Expectations glue of the data checks: one place that imports GX quietly, runs a
suite on a frame, words each check's outcome in one line and writes the JSON and HTML reports.

Used by the one-series data gate (onnxcast.pipeline.quality), the fleet data gate
(onnxcast.pipeline.fleet_quality) and the monitor's drift suite. Helper columns (``HELPER``
prefix) hold the offending raw value of a row and are hidden from the messages; header fields
that may not be shown are renamed ``<field N>`` (``HIDDEN``, quality.hide_unnamed_columns).

great_expectations is imported inside functions: Airflow operators import the data gates when
a DAG file is parsed.
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any

from onnxcast.base.files import write_text_atomic
from onnxcast.base.untrusted import quote

RESULT_JSON = "validation_result.json"
REPORT_HTML = "quality_report.html"
HELPER = "_qc_"
HIDDEN = "<field "  # a header field not shown: "<field 2>" (see quality.hide_unnamed_columns)
OFFLINE_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1rem 2rem;max-width:1400px}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #d0d7de;padding:4px 8px;vertical-align:top;text-align:left}
.fa-check-circle::before{content:"\\2714  passed";color:#1a7f37}
.fa-times::before{content:"\\2718  FAILED";color:#cf222e;font-weight:700}
.fa-exclamation-triangle::before{content:"\\26A0  error";color:#9a6700;font-weight:700}
.fa-check-circle::before,.fa-times::before,.fa-exclamation-triangle::before{font-family:system-ui,sans-serif!important;font-style:normal}
tr:has(.fa-times){background:#fff0f0}
#onnxcast-summary{border:3px solid #cf222e;background:#fff5f5;padding:.5rem 1.5rem;margin:1rem 0 2rem}
#onnxcast-summary.passed{border-color:#1a7f37;background:#f3fff5}
#onnxcast-summary h1{font-size:1.6rem}#onnxcast-summary h2{font-size:1.2rem}
footer,.navbar-brand{display:none}
"""


def import_gx():
    """great_expectations, imported without its import-time log lines."""
    # GX logs an INFO line per decorated closure on first import ("Skipping registering
    # function ..."): dozens of lines in every Airflow task log.
    logging.getLogger("great_expectations._docs_decorators").setLevel(logging.WARNING)
    import great_expectations

    return great_expectations


@contextlib.contextmanager
def quiet_gx():
    """No GX progress bars (set in the context config) and no GX log lines, restored afterwards.

    GX logs renderer trouble as errors with a traceback; the CLI promises none on stderr.
    """
    import warnings

    logger = logging.getLogger("great_expectations")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def run_suite(frame, suite, result_format: str | dict = "SUMMARY"):
    """Validate ``frame`` as one whole-dataframe batch in an ephemeral GX context.
    ``result_format``: GX's; the fleet gate asks for COMPLETE with the series column as the
    index column, so every failing series is named."""
    gx = import_gx()
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
        analytics_enabled=False,
    )
    context = gx.get_context(project_config=config, mode="ephemeral")
    batch = (context.data_sources.add_pandas("onnxcast")
             .add_dataframe_asset("input")
             .add_batch_definition_whole_dataframe("whole"))
    suite = context.suites.add(suite)
    definition = gx.ValidationDefinition(name="onnxcast-data", data=batch, suite=suite)
    return definition.run(batch_parameters={"dataframe": frame}, result_format=result_format)


def named_check(expectation, check: str, description: str, hint: str = "", column: str | None = None,
                observed: str | None = None):
    """Name a check. ``observed`` words an aggregate's observed value, e.g. "longest {} steps"."""
    expectation.description = description
    expectation.meta = {"check": check, "column": column, "hint": hint, "observed": observed}
    return expectation


def summarize(result) -> dict:
    """One check as plain JSON: what was expected, what was observed, and a one-line message."""
    config = result.expectation_config
    meta = config.meta or {}
    kwargs = config.kwargs
    severity = getattr(config.severity, "value", str(config.severity))
    observed = _observed(result.result, kwargs)
    message = None
    if not result.success:
        if result.exception_info and result.exception_info.get("raised_exception"):
            detail = "could not be evaluated: " + str(result.exception_info.get("exception_message"))[:200]
        else:
            detail = _describe(result.result, kwargs, config.type, meta.get("observed"))
        message = f"{config.description}: {detail}{meta.get('hint', '')}"
    threshold = {k: _plain(kwargs[k]) for k in ("min_value", "max_value", "mostly") if kwargs.get(k) is not None}
    return {"check": meta.get("check", config.type), "column": meta.get("column"),
            "description": config.description, "expectation": config.type, "severity": severity,
            "passed": bool(result.success), "observed": observed, "threshold": threshold,
            "message": message}


def write_reports(validation, out_dir: Path, summary: str = "") -> tuple[Path, Path]:
    """Write the GX validation result (JSON) and its data-docs page (HTML), each atomically.

    The page is GX's validation page (the renderer its data-docs site builder uses) with
    ``summary`` on top and a small inline stylesheet: GX styles come from CDNs, and an
    offline browser (an Airflow worker, MLflow's artifact view behind a firewall) would
    otherwise show no pass/fail marks at all.
    """
    import json

    from great_expectations.render.renderer import ValidationResultsPageRenderer
    from great_expectations.render.view import DefaultJinjaPageView

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out_dir / RESULT_JSON, out_dir / REPORT_HTML
    for result in validation.results:  # GX's renderer fails on numpy 2 scalars (repr "np.float64(1.0)")
        result.result = _python_scalars(result.result)
    page = DefaultJinjaPageView().render(ValidationResultsPageRenderer().render(validation))
    page = page.replace("</head>", f"<style>{OFFLINE_CSS}</style></head>", 1)
    page = page.replace("<body>", f"<body>{summary}", 1)
    write_text_atomic(html_path, page)
    write_text_atomic(json_path, json.dumps(validation.to_json_dict(), indent=2, default=str))
    return json_path, html_path


def summary_html(source: str, checks: list[dict]) -> str:
    """The verdict first: failed checks, then tolerated warnings, in the words of the error."""
    from html import escape

    failed = [c["message"] for c in checks if not c["passed"] and c["severity"] == "critical"]
    warned = [c["message"] for c in checks if not c["passed"] and c["severity"] != "critical"]
    verdict = f"FAILED: {len(failed)} check(s) failed" if failed else "PASSED"
    parts = [f'<section id="onnxcast-summary" class="{"failed" if failed else "passed"}">',
             f"<h1>onnxcast data quality: {escape(verdict)}</h1>", f"<p>File: <code>{escape(source)}</code></p>"]
    for title, items in (("Failed checks", failed), ("Warnings (tolerated)", warned)):
        if items:
            parts.append(f"<h2>{title}</h2><ol>" + "".join(f"<li>{escape(m)}</li>" for m in items) + "</ol>")
    parts.append("<p>Checks of severity <em>warning</em> are tolerated: the table below marks them failed "
                 "when they found something. Columns named <code>_qc_*</code> are helpers computed from "
                 "the file (see docs/data-quality.md).</p></section>")
    return "".join(parts)


def clip(value: Any, limit: int = 60) -> Any:
    """``value`` as text of at most ``limit`` characters (a message quotes a bad value, never a whole cell)."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- wording a check's outcome ---------------------------------------------------------------

def _observed(result: dict, kwargs: dict) -> Any:
    if "observed_value" in result:
        value = result["observed_value"]
        if isinstance(value, list):
            return [v for v in value if not str(v).startswith(HELPER)]
        return _plain(value)
    if "unexpected_count" in result:
        return {"unexpected_count": int(result["unexpected_count"]),
                "unexpected_percent": _plain(result.get("unexpected_percent")),
                "examples": [_show(v) for v in result.get("partial_unexpected_list", [])[:5]],
                "rows": [int(i) + 1 for i in result.get("partial_unexpected_index_list", [])[:5]]}
    return None


def _describe(result: dict, kwargs: dict, kind: str, observed: str | None = None) -> str:
    """The observation behind a failure, in words."""
    if kind == "expect_table_columns_to_match_set":
        observed = [str(c) for c in result.get("observed_value", []) if not str(c).startswith(HELPER)]
        missing = result.get("details", {}).get("mismatched", {}).get("missing", [])
        found = [c for c in observed if not c.startswith(HIDDEN)]
        hidden = len(observed) - len(found)
        listed = "[" + ", ".join(quote(c) for c in found[:12]) + (f", ... {len(found) - 12} more" if len(found) > 12 else "") + "]"
        text = f"missing {missing}; found {listed}" if found else f"missing {missing}"
        if hidden == len(observed):
            text += (f"; the first line is not a header of column names ({hidden} field(s) that look like data "
                     "or other text, not shown): is the header row missing, or is this not the data file?")
        elif hidden:
            text += f" and {hidden} field(s) that do not look like column names (not shown)"
        return text
    if "unexpected_count" in result:
        count, total = int(result["unexpected_count"]), int(result.get("element_count", 0))
        text = f"{count} of {total} rows"
        if kwargs.get("mostly") is not None:
            text += f" ({result.get('unexpected_percent') or 0:.2f}%)"
        examples = list(dict.fromkeys(_show(v) for v in result.get("partial_unexpected_list", []) if not _is_nan(v)))
        if examples:
            text += ", e.g. " + ", ".join(map(str, examples[:3]))
        rows = [int(i) + 1 for i in result.get("partial_unexpected_index_list", [])[:3]]
        if rows:
            text += f" (row {', '.join(map(str, rows))}{', ...' if count > len(rows) else ''})"
        return text
    if result.get("observed_value") is None:
        return "nothing to measure (no complete rows)"
    if observed:
        return observed.format(_plain(result["observed_value"]))
    bounds = [f"{word} {_plain(kwargs[key])}" for key, word in (("min_value", ">="), ("max_value", "<="))
              if kwargs.get(key) is not None]
    return f"observed {_plain(result.get('observed_value'))}, expected {' and '.join(bounds)}"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(clip(value))
    value = _plain(value)
    return format(value, ".6g") if isinstance(value, float) else clip(value)


def _plain(value: Any) -> Any:
    """Numbers and timestamps as JSON-safe Python values."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    return value


def _python_scalars(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _python_scalars(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_python_scalars(v) for v in value]
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    return value


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)
