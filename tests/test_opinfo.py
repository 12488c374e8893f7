"""Conformance with PyTorch's OpInfo database: every OpInfo's float32 sample inputs run
on jax and on CPU and must agree (values, dtype, shape), through the sweep in
``torch_jax.report._sweep``. The CPU fallback is allowed here (ops without a lowering
run on the CPU and still must agree). Every exclusion sits in ``_sweep.EXCLUDED`` with
its reason; random ops are compared by shape and dtype (``_sweep.RANDOM``).
"""

from __future__ import annotations

import pytest
import torch

from torch_jax.report import _sweep

OPS = [op for op in _sweep.opinfos() if _sweep.supported(op, torch.float32)]


@pytest.mark.parametrize("op", OPS, ids=_sweep.name_of)
def test_opinfo_float32(op):
    result = _sweep.check(op, torch.float32, grads=False, variants=False, fallback="silent")
    if result.status == "skip":
        pytest.skip(result.message)
    assert result.status == "pass", result.message
    assert result.samples > 0
