"""CSV that a spreadsheet may open: text cells that cannot run as formulas.

Excel, LibreOffice and Google Sheets evaluate a cell that starts with ``=``, ``+``, ``-`` or
``@`` as a formula (``=cmd|' /C calc'!A0``, ``@SUM(...)``, ``=HYPERLINK(...)``), and tab or
carriage return first can hide such a start from a quick look. Every text cell onnxcast
writes to CSV from values it did not make (series ids, column names, versions) goes through
:func:`text_cell`, which prefixes such a cell with a single quote, as the OWASP CSV-injection
guidance recommends; a spreadsheet shows the quote-less text and never evaluates it.

Numbers are written as numbers (a negative forecast stays ``-1.5``, parseable), and a text
cell that is a plain decimal number (an id ``-7``) is left as it is: no spreadsheet
evaluates one. Standard library only: the device distribution ships this module.
"""

from __future__ import annotations

import re

# OWASP "CSV Injection": cells starting with these are formulas (or hide one) in spreadsheets.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# A cell that is only a decimal number is a number to every spreadsheet, never a formula.
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def text_cell(value: object) -> str:
    """``value`` as a CSV text cell that no spreadsheet runs as a formula: ``str(value)``,
    prefixed with ``'`` when it starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
    return (and is not a plain decimal number). ``None`` is the empty cell."""
    if value is None:
        return ""
    text = str(value)
    if text.startswith(FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text
