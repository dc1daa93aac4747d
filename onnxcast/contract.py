"""Moved to :mod:`onnxcast.rollout.contract`: this alias keeps old imports (and patches) working."""

import sys

from onnxcast.rollout import contract as _module

sys.modules[__name__] = _module
