"""Moved to :mod:`onnxcast.rollout.promote`: this alias keeps old imports (and patches) working."""

import sys

from onnxcast.rollout import promote as _module

sys.modules[__name__] = _module
