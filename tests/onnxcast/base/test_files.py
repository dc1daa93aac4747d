"""JSON-safe values (onnxcast.base.files): NaN and infinities become null, numpy scalars Python's."""

from __future__ import annotations

import json
import math

import numpy as np

from onnxcast.base.files import finite_or_none, json_safe


def test_json_safe_nulls_what_strict_json_has_no_word_for():
    value = {"mase": np.float32(1.5), "count": np.int64(3), "ok": np.bool_(True), "nan": float("nan"),
             "ci": (np.float64(-np.inf), 2.0), "nested": [{"x": np.float64(np.nan)}], "name": "fp32", "none": None}
    safe = json_safe(value)
    assert safe == {"mase": 1.5, "count": 3, "ok": True, "nan": None, "ci": [None, 2.0], "nested": [{"x": None}],
                    "name": "fp32", "none": None}
    assert type(safe["count"]) is int and type(safe["ok"]) is bool
    json.dumps(safe, allow_nan=False)


def test_finite_or_none():
    assert finite_or_none(np.float32(2.5)) == 2.5 and finite_or_none("3") == 3.0
    assert finite_or_none(math.nan) is None and finite_or_none(-np.inf) is None
