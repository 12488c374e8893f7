"""FlexAttention on jax: PyTorch's device check opened for the device alone (NOTE [FlexAttention
on jax] in device/_flex), eager (PyTorch's dense implementation on the device) and compiled
(blockwise, NOTE [Blockwise flex attention] in compile/_flex), against a float64 dense
reference computed on the CPU. The yardstick is the CPU's own: a float32 result on jax must be
as close to float64 as PyTorch's float32 flex attention on the CPU is (within ``_FACTOR``);
for gradients, which the CPU's flex attention refuses, as close as the same dense formula in
float32 on the CPU."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.nn.attention import flex_attention as fa
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, create_block_mask, flex_attention, or_masks

import torch_jax
from torch_jax.compile import _graph
from torch_jax.runtime import _stats

B, H, L, E = 2, 4, 160, 16
_FACTOR = 4.0  # how much farther from float64 than the CPU's float32 a result may be
_G = torch.Generator().manual_seed(0)
_QKV = [torch.randn(B, H, L, E, generator=_G, dtype=torch.float64) for _ in range(3)]
_BIAS = torch.randn(L, L, generator=_G, dtype=torch.float64)
_SLOPES = torch.tensor([2.0**-i for i in range(1, H + 1)], dtype=torch.float64)
_DOCS = torch.tensor([[0] * 50 + [1] * 70 + [2] * 40, [0] * 110 + [1] * 50])  # (B, L) document ids


# (a compiled graph does not depend on the eager mode: CI's fused run skips them, as it skips
# tests/test_compile.py)
compiled_graphs = pytest.mark.skipif(
    torch_jax.config.mode == "fused", reason="compiled graphs: the strict run has them"
)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles its own closures: Dynamo would otherwise count them against one
    function's recompilation limit and run the rest eagerly."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _causal(b, h, q, k):
    return q >= k


def _window(b, h, q, k):
    return (q >= k) & (q - k <= 40)


def _prefix(b, h, q, k):
    return k < 24


def _odd_heads_see_all(b, h, q, k):
    return (q >= k) | (h % 2 == 1)


_odd_heads_see_all.per_head = True


# Each case: its mods made for a device and dtype (captured tensors moved there), written so
# that they also run on broadcast index tensors (the dense reference calls them that way).
def _plain(dev, dtype):
    return None, _causal


def _relative(dev, dtype):
    return (lambda s, b, h, q, k: s + (q - k) * 0.05), _window


def _alibi(dev, dtype):
    slopes = _SLOPES.to(dev, dtype)
    return (lambda s, b, h, q, k: s - slopes[h] * (q - k).abs()), or_masks(_causal, _prefix)


def _softcap_documents(dev, dtype):
    docs = _DOCS.to(dev)

    def mask(b, h, q, k):
        return (docs[b, q] == docs[b, k]) & (q >= k)

    mask.per_batch = True
    return (lambda s, b, h, q, k: 2.0 * torch.tanh(s / 2.0)), mask


def _bias(dev, dtype):
    bias = _BIAS.to(dev, dtype)
    return (lambda s, b, h, q, k: s + bias[q, k]), None


def _per_head(dev, dtype):
    bias = _BIAS.to(dev, dtype)
    return (lambda s, b, h, q, k: s + bias[q, k]), _odd_heads_see_all


# ------------------------------------------------------------ the reference and the yardstick


def _inputs(dev, dtype, length=L, kv_heads=H, requires_grad=False):
    q, k, v = (t[:, :, :length] for t in _QKV)
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    return [t.to(dev, dtype).requires_grad_(requires_grad) for t in (q, k, v)]


def _dense(q, k, v, score_mod, mask_mod):
    """Softmax attention written out on the CPU: every score, score_mod and mask_mod on
    broadcast index tensors, grouped heads repeated. (out, natural-log lse)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    b, h, qi, ki = (torch.arange(n).view([-1 if i == d else 1 for i in range(4)]) for d, n in enumerate(s.shape))
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, ki), -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def _block_mask(mask_mod, dev, length=L, block=32):
    """The BlockMask of ``mask_mod``, per batch element or head where the mask differs."""
    if mask_mod is None:
        return None
    batch = B if getattr(mask_mod, "per_batch", False) else None
    heads = H if getattr(mask_mod, "per_head", False) else None
    return create_block_mask(mask_mod, batch, heads, length, length, device=dev, BLOCK_SIZE=block)


def _cpu_flex(case, length=L, block=32, kv_heads=H, **kw):
    """PyTorch's float32 flex attention on the CPU (its dense implementation)."""
    score_mod, mask_mod = case("cpu", torch.float32)
    q, k, v = _inputs("cpu", torch.float32, length, kv_heads)
    return flex_attention(q, k, v, score_mod, _block_mask(mask_mod, "cpu", length, block), **kw)


def _assert_close(got, ref, yardstick):
    """``got`` (float32 on jax) is as close to the float64 ``ref`` as ``yardstick`` is."""
    assert got.device.type == "jax" and got.dtype == torch.float32 and got.shape == ref.shape
    finite = torch.isfinite(ref)
    err = (got.cpu().double() - ref)[finite].abs().max().item()
    base = (yardstick.double() - ref)[finite].abs().max().item()
    floor = 2.0**-24 * ref[finite].abs().max().item()  # (float32's resolution at this scale)
    assert torch.equal(torch.isfinite(got.cpu()), finite)
    assert err <= _FACTOR * max(base, floor), f"{err:.3g} from float64; the CPU's float32: {base:.3g}"


def _run(fn, case, length=L, block=32, kv_heads=H, **kw):
    score_mod, mask_mod = case("jax", torch.float32)
    q, k, v = _inputs("jax", torch.float32, length, kv_heads)
    return fn(q, k, v, score_mod, _block_mask(mask_mod, "jax", length, block), **kw)


def _reference(case, length=L, kv_heads=H):
    score_mod, mask_mod = case("cpu", torch.float64)
    return _dense(*_inputs("cpu", torch.float64, length, kv_heads), score_mod, mask_mod)


def _compiled(**kw):
    return torch.compile(flex_attention, backend="jax", fullgraph=True, **kw)


# ------------------------------------------------------------ the device check


def test_the_device_check_opens_for_jax_alone():
    assert getattr(fa._validate_device, "_torch_jax", False)
    q, k, v = _inputs("meta", torch.float32)
    with pytest.raises(ValueError, match="FlexAttention is only supported on .* Found input tensors on meta device"):
        flex_attention(q, k, v)
    q, k, v = _inputs("cpu", torch.float32, requires_grad=True)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, k, v)
    q, k, v = _inputs("jax", torch.float32, requires_grad=True)
    assert flex_attention(q, k, v).shape == (B, H, L, E)


# ------------------------------------------------------------ eager: PyTorch's dense implementation


@pytest.mark.parametrize("case", [_plain, _softcap_documents, _bias], ids=lambda c: c.__name__.strip("_"))
def test_eager(case):
    got = _run(flex_attention, case)
    _assert_close(got, _reference(case)[0], _cpu_flex(case))


def test_eager_gradients_and_grouped_heads():
    score_mod, mask_mod = _alibi("jax", torch.float32)
    q, k, v = _inputs("jax", torch.float32, kv_heads=2, requires_grad=True)
    out = flex_attention(q, k, v, score_mod, _block_mask(mask_mod, "jax"), enable_gqa=True)
    _check_gradients(_alibi, (q, k, v), out, kv_heads=2)


# ------------------------------------------------------------ compiled: blockwise


@pytest.mark.parametrize(
    "case, length, block",
    [
        (_plain, L, 32),
        (_relative, L, 32),
        (_alibi, L, 32),
        (_softcap_documents, L, 32),
        (_bias, 100, 128),  # no block mask: PyTorch's one block of 1 << 30, in sub-tiles
        (_plain, 100, 128),  # one block, padded past the sequence
    ],
    ids=["causal", "relative-window", "alibi-prefix", "softcap-documents", "bias-nomask", "causal-padded"],
)
@compiled_graphs
def test_compiled(case, length, block):
    before = dict(_stats.counters)
    got = _run(_compiled(), case, length, block)
    assert _stats.counters["flex_attention_blockwise"] == before.get("flex_attention_blockwise", 0) + 1
    assert _stats.counters["compiled_graphs_eager"] == before.get("compiled_graphs_eager", 0)
    _assert_close(got, _reference(case, length)[0], _cpu_flex(case, length, block))


@compiled_graphs
def test_the_default_compile_is_blockwise_too():
    before = _stats.counters["flex_attention_blockwise"]
    got = _run(torch.compile(flex_attention), _plain)
    assert _stats.counters["flex_attention_blockwise"] == before + 1
    _assert_close(got, _reference(_plain)[0], _cpu_flex(_plain))


@pytest.mark.parametrize("how", ["return_lse", "AuxRequest"])
@compiled_graphs
def test_compiled_lse_with_grouped_heads(how):
    kw = {"return_lse": True} if how == "return_lse" else {"return_aux": AuxRequest(lse=True)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (return_lse is deprecated for return_aux)
        out, lse = _run(_compiled(), _per_head, kv_heads=2, enable_gqa=True, **kw)
        cpu_out, cpu_lse = _cpu_flex(_per_head, kv_heads=2, enable_gqa=True, **kw)
    if how == "AuxRequest":
        lse, cpu_lse = lse.lse, cpu_lse.lse
    ref_out, ref_lse = _reference(_per_head, kv_heads=2)
    _assert_close(out, ref_out, cpu_out)
    _assert_close(lse, ref_lse, cpu_lse)


def _check_gradients(case, inputs, out, kv_heads=H, captured=None):
    """Gradients of q, k, v (and of a captured tensor) on jax against float64 autograd of the
    dense formula; the yardstick is that formula's float32 gradients on the CPU."""
    grad = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape)
    out.backward(grad.float().to("jax"))
    grads = {}
    for dtype in (torch.float64, torch.float32):
        qkv = _inputs("cpu", dtype, kv_heads=kv_heads, requires_grad=True)
        extra = [] if captured is None else [captured.detach().to(dtype).clone().requires_grad_()]
        score_mod, mask_mod = case("cpu", dtype) if captured is None else case(extra[0])
        o, _ = _dense(*qkv, score_mod, mask_mod)
        o.backward(grad.to(dtype))
        grads[dtype] = [t.grad for t in qkv + extra]
    for t, ref, yardstick in zip(inputs, grads[torch.float64], grads[torch.float32]):
        _assert_close(t.grad, ref, yardstick)


def _bias_grad_case(bias):  # (the bias itself, one that requires grad)
    return (lambda s, b, h, q, k: s + bias[q, k]), _causal


@compiled_graphs
def test_compiled_gradients_of_qkv_and_a_captured_bias():
    before = _stats.counters["flex_attention_backward_blockwise"]
    bias = _BIAS.float().to("jax").requires_grad_()
    score_mod, mask_mod = _bias_grad_case(bias)
    q, k, v = _inputs("jax", torch.float32, kv_heads=2, requires_grad=True)
    out = _compiled()(q, k, v, score_mod, _block_mask(mask_mod, "jax"), enable_gqa=True)
    _check_gradients(_bias_grad_case, (q, k, v, bias), out, kv_heads=2, captured=_BIAS)
    assert _stats.counters["flex_attention_backward_blockwise"] == before + 1


@pytest.mark.parametrize("case", [_softcap_documents, _per_head], ids=["softcap-documents", "per-head"])
@compiled_graphs
def test_compiled_gradients(case):
    score_mod, mask_mod = case("jax", torch.float32)
    q, k, v = _inputs("jax", torch.float32, kv_heads=2, requires_grad=True)
    out = _compiled()(q, k, v, score_mod, _block_mask(mask_mod, "jax"), enable_gqa=True)
    _check_gradients(case, (q, k, v), out, kv_heads=2)


# ------------------------------------------------------------ what blockwise means


@compiled_graphs
def test_only_the_listed_blocks_are_visited():
    """A BlockMask that lists fewer blocks than its mask_mod allows: the compiled
    computation reads only the listed ones (as PyTorch's fused kernels do; its dense
    implementation applies mask_mod alone). Query block i lists KV blocks 0 and i."""
    n = L // 32
    listed = torch.eye(n, dtype=torch.bool)
    listed[:, 0] = True  # (n, n): which KV blocks each query block lists
    count = listed.sum(-1).to(torch.int32)
    indices = torch.argsort(listed.to(torch.int32), dim=-1, descending=True, stable=True).to(torch.int32)
    dense_mask = listed.repeat_interleave(32, 0).repeat_interleave(32, 1)  # (L, L)
    q, k, v = _inputs("jax", torch.float32)
    mask = BlockMask.from_kv_blocks(count.view(1, 1, n).to("jax"), indices.view(1, 1, n, n).to("jax"), BLOCK_SIZE=32)
    got = _compiled()(q, k, v, block_mask=mask)

    def listed_only(b, h, q_idx, kv_idx):
        return dense_mask[q_idx, kv_idx]

    ref, _ = _dense(*_inputs("cpu", torch.float64), None, listed_only)
    cpu, _ = _dense(*_inputs("cpu", torch.float32), None, listed_only)
    _assert_close(got, ref, cpu)


@pytest.mark.parametrize("masked", [True, False], ids=["causal", "nomask"])
@compiled_graphs
def test_no_step_holds_the_score_matrix(masked):
    """The XLA computation's temporary memory stays below one L x L float32 score matrix
    of one head (PyTorch's dense implementation holds several of all heads)."""
    length = 1024
    q, k, v = (torch.randn(1, 1, length, 16, device="jax", requires_grad=True) for _ in range(3))
    mask = create_block_mask(_causal, None, None, length, length, device="jax") if masked else None
    out = _compiled()(q, k, v, block_mask=mask)
    forward = _graph.recent[-1]()
    out.sum().backward()
    backward = _graph.recent[-1]()
    assert forward is not backward
    for executable in (forward, backward):
        assert executable.memory_analysis().temp_size_in_bytes < length * length * 4


@compiled_graphs
def test_the_benchmark_runs():
    """benchmarks/flex_attention.py end to end, small (its numbers are the benchmark's)."""
    from benchmarks.flex_attention import main

    report = main(["--length", "256", "--heads", "2", "--repeats", "1", "--variants", "compiled", "--no-write"])
    rows = {r["mask"]: r for r in report["rows"]}
    assert set(rows) == {"causal", "none"} and not any("error" in r for r in rows.values())
    for r in rows.values():
        assert r["median_ms"] > 0 and r["temp_mb"] > 0 and r["peak_mb"] > r["storages_mb"] > 0
