"""onnxcast.base.csvcells.text_cell: the OWASP CSV-injection rule for text cells."""

from __future__ import annotations

import pytest

from onnxcast.base.csvcells import text_cell


@pytest.mark.parametrize("value, cell", [
    ("=cmd|' /C calc'!A0", "'=cmd|' /C calc'!A0"),
    ("@SUM(A1:A9)", "'@SUM(A1:A9)"),
    ("+1+1", "'+1+1"),
    ("-2+3", "'-2+3"),
    ("\t=1+1", "'\t=1+1"),
    ("\r=1+1", "'\r=1+1"),
    ("-", "'-"),
    ("-7", "-7"), ("+1.5e3", "+1.5e3"), ("-.5", "-.5"),  # plain numbers: no spreadsheet runs them
    ("meter-1", "meter-1"), ("a=b", "a=b"), ("", ""), (None, ""), (12, "12"), ("'=x", "'=x"),
])
def test_text_cell(value, cell):
    assert text_cell(value) == cell
