"""Random ops on jax: the OpInfo sweep can only compare their shapes and dtypes (the
numbers differ from the CPU's by design), so here each one draws many numbers and its
statistics are checked against the distribution's moments, with tolerances of about
five standard errors. Every op is also reproducible under ``torch.manual_seed`` and
gives new numbers on the next call."""

from __future__ import annotations

import math

import pytest
import torch

N = 40_000


def _fill(method, *args, dtype=torch.float32, **kwargs):
    return lambda: getattr(torch.empty(N, device="jax", dtype=dtype), method)(*args, **kwargs)


# name -> (draw, expected mean, expected std); None where a moment does not exist
CASES = {
    "uniform_": (_fill("uniform_", -2.0, 4.0), 1.0, 6 / math.sqrt(12)),
    "uniform_f64": (_fill("uniform_", dtype=torch.float64), 0.5, 1 / math.sqrt(12)),
    "uniform_bf16": (_fill("uniform_", dtype=torch.bfloat16), 0.5, 1 / math.sqrt(12)),
    "normal_": (_fill("normal_", 3.0, 2.0), 3.0, 2.0),
    "normal_f16": (_fill("normal_", dtype=torch.float16), 0.0, 1.0),
    "normal_tensor": (lambda: torch.normal(torch.full((N,), 5.0, device="jax"), 0.5), 5.0, 0.5),
    "exponential_": (_fill("exponential_", 2.0), 0.5, 0.5),
    "log_normal_": (_fill("log_normal_", 0.0, 0.5), math.exp(0.125), math.sqrt((math.exp(0.25) - 1) * math.exp(0.25))),
    "geometric_": (_fill("geometric_", 0.25), 4.0, math.sqrt(0.75) / 0.25),
    "bernoulli_": (_fill("bernoulli_", 0.3), 0.3, math.sqrt(0.21)),
    "bernoulli": (lambda: torch.bernoulli(torch.full((N,), 0.7, device="jax")), 0.7, math.sqrt(0.21)),
    "random_": (_fill("random_", 0, 10, dtype=torch.int64), 4.5, math.sqrt(99 / 12)),
    "randint": (lambda: torch.randint(-3, 4, (N,), device="jax"), 0.0, 2.0),
    "rand": (lambda: torch.rand(N, device="jax"), 0.5, 1 / math.sqrt(12)),
    "randn": (lambda: torch.randn(N, device="jax", dtype=torch.float64), 0.0, 1.0),
    "dropout": (lambda: torch.nn.functional.dropout(torch.ones(N, device="jax"), 0.25), 1.0, math.sqrt(1 / 3)),
    "multinomial": (
        lambda: torch.multinomial(torch.tensor([1.0, 2.0, 7.0], device="jax"), N, replacement=True),
        0.1 * 0 + 0.2 * 1 + 0.7 * 2,
        math.sqrt(0.2 + 0.7 * 4 - 1.6**2),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_moments(name):
    draw, mean, std = CASES[name]
    x = draw()
    assert x.device.type == "jax" and x.shape == (N,)
    v = x.cpu().double()
    assert abs(v.mean().item() - mean) < 5 * std / math.sqrt(N) + 1e-3 * abs(mean), f"mean {v.mean().item()}"
    assert abs(v.std().item() - std) < 0.05 * std, f"std {v.std().item()}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_reproducible_and_fresh(name):
    draw = CASES[name][0]
    torch.manual_seed(7)
    a = draw().cpu()
    b = draw().cpu()
    torch.manual_seed(7)
    assert torch.equal(draw().cpu(), a), "the same seed gives the same numbers"
    assert not torch.equal(a, b), "the next call gives new numbers"


def test_cauchy_quantiles():
    """Cauchy has no mean: check its median and quartiles (median +- sigma)."""
    x = torch.empty(N, device="jax").cauchy_(1.0, 2.0).cpu().double()
    q = torch.quantile(x, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    torch.testing.assert_close(q, torch.tensor([-1.0, 1.0, 3.0], dtype=torch.float64), atol=0.1, rtol=0)


def test_complex_uniform_draws_both_parts():
    x = torch.empty(N, device="jax", dtype=torch.complex64).uniform_(0, 1).cpu()
    for part in (x.real, x.imag):
        assert 0 <= part.min() and part.max() < 1 and abs(part.mean() - 0.5) < 0.01
    assert abs(torch.corrcoef(torch.stack([x.real, x.imag]))[0, 1]) < 0.03


def test_multinomial_without_replacement_is_a_sample_without_repeats():
    torch.manual_seed(0)
    probs = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]] * 2000, device="jax")
    idx = torch.multinomial(probs, 3).cpu()
    assert all(len(set(row.tolist())) == 3 for row in idx)
    assert (idx != 0).all(), "a zero-probability category is never drawn"
    first = torch.bincount(idx[:, 0], minlength=5).double() / len(idx)
    torch.testing.assert_close(first, torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4], dtype=torch.float64), atol=0.04, rtol=0)


def test_randperm_is_a_uniform_permutation():
    # one value read per draw: in fused mode, 400 unread draws would make one graph of 400
    # sorts, which XLA's CPU backend takes minutes to compile
    firsts = torch.tensor([torch.randperm(4, device="jax")[0].item() for _ in range(400)])
    counts = torch.bincount(firsts, minlength=4)
    assert counts.min() > 60, counts


def test_draws_are_uncorrelated():
    """Successive draws, draws under neighbouring seeds and neighbouring elements of one
    draw are uncorrelated (NOTE [Random bits from XLA's Threefry]: keys from the seed and
    offset, bits from XLA's RngBitGenerator). The bound is about six standard errors."""
    torch.manual_seed(0)
    a, b = torch.rand(N, device="jax").cpu(), torch.rand(N, device="jax").cpu()
    torch.manual_seed(1)
    c = torch.rand(N, device="jax").cpu()
    for x, y in ((a, b), (a, c), (a[1:], a[:-1]), (a[: N // 2], a[N // 2 :])):
        assert abs(torch.corrcoef(torch.stack([x, y]))[0, 1].item()) < 0.03


def _jax_key(seed: int, offset: int):
    import jax
    import numpy as np

    words = np.array([seed >> 32, seed & 0xFFFFFFFF, offset & 0xFFFFFFFF, offset >> 32], np.uint32)
    key = jax.random.wrap_key_data(words[:2], impl="threefry2x32")
    key = jax.random.fold_in(jax.random.fold_in(key, words[2]), words[3])
    return np.concatenate([jax.random.key_data(key), jax.random.key_data(jax.random.fold_in(key, 1))])


def test_keys_are_jaxs_fold_in_of_the_seed_and_offset():
    """NOTE [Keys hashed on the host]: the key words hashed in Python, one at a time and in
    a run of draws (KEY_BLOCK at once), across the offset's 32- and 64-bit wraps, are
    jax.random's fold_in(fold_in(key(seed), offset_lo), offset_hi) and its fold_in(., 1)."""
    import numpy as np

    from torch_jax.device import _state

    step = _state.OFFSET_STEP
    starts = [(67280421310721, 0), (2**64 - 1, 2**32 - 8 * step), (12345, 2**64 - 8 * step), (2**40 + 7, 1000 * step)]
    for seed, offset in starts:
        for k in range(_state.KEY_BLOCK + 10):  # (a run: the second draw hashes the block)
            o = (offset + k * step) % 2**64
            assert np.array_equal(_state.key_words(seed, o), _jax_key(seed, o)), (seed, o)
        o = (offset + 5 * step) % 2**64  # (back inside the block, and an offset alone)
        assert np.array_equal(_state.key_words(seed, o), _jax_key(seed, o))
        o = (o + 3 * step + 1) % 2**64
        assert np.array_equal(_state.key_words(seed, o), _jax_key(seed, o))


def test_a_random_ops_computation_hashes_no_key(monkeypatch):
    """NOTE [Keys hashed on the host]: a random op's computation takes its key's words and
    runs no threefry hash of its own (its bits come from XLA's RngBitGenerator)."""
    from torch_jax.runtime import _xla_options

    texts = []
    compile_options = _xla_options.compile_options

    def spy(index, inputs, shapes, lowered):
        texts.append(lowered.as_text())
        return compile_options(index, inputs, shapes, lowered)

    monkeypatch.setattr(_xla_options, "compile_options", spy)
    torch.empty(3, 11, 7, device="jax").uniform_(-3.0, 5.0)  # (a shape no other test draws)
    (text,) = [t for t in texts if "rng_bit_generator" in t]
    assert "threefry" not in text


def test_a_seed_before_the_device_starts_is_kept_until_it_does():
    """NOTE [Seeds before the device starts]: torch.manual_seed, which programs call before
    init_process_group (whose group JAX's runtime starts from), does not start the device,
    and seeds it as it starts: the same numbers as a seed given after."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from torch_jax import _registration\n"
        "from torch_jax.device import _module\n"
        "for s in range(10000):\n"  # (seeding often keeps what decides the seeds: two calls)
        "    torch.manual_seed(s); torch.jax.manual_seed(s)\n"
        "assert len(_module._pending) == 2\n"
        "torch.jax.manual_seed(3)\n"  # (replaced by every device's seed after it)
        "torch.manual_seed(5)\n"
        "torch.jax.manual_seed(7)\n"  # (the current device's, after: it wins there)
        "assert not _registration.is_initialized()\n"
        "a = torch.randn(3, device='jax').cpu()\n"
        "torch.manual_seed(5); torch.jax.manual_seed(7)\n"
        "assert torch.equal(a, torch.randn(3, device='jax').cpu())\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
