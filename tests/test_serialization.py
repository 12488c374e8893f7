"""torch.save/torch.load, state dicts, safetensors, deepcopy and pickle of device
tensors, views, modules and optimizer state; tied weights through .to("jax")."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import torch_jax
from conftest import to_cpu


def _roundtrip(obj, **load_kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kw)


def test_tensors_and_views_keep_device_and_sharing():
    x = torch.arange(12.0, device="jax:1").reshape(3, 4)
    v = x[1:, ::2]
    d = _roundtrip({"x": x, "v": v, "i": torch.tensor([1, 2], device="jax")})
    assert d["x"].device == torch.device("jax:1") and d["i"].device == torch.device("jax:0")
    torch.testing.assert_close(to_cpu(d["v"]), to_cpu(v))
    assert d["v"].stride() == v.stride() and d["v"].storage_offset() == v.storage_offset()
    d["x"][2, 2] = -1.0  # the view still aliases the base
    assert d["v"][1, 1].item() == -1.0


@pytest.mark.parametrize("where", ["cpu", "jax:0", "jax:1", torch.device("jax", 1)])
def test_map_location(where):
    x = torch.randn(5, device="jax:0")
    y = _roundtrip(x, map_location=where)
    assert y.device == torch.device(where)
    torch.testing.assert_close(to_cpu(y), to_cpu(x))


def test_cpu_checkpoint_loads_into_a_jax_model():
    torch.manual_seed(0)
    src = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    state = _roundtrip(src.state_dict())
    dst = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("jax")
    dst.load_state_dict(state)
    for (k, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert b.device.type == "jax", k
        torch.testing.assert_close(to_cpu(b), a)


def test_whole_module_and_optimizer_state():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2).to("jax")
    opt = torch.optim.AdamW(m.parameters(), lr=0.1, amsgrad=True)
    x = torch.randn(8, 4, device="jax")
    for _ in range(2):
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
    m2 = _roundtrip(m, weights_only=False)
    assert m2.weight.device.type == "jax"
    opt_state = _roundtrip(opt.state_dict())
    assert opt_state["state"][0]["exp_avg"].device.type == "jax"
    opt2 = torch.optim.AdamW(m2.parameters(), lr=0.1, amsgrad=True)
    opt2.load_state_dict(opt_state)
    # the restored pair continues exactly as the original
    for model, o in ((m, opt), (m2, opt2)):
        o.zero_grad()
        model(x).square().mean().backward()
        o.step()
    # strict mode runs the same computations for both pairs: bit for bit. Fused mode
    # compiles each step's graph for its own inputs (which buffers it may overwrite), and
    # XLA may then contract multiply-adds differently: equal within an ulp or so.
    exact = {"rtol": 0, "atol": 0} if torch_jax.config.mode == "strict" else {"rtol": 1e-6, "atol": 1e-7}
    torch.testing.assert_close(to_cpu(m2.weight), to_cpu(m.weight), **exact)


def test_deepcopy_and_pickle():
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()).to("jax")
    for m2 in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert m2[0].weight.device.type == "jax"
        torch.testing.assert_close(to_cpu(m2[0].weight), to_cpu(m[0].weight))
        assert m2[0].weight.untyped_storage().data_ptr() != m[0].weight.untyped_storage().data_ptr()
    x = torch.arange(6.0, device="jax")
    a, b = copy.deepcopy((x, x[2:]))  # deepcopy keeps aliasing within one call, as on CPU
    a[3] = 100.0
    assert b[1].item() == 100.0


def test_safetensors_roundtrip(tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = {"w": torch.randn(3, 4, device="jax"), "b": torch.arange(4, device="jax", dtype=torch.int32)}
    save_file(tensors, tmp_path / "m.safetensors")
    # safetensors checks device names against its own list; load to the CPU, then move
    loaded = {k: v.to("jax") for k, v in load_file(tmp_path / "m.safetensors").items()}
    for k, v in tensors.items():
        torch.testing.assert_close(to_cpu(loaded[k]), to_cpu(v), rtol=0, atol=0)


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(7, 4)
        self.head = torch.nn.Linear(4, 7, bias=False)
        self.head.weight = self.emb.weight


def test_weight_tying_survives_to_jax_and_back():
    m = _Tied().to("jax")
    assert m.head.weight is m.emb.weight and m.emb.weight.device.type == "jax"
    assert len(list(m.parameters())) == 1
    m.to(torch.float64)
    assert m.head.weight is m.emb.weight
    m.cpu()
    assert m.head.weight is m.emb.weight
    # one tensor: the gradient of both uses lands in it
    m = _Tied().to("jax")
    idx = torch.tensor([1, 2], device="jax")
    m.head(m.emb(idx)).sum().backward()
    assert m.emb.weight.grad is m.head.weight.grad
