"""torch.compile on jax: the "jax" backend and the default backend routed to it, against
the same code on the CPU (eager) and in eager mode on jax (NOTE [Compiled graphs])."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import _models
import torch_jax
from conftest import assert_same, config_as


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _stat(name):
    return torch_jax.stats().get(name, 0)


def test_backend_is_registered():
    assert "jax" in torch._dynamo.list_backends()


def test_mlp_forward_and_backward_match_cpu_and_compile_once():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    dev = copy.deepcopy(cpu).to("jax")
    compiled = torch.compile(dev, backend="jax")
    x = torch.randn(5, 8)
    out = compiled(x.to("jax"))
    out.square().sum().backward()
    expected = cpu(x)
    expected.square().sum().backward()
    assert_same(out.detach(), expected.detach(), atol=1e-5, rtol=1e-5)
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-5)
    ops = _stat("ops")
    dev(x.to("jax")).sum().backward()
    eager_ops = _stat("ops") - ops
    compiles, ops, calls = _stat("compiled_graph_compiles"), _stat("ops"), _stat("compiled_graph_calls")
    for _ in range(3):
        compiled(x.to("jax")).sum().backward()
    assert _stat("compiled_graph_compiles") == compiles  # (the forward and backward compiled once)
    assert _stat("compiled_graph_calls") - calls == 6
    # (the model's ops run in the graphs: what is left is the upload, the sum and the gradients' accumulation)
    assert _stat("ops") - ops <= 3 * (eager_ops - 8)


def test_in_place_updates_of_inputs_land_in_the_callers_tensors():
    def f(x, buf, rows):
        buf.add_(x)  # a whole tensor
        rows[1].mul_(2)  # through a view of another input
        return (buf * 3).sum()

    def run(device):
        x = torch.arange(6.0).reshape(2, 3).to(device)
        buf = torch.ones(2, 3, device=device)
        base = torch.arange(12.0, device=device)
        rows = base.view(3, 4)
        fn = torch.compile(f, backend="jax") if device == "jax" else f
        s = fn(x, buf, rows)
        return s, buf, base

    for got, expected in zip(run("jax"), run("cpu")):
        assert_same(got, expected)


def test_out_arguments_and_in_place_ops_through_views():
    def f(a, b, out, buf):
        torch.add(a, b, out=out)  # a whole tensor
        torch.mul(a, 2, out=buf[:, 1])  # a strided view of another
        buf.t()[0].sub_(1)  # an in-place op through a transposed view
        return out.sum() + buf.sum()

    def run(device):
        a = torch.arange(6.0).reshape(3, 2).to(device)
        b = torch.ones(3, 2, device=device)
        out = torch.empty(3, 2, device=device)
        buf = torch.zeros(3, 3, device=device)
        fn = torch.compile(f, backend="jax") if device == "jax" else f
        return fn(a, b, out, buf), out, buf

    for got, expected in zip(run("jax"), run("cpu")):
        assert_same(got, expected)


def test_batch_norm_running_statistics_update_as_on_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    dev = copy.deepcopy(cpu).to("jax")
    compiled = torch.compile(dev, backend="jax")
    for seed in range(2):
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
        compiled(x.to("jax")).sum().backward()
        cpu(x).sum().backward()
    bn, bn_dev = cpu[1], dev[1]
    assert_same(bn_dev.running_mean, bn.running_mean, atol=1e-5, rtol=1e-5)
    assert_same(bn_dev.running_var, bn.running_var, atol=1e-5, rtol=1e-5)
    assert bn_dev.num_batches_tracked.item() == 2
    torch.testing.assert_close(dev[0].weight.grad.cpu(), cpu[0].weight.grad, atol=1e-4, rtol=1e-4)


def test_outputs_that_are_views_of_inputs_alias_them():
    def f(x):
        return x.t(), x[1:], x * 2

    x = torch.arange(6.0).reshape(2, 3).to("jax")
    t, tail, doubled = torch.compile(f, backend="jax")(x)
    assert t.shape == (3, 2) and t.stride() == (1, 3)
    t[0, 1] = 100.0  # x[1, 0]
    tail[0, 2] = -1.0  # x[1, 2]
    assert x.cpu().tolist() == [[0.0, 1.0, 2.0], [100.0, 4.0, -1.0]]
    assert doubled.cpu().tolist() == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]


def test_views_inside_the_graph():
    def f(x, y):
        a = x.view(4, 6).t().contiguous().view(-1)[::5]
        b = x.permute(2, 0, 1).expand(2, 4, 2, 3).sum(0)
        c = torch.stack(y.unbind(1), 0).narrow(1, 1, 2).unsqueeze(0).squeeze()
        d, e = x.split([1, 2], dim=1)
        return a, b, c, d.select(1, 0), e.diagonal(0, 1, 2), x.unfold(2, 2, 1), torch.view_as_real(y.to(torch.cfloat))

    x = torch.randn(2, 3, 4)
    y = torch.randn(3, 5)
    got = torch.compile(f, backend="jax")(x.to("jax"), y.to("jax"))
    expected = f(x, y)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e)


def test_graphs_that_read_and_make_cpu_tensors():
    """A graph may read a CPU tensor (a mask made on the host) and return one, as on CUDA."""

    def f(x, mask):
        return x * mask.to(x.device), (mask * 2).sum(), x.sum().cpu()

    x, mask = torch.randn(3, 4), (torch.arange(12.0).reshape(3, 4) > 5).float()
    got = torch.compile(f, backend="jax")(x.to("jax"), mask)
    expected = f(x, mask)
    assert got[0].device.type == "jax" and got[1].device.type == "cpu" and got[2].device.type == "cpu"
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e)


def test_dropout_draws_from_the_device_generator():
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    compiled = torch.compile(f, backend="jax")
    x = torch.ones(64, 64, device="jax")
    torch.manual_seed(7)
    a = compiled(x)
    b = compiled(x)
    torch.manual_seed(7)
    c = compiled(x)
    torch.manual_seed(7)
    eager = f(x)
    assert not torch.equal(a.cpu(), b.cpu())
    assert torch.equal(a.cpu(), c.cpu())
    assert torch.equal(a.cpu(), eager.cpu())  # (the same random ops in the same order as eager code)
    kept = (a.cpu() >= 1).float().mean().item()  # (dropout keeps 2 + u, drops to u < 1)
    assert 0.45 < kept < 0.55


def test_compiled_functions_inside_fused_eager():
    """Fused eager records ops; a compiled graph computes what it reads first, and its
    results feed recorded ops (CI's fused run leaves this file to the strict run)."""

    def f(x):
        return (x @ x.t()).relu()

    compiled = torch.compile(f, backend="jax")
    x = torch.randn(4, 3)
    with torch_jax.fused():
        y = x.to("jax") * 2  # pending
        z = compiled(y) + 1
        got = (z * y.sum()).cpu()
    expected = (f(x * 2) + 1) * (x * 2).sum()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_graph_breaks_run_the_rest_on_the_device():
    def f(x):
        y = x.sin() * 2
        if y.sum().item() > 0:  # (a graph break: a value the host reads)
            y = y + 1
        print("", end="")  # (another)
        return y.cos()

    x = torch.randn(4, 5)
    got = torch.compile(f, backend="jax")(x.to("jax"))
    assert_same(got, f(x), atol=1e-6, rtol=1e-6)


def test_dynamo_skips_the_kernels_the_device_generates():
    """NOTE [Dynamo skips the runtime]: the eager part of a compiled function (code Dynamo
    cannot trace, run with its frame hook on) calls the device's kernels, which are Python
    the device generates; Dynamo's skip list must cover them, or it traces every kernel."""
    from torch._dynamo import trace_rules

    from torch_jax.runtime import _executor, _install

    torch_jax.initialize()
    kernel = _install._functional_kernel(_executor.SPECS[torch.ops.aten.sin.default])
    assert trace_rules.check(kernel.__code__)  # skipped
    namespace = {}
    exec(compile("def kernel(x):\n    return x\n", "<generated>", "exec"), namespace)
    assert not trace_rules.check(namespace["kernel"].__code__)  # (what Dynamo does with other code)


@pytest.mark.parametrize("dynamic", [True, None])
def test_changing_shapes_are_never_wrong(dynamic):
    def f(x, n: int):
        return (x[:, :n].softmax(-1) * x.shape[0]).sum(0)

    compiled = torch.compile(f, backend="jax", dynamic=dynamic)
    for rows, cols, n in [(2, 5, 3), (3, 7, 4), (4, 9, 5), (3, 7, 4), (5, 6, 2)]:
        x = torch.randn(rows, cols)
        assert_same(compiled(x.to("jax"), n), f(x, n), atol=1e-6, rtol=1e-6)
    reasons = torch_jax.stats()["compiled_graph_reasons"]
    assert reasons.get("new graph", 0) >= 1


def test_compilations_are_counted_with_their_reasons(capsys):
    from torch_jax.runtime import _recompiles

    def f(x):
        return x.exp().sum(0)

    compiled = torch.compile(f, backend="jax", dynamic=False)
    torch_jax.reset_stats()
    with config_as(debug=1):
        compiled(torch.ones(2, 3, device="jax"))
        compiled(torch.ones(2, 3, device="jax"))
    printed = capsys.readouterr().out
    assert "compiling torch.compile graph" in printed and "new graph" in printed
    stats = torch_jax.stats()
    # (a run with a persistent cache, as CI's, may load the graph that another process compiled)
    made = stats.get("compiled_graph_compiles", 0) + stats.get("compiled_graph_loads", 0)
    assert made == 1 and stats["compiled_graph_hits"] == 1
    assert stats["compiled_graph_reasons"] == {"new graph": 1}
    # a graph that keeps compiling for new shapes warns once (NOTE [Shapes that keep changing])
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="jax", dynamic=True)
    warned = _recompiles._warned
    rows = [torch.ones(n, 3, device="jax") for n in range(2, 3 + _recompiles.THRESHOLD)]  # (made before)
    _recompiles._warned = False
    try:
        with pytest.warns(torch_jax.RecompileWarning, match="input shapes"):
            for x in rows:
                compiled(x)
    finally:
        _recompiles._warned = warned
    reasons = torch_jax.stats()["compiled_graph_reasons"]
    assert sum(v for k, v in reasons.items() if k.startswith("new input shapes")) >= _recompiles.THRESHOLD


def test_default_torch_compile_routes_graphs_on_jax(monkeypatch):
    torch_jax.compile._route._told = False
    m = torch.nn.Linear(4, 3).to("jax")
    x = torch.randn(2, 4, device="jax")
    calls = _stat("compiled_graph_calls")
    with pytest.warns(torch_jax.CompileWarning, match="TORCH_JAX_ROUTE_INDUCTOR=0"):
        out = torch.compile(m, mode="max-autotune")(x)
    assert _stat("compiled_graph_calls") > calls
    torch.testing.assert_close(out.cpu(), m(x).cpu())
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_jax.CompileWarning)  # (said once)
        torch._dynamo.reset()
        torch.compile(m)(x)


def test_routing_turned_off_leaves_graphs_to_inductor(monkeypatch):
    import torch._inductor.compile_fx as inductor

    import torch_jax.compile as tjc

    def refuse(*args, **kwargs):
        raise AssertionError("routed")

    # (Inductor's entry point, which PyTorch's wrapper imports at each call: a stand-in
    # that says which devices a graph it was given holds and runs the graph as captured,
    # so that no C++ is compiled here: a real one took 30 of the test's 38 s on the EPYC)
    given = []

    def compile_fx(gm, inputs, **kwargs):
        given.append({t.device.type for t in inputs if isinstance(t, torch.Tensor)})
        return gm.forward

    monkeypatch.setattr(tjc, "backend", refuse)
    monkeypatch.setattr(inductor, "compile_fx", compile_fx)
    m = torch.nn.Linear(4, 3).to("jax")
    x = torch.randn(2, 4, device="jax")
    with config_as(route_inductor=False):
        torch.testing.assert_close(torch.compile(m)(x).cpu(), m(x).cpu())
    assert given == [{"jax"}]
    cpu = torch.nn.Linear(4, 3)  # (and graphs on the CPU keep Inductor whatever the setting)
    assert torch.compile(cpu)(torch.ones(1, 4)).shape == (1, 3)
    assert given == [{"jax"}, {"cpu"}]


def test_training_steps_with_a_compiled_optimizer_step_match_cpu():
    """The model's forward and backward compiled whole (fullgraph=True), and AdamW's step
    compiled as PyTorch's compiled-optimizer recipe does it (``Optimizer.step`` breaks the
    graph on purpose around its update, on every device, so the update is one graph)."""
    torch.manual_seed(0)
    cpu = _models.Block()
    dev = copy.deepcopy(cpu).to("jax")
    opt = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2)
    model = torch.compile(dev, backend="jax", fullgraph=True)

    @torch.compile(backend="jax")
    def step():
        opt_dev.step()

    idx = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    for _ in range(4):
        loss = torch.nn.functional.cross_entropy(cpu(idx).flatten(0, 1), idx.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss_dev = torch.nn.functional.cross_entropy(model(idx.to("jax")).flatten(0, 1), idx.to("jax").flatten())
        loss_dev.backward()
        step()
        opt_dev.zero_grad()
        torch.testing.assert_close(loss_dev.item(), loss.item(), atol=1e-5, rtol=1e-5)
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), atol=1e-5, rtol=1e-5)


def test_complex_rotary_embedding_compiles_whole_with_its_gradients():
    """Llama's rotary embedding in complex numbers (TorchTitan's): its backward holds
    ``aten._conj``, which a graph computes as the conjugate itself; the graph runs as one
    computation (the fallback is an error here) and matches the CPU."""

    def rope(x, freqs):  # x (B, T, H, D), freqs (T, D/2) complex
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs[None, :, None, :]).flatten(3)

    x = torch.randn(2, 5, 3, 8)
    freqs = torch.polar(torch.ones(5, 4), torch.outer(torch.arange(5.0), torch.rand(4)))
    calls = _stat("compiled_graph_calls")
    got_x = x.to("jax").requires_grad_()
    torch.compile(rope, backend="jax")(got_x, freqs.to("jax")).square().sum().backward()
    want_x = x.clone().requires_grad_()
    rope(want_x, freqs).square().sum().backward()
    assert _stat("compiled_graph_calls") - calls == 2  # (the forward and the backward, each whole)
    torch.testing.assert_close(got_x.grad.cpu(), want_x.grad, atol=1e-5, rtol=1e-5)


def test_an_op_without_lowering_runs_the_graph_op_by_op(allow_fallback):
    """A graph with an op the table cannot run still works (op by op, through the CPU
    fallback where needed), warns, and is an error under TORCH_JAX_FALLBACK=error."""

    def f(x):
        return torch.linalg.ldl_factor(x @ x.mT + 4 * torch.eye(4, device=x.device))[0] + 1

    x = torch.randn(4, 4)
    with config_as(fallback="warn"), pytest.warns(torch_jax.FallbackWarning, match="linalg_ldl_factor_ex"):
        got = torch.compile(f, backend="jax")(x.to("jax"))
    torch.testing.assert_close(got.cpu(), f(x), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
    with config_as(fallback="error"), pytest.raises(Exception, match="linalg_ldl_factor_ex"):
        torch.compile(f, backend="jax")(x.to("jax"))


def test_a_second_process_loads_the_compiled_graphs(tmp_path):
    """NOTE [Persistent compilation cache]: the same program in a new process compiles
    nothing."""
    script = textwrap.dedent(
        """
        import json, torch, torch_jax
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to("jax")
        torch.compile(m, backend="jax")(torch.ones(4, 8, device="jax")).sum().backward()
        s = torch_jax.stats()
        print(json.dumps([s.get("compiled_graph_compiles", 0), s.get("compiled_graph_loads", 0)]))
        """
    )
    env = dict(os.environ, TORCH_JAX_CACHE_DIR=str(tmp_path), TORCH_JAX_COMPILATION_CACHE="1")
    runs = [
        subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    first, second = (eval(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert first == [2, 0], runs[0].stderr[-2000:]
    assert second == [0, 2], runs[1].stderr[-2000:]
    assert any((tmp_path / "xla").iterdir())


# ---------------------------------------------------------------- Hugging Face models

from test_hf_models import MODELS, _batch, _pair  # noqa: E402

# NOTE [Compiled graphs against float64]: a compiled training step's float32 logits and
# gradients must be about as close to the float64 result (the model and its inputs in
# float64 on the CPU) as the CPU's own float32 eager result is. The OpInfo sweep asks
# single ops for 2x the CPU's error; a whole graph's fusions and XLA's summation orders
# measured up to 3.4x on one tensor of ten models' (2026-12-05: GPT-2's ln_2.weight
# gradient, 3.2e-9 against the CPU's 9.6e-10; wav2vec2's feature projection 2.3x), so a
# graph may be 4x, plus a float32 rounding of the model's largest gradient (a gradient
# that is zero but for rounding, as a key bias's is, has no error scale of its own).
AS_ACCURATE = 4.0


def _further(got, expected, ref, scale) -> str | None:
    """Why ``got`` is less accurate than the CPU's ``expected`` against float64 ``ref``, or None."""
    g, e, r = (t.detach().cpu().double() for t in (got, expected, ref))
    ours, cpus = (g - r).abs().max().item(), (e - r).abs().max().item()
    if ours <= AS_ACCURATE * cpus + torch.finfo(torch.float32).eps * scale:
        return None
    return f"from float64: ours {ours:.3g}, the CPU's {cpus:.3g}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_models_compiled_match_cpu(name):
    """Forward outputs and every gradient of a compiled training step against the same
    model on the CPU (eager), and about as close to float64 as the CPU's (NOTE [Compiled
    graphs against float64]); for four of them the losses of three more steps with a
    compiled AdamW step."""
    cpu, dev = _pair(name)
    cpu.train(), dev.train()
    ref = copy.deepcopy(cpu).double()
    model = torch.compile(dev, backend="jax")
    out = model(**_batch(name, "jax"))
    expected = cpu(**_batch(name, "cpu"))
    torch.testing.assert_close(out.logits.detach().cpu(), expected.logits.detach(), rtol=1e-4, atol=1e-4)
    exact = ref(**{k: v.double() if v.is_floating_point() else v for k, v in _batch(name, "cpu").items()})
    why = _further(out.logits, expected.logits, exact.logits, exact.logits.abs().max().item())
    assert why is None, f"logits: {why}"
    out.loss.backward()
    expected.loss.backward()
    exact.loss.backward()
    scale = max(r.grad.abs().max().item() for r in ref.parameters() if r.grad is not None)
    for (pname, p), q, r in zip(cpu.named_parameters(), dev.parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), pname
        if p.grad is not None:
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-5, msg=pname)
            why = _further(q.grad, p.grad, r.grad, scale)
            assert why is None, f"{pname}: {why}"
    if name not in ("gpt2", "llama", "resnet", "t5"):  # (CI's time: compiled AdamW steps on four of them)
        return
    opt, opt_dev = torch.optim.AdamW(cpu.parameters(), lr=1e-3), torch.optim.AdamW(dev.parameters(), lr=1e-3)
    step = torch.compile(opt_dev.step, backend="jax")
    losses, losses_dev = [], []
    for _ in range(3):
        opt.step(), step()
        opt.zero_grad(), opt_dev.zero_grad()
        loss, loss_dev = cpu(**_batch(name, "cpu")).loss, model(**_batch(name, "jax")).loss
        loss.backward(), loss_dev.backward()
        losses.append(loss.item()), losses_dev.append(loss_dev.item())
    torch.testing.assert_close(torch.tensor(losses_dev), torch.tensor(losses), rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_generate_with_a_compiled_forward_is_identical_to_cpu(name):
    cpu, dev = _pair(name)
    cpu.eval(), dev.eval()
    dev.forward = torch.compile(dev.forward, backend="jax")
    prompt = torch.randint(0, 96, (2, 5), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    expected = cpu.generate(prompt, **kw)
    calls = _stat("compiled_graph_calls")
    got = dev.generate(prompt.to("jax"), **kw)
    assert torch.equal(got.cpu(), expected)
    assert _stat("compiled_graph_calls") - calls >= 6


# ---------------------------------------------------------------- OpInfo through torch.compile

import zlib  # noqa: E402

from torch_jax.report import _sweep  # noqa: E402

OPINFO_SHARE = 8  # one OpInfo in OPINFO_SHARE, fixed by a hash of its name (docs/testing.md: why)


def _compiled_opinfos():
    return [
        pytest.param(op, id=_sweep.name_of(op))
        for op in _sweep.opinfos()
        if _sweep.supported(op, torch.float32) and zlib.crc32(_sweep.name_of(op).encode()) % OPINFO_SHARE == 0
    ]


@pytest.mark.parametrize("op", _compiled_opinfos())
def test_opinfo_compiled(op, allow_fallback):
    """The OpInfo's first float32 sample through torch.compile(backend="jax") against the
    CPU, its in-place variant too (the input's new value), with the sweep's comparison
    (tolerances, tie-breaking, random ops by shape and dtype)."""
    name = _sweep.name_of(op)
    if name in _sweep.EXCLUDED:
        pytest.skip(_sweep.EXCLUDED[name])
    torch.manual_seed(0)
    sample = next(iter(op.sample_inputs("jax", torch.float32, requires_grad=False)), None)
    if sample is None:
        pytest.skip("no float32 sample")
    random = name in _sweep.RANDOM or _sweep.random_sample(name, sample)
    tol = _sweep.TOLERANCE.get((name, torch.float32))
    c_input, c_args, c_kwargs = _sweep._cpu_sample(sample)
    process = sample.output_process_fn_grad

    def run(fn, x, args, kwargs):
        torch.manual_seed(0)
        return fn(x, *args, **kwargs)

    compiled = torch.compile(lambda x, *a, **k: op(x, *a, **k), backend="jax", dynamic=False)
    calls = _stat("compiled_graph_calls") + _stat("compiled_graph_eager_calls")
    try:
        pair = _sweep.raises_same(
            lambda: run(op, c_input, c_args, c_kwargs),
            lambda: run(compiled, sample.input, sample.args, sample.kwargs),
            name,
        )
    except _sweep.Mismatch as e:
        # (Dynamo's own failures, which its state from earlier tests can bring: the same
        # code through Dynamo alone, on the CPU, tells)
        torch._dynamo.reset()
        try:
            run(torch.compile(lambda x, *a, **k: op(x, *a, **k), backend="eager"), c_input, c_args, c_kwargs)
        except Exception as cpu_error:  # noqa: BLE001
            pytest.skip(f"torch.compile fails on the CPU too: {type(cpu_error).__name__}: {str(cpu_error)[:200]}")
        raise e
    if pair is not None:
        got = _sweep.tie_free(name, sample.input, sample.args, sample.kwargs, process(pair[1]))
        expected = _sweep.tie_free(name, c_input, c_args, c_kwargs, process(pair[0]))
        _sweep.compare(got, expected, random=random, where=name, tol=tol)
    if _stat("compiled_graph_calls") + _stat("compiled_graph_eager_calls") == calls and pair is not None:
        pytest.skip("Dynamo ran it without a graph (a graph break at the op)")
    inplace = op.inplace_variant
    if inplace is None or random or not isinstance(sample.input, torch.Tensor):
        return
    torch._dynamo.reset()
    compiled_inplace = torch.compile(lambda x, *a, **k: inplace(x, *a, **k), backend="jax", dynamic=False)

    def run_inplace(fn, x, args, kwargs):
        x = x.clone()
        fn(x, *args, **kwargs)
        return x

    try:
        torch._dynamo.reset()
        torch.compile(lambda x, *a, **k: inplace(x, *a, **k), backend="aot_eager", dynamic=False)(
            c_input.clone(), *c_args, **c_kwargs
        )
    except torch._dynamo.exc.BackendCompilerFailed as e:  # (AOTAutograd's limits, on every device)
        pytest.skip(f"torch.compile refuses the in-place variant on the CPU too: {str(e).splitlines()[1][:200]}")
    except Exception:  # noqa: BLE001 (an error of the arguments: compared below)
        pass
    torch._dynamo.reset()
    pair = _sweep.raises_same(
        lambda: run_inplace(inplace, c_input, c_args, c_kwargs),
        lambda: run_inplace(compiled_inplace, sample.input, sample.args, sample.kwargs),
        name + " in-place",
    )
    if pair is not None:
        _sweep.compare(pair[1], pair[0], random=False, where=name + " in-place", tol=tol)


# ---------------------------------------------------------------- nanoGPT-style training


class _CausalSelfAttention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.c_attn = torch.nn.Linear(d, 3 * d)
        self.c_proj = torch.nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class _GPT(torch.nn.Module):
    """The shape of nanoGPT's model: pre-norm blocks, causal attention through SDPA, GELU
    MLPs, the embedding tied to the output layer, cross-entropy inside forward."""

    def __init__(self, vocab=64, block=16, d=32, heads=4, layers=2):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(block, d)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                dict(
                    ln_1=torch.nn.LayerNorm(d),
                    attn=_CausalSelfAttention(d, heads),
                    ln_2=torch.nn.LayerNorm(d),
                    mlp=torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)),
                )
            )
            for _ in range(layers)
        )
        self.ln_f = torch.nn.LayerNorm(d)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets=None):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = x + blk["attn"](blk["ln_1"](x))
            x = x + blk["mlp"](blk["ln_2"](x))
        logits = self.lm_head(self.ln_f(x))
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def _nanogpt_losses(device: str, steps: int = 4):
    torch.manual_seed(0)
    model = _GPT().to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95)
    )
    if device == "jax":
        model = torch.compile(model)  # as nanoGPT's train.py does: the default backend
    data = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(steps):
        x, y = data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_nanogpt_style_training_with_the_default_compile_matches_cpu():
    expected = _nanogpt_losses("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_jax.CompileWarning)
        calls = _stat("compiled_graph_calls")
        got = _nanogpt_losses("jax")
    assert _stat("compiled_graph_calls") - calls >= 8  # (the forward and backward of every step)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-4, atol=1e-5)
