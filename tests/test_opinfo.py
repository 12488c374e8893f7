"""Conformance with PyTorch's OpInfo database, through the sweep in
``torch_jax.report._sweep``: every sample input of an OpInfo runs on jax and on CPU and
must agree (values, dtype, shape), in-place and ``out=`` variants too, and gradients in
float32/float64.

The CPU fallback is allowed here, but only for ops declared as fallbacks (with a reason)
in the lowering table: an op that falls back without being declared fails the test.
Every exclusion sits in ``_sweep.EXCLUDED`` with its reason; random ops are compared by
shape, dtype and statistics (``_sweep.RANDOM``).

The full sweep (every OpInfo x the nine dtypes x every sample, with variants and
gradients) takes over an hour on two cores, so by default CI runs a fixed share:

- float32: every OpInfo, up to 2 samples each, outputs only;
- the other eight dtypes, in-place/out= variants and gradients: a fixed ~1/48 of the
  (OpInfo, dtype) pairs, chosen by a hash of the pair's name (the same pairs every run),
  with up to 2 samples each.

In fused eager (``TORCH_JAX_MODE=fused``, CI's second run) the default share is a fixed
~1/96 of all (OpInfo, dtype) pairs, each with variants and gradients: every sample then
runs as recorded graphs, which compile more slowly than single ops. ``TORCH_JAX_OPINFO=small``
runs that share in either mode (CI's runs on the other torch versions, and
benchmarks/accelerator_check.sh).

``TORCH_JAX_OPINFO=full python -m pytest tests/test_opinfo.py`` runs the whole sweep;
``python -m torch_jax.report coverage`` runs it too and writes docs/COVERAGE.md.
"""

from __future__ import annotations

import itertools
import os
import zlib

import pytest
import torch

import torch_jax
from torch_jax.report import _sweep

OPINFO = os.environ.get("TORCH_JAX_OPINFO", "share")
if OPINFO not in ("share", "small", "full"):
    raise ValueError(f"TORCH_JAX_OPINFO={OPINFO!r}: expected share, small or full")
FULL = OPINFO == "full"
SHARE = 48  # one (OpInfo, dtype) pair in SHARE runs fully in the default (CI) share
SMALL = OPINFO == "small" or (torch_jax.config.mode == "fused" and not FULL)
SMALL_SHARE = 96  # (a multiple of SHARE: its pairs are among the strict run's thorough ones)


def _in_share(name: str, dtype, share: int = SHARE) -> bool:
    return zlib.crc32(f"{name}/{dtype}".encode()) % share == 0


def _selected(name: str, dtype) -> bool:
    if FULL:
        return True
    if SMALL:
        return _in_share(name, dtype, SMALL_SHARE)
    return dtype == torch.float32 or _in_share(name, dtype)


def _family(name: str) -> str:
    """aten::add_.Tensor -> aten::add"""
    return name.split(".")[0].rstrip("_")


def _dtype_id(dtype) -> str:
    return str(dtype).replace("torch.", "")


PAIRS = [
    pytest.param(op, dtype, id=f"{_sweep.name_of(op)}-{_dtype_id(dtype)}")
    for op in _sweep.opinfos()
    for dtype in _sweep.DTYPES
    if _sweep.supported(op, dtype) and _selected(_sweep.name_of(op), dtype)
]


@pytest.mark.parametrize("op, dtype", PAIRS)
def test_opinfo(op, dtype):
    from torch_jax.ops._registry import DECLARED_FALLBACKS

    thorough = FULL or SMALL or _in_share(_sweep.name_of(op), dtype)
    result = _sweep.check(
        op,
        dtype,
        max_samples=None if FULL else 2,
        grads=thorough,
        variants=thorough,
        fallback="silent",
    )
    if result.status == "skip":
        pytest.skip(result.message)
    assert result.status == "pass", result.message
    assert result.samples > 0
    # a declared op declares its in-place and out= variants too
    declared = {_family(op._schema.name) for op in DECLARED_FALLBACKS}
    undeclared = sorted(name for name in result.fallback_ops if _family(name) not in declared)
    assert not undeclared, f"ops ran through the CPU fallback without being declared: {undeclared}"


# Samples past CI's share at which the every-sample sweep (python -m torch_jax.report
# coverage) found a difference, rerun in every CI run: (OpInfo, dtype, sample index,
# gradient check)
SWEEP_FINDINGS = [
    ("histogram", torch.float32, 160, False),  # empty input: the bin edges span [0, 1]
    ("histogramdd", torch.float64, 72, False),
    ("nonzero_static", torch.int64, 51, False),  # empty input: every row is fill_value
    # the rest are float rounding, at the tolerance TOLERANCE in _sweep gives with its reason
    ("nn.functional.kl_div", torch.bfloat16, 3, False),
    ("fft.hfft2", torch.complex64, 5, False),
    ("svd", torch.float32, 208, True),
    ("linalg.eig", torch.float32, 4, True),
    ("linalg.householder_product", torch.float32, 7, True),
    ("linalg.multi_dot", torch.float32, 6, True),
    ("masked.normalize", torch.float32, 22, True),
]


@pytest.mark.parametrize("name, dtype, index, grad", SWEEP_FINDINGS, ids=lambda v: str(v).replace("torch.", ""))
def test_sweep_finding(name, dtype, index, grad):
    op = next(o for o in _sweep.opinfos() if _sweep.name_of(o) == name)
    torch.manual_seed(67280421310721)  # PyTorch's default seed: the samples a fresh process makes
    sample = next(itertools.islice(op.sample_inputs("jax", dtype, requires_grad=grad), index, None))
    where = f"{name} {_dtype_id(dtype)} sample {index}"
    if grad:
        _sweep._check_grads(op, dtype, sample, where=where, tol=_sweep.TOLERANCE.get((name, dtype)))
    else:
        _sweep.check_sample(op, dtype, sample, name=name, index=index, variants=True)
