"""Test setup: two JAX CPU devices (jax:0 and jax:1), the CPU fallback as an error
unless a test allows it, and helpers that compare a jax result with the CPU oracle."""

from __future__ import annotations

import contextlib
import os

# before JAX is imported (torch_jax imports it on first use of the device)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# (no test writes the user's persistent compilation cache; tests/test_compile.py checks it in its own
# directory; CI turns it on in a directory of its own, shared by its stages: .ci/run)
os.environ.setdefault("TORCH_JAX_COMPILATION_CACHE", "0")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_jax  # noqa: E402

# (a pytest plugin may import torch, and with it torch_jax's settings, before this file runs)
torch_jax.config.compilation_cache = os.environ["TORCH_JAX_COMPILATION_CACHE"] != "0"


@contextlib.contextmanager
def config_as(**settings):
    """``torch_jax.config`` with ``settings`` inside the block, as before after it."""
    before = {name: getattr(torch_jax.config, name) for name in settings}
    for name, value in settings.items():
        setattr(torch_jax.config, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(torch_jax.config, name, value)


def fused_share(cases: list, every: int) -> list:
    """The cases a test file runs: all of them in strict mode, a fixed 1/``every`` of them
    in a run in fused mode (``TORCH_JAX_MODE=fused``), for test files whose cases run the
    same lowerings that fused eager records into graphs (CI's budget);
    ``TORCH_JAX_FUSED_SHARE=full`` runs all of them there too."""
    if torch_jax.config.mode != "fused" or os.environ.get("TORCH_JAX_FUSED_SHARE") == "full":
        return cases
    return cases[::every]


# the test files whose cases a fused run already shares out on their own terms (fused_share,
# test_opinfo's pairs, test_modules' samples, test_buckets' dtypes), and fused eager's own tests
_OWN_FUSED_SHARE = {
    "test_buckets.py", "test_convolutions.py", "test_fused.py", "test_modules.py", "test_nested.py", "test_opinfo.py",
    "test_sparse.py",
}  # fmt: skip


@pytest.hookimpl(trylast=True)  # (after -k and --deselect: every other test of those selected)
def pytest_collection_modifyitems(config, items):
    """A run in fused mode runs every other test of each file, in collection order (the first,
    the third, ...), but for the files in _OWN_FUSED_SHARE: the strict run has all of them,
    and fused eager records the same lowerings (CI's budget; the fixed half is reported as
    deselected). ``TORCH_JAX_FUSED_SHARE=full`` runs every test."""
    if torch_jax.config.mode != "fused" or os.environ.get("TORCH_JAX_FUSED_SHARE") == "full":
        return
    seen: dict = {}
    kept, dropped = [], []
    for item in items:
        name = item.path.name
        turn = seen[name] = seen.get(name, -1) + 1
        (kept if name in _OWN_FUSED_SHARE or turn % 2 == 0 else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_runtest_setup(item):
    if item.get_closest_marker("two_devices") and torch.jax.device_count() < 2:
        pytest.skip(f"needs two jax devices; this JAX platform ({torch.jax.get_device_name(0)}) has one")


@pytest.fixture(autouse=True)
def _fallback_is_an_error():
    """Tests run with the CPU fallback forbidden; a test that allows it says so."""
    before = torch_jax.config.fallback
    torch_jax.config.fallback = "error"
    yield
    torch_jax.config.fallback = before


@pytest.fixture(autouse=True)
def _no_error_left_behind():
    """In fused eager a value error surfaces at the next wait: a test must not leave one
    for the next test to find."""
    yield
    if torch_jax.config.mode == "fused":
        torch.jax.synchronize()


@pytest.fixture
def strict_mode():
    """For tests that look at strict eager's dispatch itself (the arrays in flight)."""
    before = torch_jax.config.mode
    torch_jax.set_mode("strict")
    yield
    torch_jax.set_mode(before)


@pytest.fixture(params=["strict", "fused"])
def mode(request):
    """Each eager mode in turn, whatever the run's (the tests whose subject is in both)."""
    before = torch_jax.config.mode
    torch_jax.set_mode(request.param)
    yield request.param
    torch_jax.set_mode(before)


@pytest.fixture
def allow_fallback():
    torch_jax.config.fallback = "silent"


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(y) for y in x)
    return x


def assert_same(got, expected, *, atol=None, rtol=None, check_stride=True):
    """``got`` (on jax) equals ``expected`` (on CPU): values, dtype, shape, strides."""
    if isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e, atol=atol, rtol=rtol, check_stride=check_stride)
        return
    if not isinstance(expected, torch.Tensor):
        assert got == expected
        return
    assert got.device.type == "jax", f"result is on {got.device}, expected a jax tensor"
    assert got.dtype == expected.dtype, f"dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} != {tuple(expected.shape)}"
    if check_stride and expected.numel() > 1:
        assert got.stride() == expected.stride(), f"stride {got.stride()} != {expected.stride()}"
    torch.testing.assert_close(got.cpu(), expected, atol=atol, rtol=rtol, equal_nan=True)
