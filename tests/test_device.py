"""The device: registration and autoload, the torch.jax module, several devices."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import pytest
import torch

from torch_jax.tensor import _storage


def _run(code: str, **env) -> str:
    full_env = dict(os.environ, **env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_autoload_registers_the_device_without_importing_jax():
    out = _run(
        """
        import sys, torch
        print("jax" in sys.modules, "torch_jax" in sys.modules, torch._C._get_privateuse1_backend_name())
        # (as torch.cuda.is_available() leaves CUDA alone; torch 2.14's init_process_group asks)
        print(torch.accelerator.is_available(), torch.jax.is_available(), "jax" in sys.modules)
        x = torch.arange(3.0, device="jax")
        print(x.device, (x * 2).tolist(), "jax" in sys.modules)
        """
    )
    assert out.splitlines() == ["False True jax", "True True False", "jax:0 [0.0, 2.0, 4.0] True"]


def test_eager_ops_leave_dynamo_unimported_and_torch_compile_works_after_them():
    """NOTE [Meta kernels without importing dynamo]: the ops' Meta kernels (PyTorch's refs,
    wrapped in torch._disable_dynamo) run without importing torch._dynamo; torch.compile
    after them, which does, traces through the same refs disabled as PyTorch disables them."""
    out = _run(
        """
        import sys, torch
        x = torch.arange(6.0, device="jax").reshape(2, 3).requires_grad_()
        y = torch.softmax(x * 2 + 1, -1).where(x > 1, x.tanh())
        y.sum().backward()
        print("torch._dynamo" in sys.modules)
        f = torch.compile(lambda a: torch.softmax(a * 2 + 1, -1).where(a > 1, a.tanh()))
        print(torch.equal(f(x.detach()).cpu(), y.detach().cpu()), "torch._dynamo" in sys.modules)
        """
    )
    assert out.splitlines() == ["False", "True True"], out


def test_importing_torch_jax_before_torch():
    out = _run(
        """
        import torch_jax
        import torch
        print(torch.ones(2, device="jax").sum().item())
        """
    )
    assert out == "2.0"


def test_autoload_can_be_switched_off():
    out = _run(
        """
        import torch
        print(torch._C._get_privateuse1_backend_name())
        import torch_jax
        print(torch._C._get_privateuse1_backend_name(), torch.ones(2, device="jax").sum().item())
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert out.splitlines() == ["privateuseone", "jax 2.0"]


def _run_full(code: str, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env)


def test_autoload_that_cannot_register_warns_once_and_leaves_torch_working():
    # NOTE [Autoload never breaks torch]: a bad setting makes registration fail inside `import torch`
    out = _run_full("import torch; print(torch.ones(2).sum().item())", TORCH_JAX_MODE="nonsense")
    assert out.returncode == 0 and out.stdout.strip() == "2.0"
    lines = [line for line in out.stderr.splitlines() if "RegistrationWarning" in line]
    assert len(lines) == 1, out.stderr
    assert "could not register the jax device (ValueError: TORCH_JAX_MODE='nonsense'" in lines[0]
    assert "torch>=2.11,<2.15" in lines[0] and f"torch {torch.__version__}" in lines[0]
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in lines[0]


def test_autoload_against_a_torch_without_the_backend_api():
    # a torch whose private API for Python backends moved, and PrivateUse1 taken by another backend
    out = _run(
        """
        import warnings, torch
        del torch._C._acc.PrivateUse1Hooks
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch._import_device_backends()  # what `import torch` runs
        print(len(caught), caught[0].category.__name__, "AttributeError" in str(caught[0].message))
        print(torch.ones(2).sum().item(), torch.zeros(1, device="meta").device)
        import torch_jax
        try:
            torch_jax.initialize()
        except RuntimeError as error:
            print("initialize:", "could not register" in str(error), type(error.__cause__).__name__)
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert out.splitlines() == ["1 RegistrationWarning True", "2.0 meta", "initialize: True AttributeError"]


def test_backend_already_taken_and_an_untested_torch_say_so():
    out = _run(
        """
        import warnings, torch
        torch.__version__ = "2.15.0"
        torch.utils.rename_privateuse1_backend("other")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch_jax
        for w in caught:
            print(w.category.__name__, str(w.message).split(";")[0])
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert out.splitlines() == [
        "RegistrationWarning torch_jax supports torch>=2.11,<2.15, jax>=0.10,<0.12",
        "RegistrationWarning torch_jax could not register the jax device (RuntimeError: torch_jax: "
        "PyTorch's PrivateUse1 backend is already registered as 'other'",
    ]


@pytest.mark.two_devices
def test_device_module_api():
    mod = torch.jax
    assert torch.get_device_module("jax") is mod
    assert mod.is_available() and mod.is_initialized()
    assert mod.device_count() == len(jax.devices()) == 2
    assert torch.accelerator.current_accelerator() == torch.device("jax")
    assert torch.accelerator.device_count() == 2
    assert mod.current_device() == 0
    assert mod.get_device_name(0).startswith("cpu")
    props = mod.get_device_properties(1)
    assert props.index == 1 and props.platform == "cpu"
    assert mod.is_bf16_supported()
    assert mod.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    assert isinstance(mod.memory_allocated(), int) and isinstance(mod.memory_stats(), dict)
    assert isinstance(mod.max_memory_allocated(0), int)
    mod.synchronize()
    mod.synchronize(1)
    mod.empty_cache()


@pytest.mark.two_devices
def test_set_device_and_device_context():
    with torch.jax.device(1):
        assert torch.jax.current_device() == 1
        t = torch.empty(2, device="jax")
        assert t.device == torch.device("jax:1")
    assert torch.jax.current_device() == 0
    torch.jax.set_device(1)
    try:
        assert torch.zeros(2, device="jax").device == torch.device("jax:1")
    finally:
        torch.jax.set_device(0)
    with pytest.raises(RuntimeError, match="device jax:5 does not exist"):
        torch.empty(2, device="jax:5")


@pytest.mark.two_devices
def test_to_jax_without_an_index_goes_to_the_current_device():
    """As .to("cuda") goes to the current CUDA device (NOTE [The current device in .to("jax")])."""
    x = torch.arange(3.0)
    with torch.jax.device(1):
        made = {
            "to": x.to("jax"),
            "to device=": x.to(device=torch.device("jax"), dtype=torch.float64),
            "jax:0 to jax": torch.ones(2, device="jax:0").to("jax"),
            "module": torch.nn.Linear(2, 2).to("jax").weight,
            "tensor": torch.tensor([1.0, 2.0], device="jax"),
            "as_tensor": torch.as_tensor(x, device="jax"),
        }
        assert x.to("jax:0").device == torch.device("jax:0")
    for what, t in made.items():
        assert t.device == torch.device("jax:1"), what
    assert made["to device="].dtype == torch.float64 and made["to"].tolist() == [0.0, 1.0, 2.0]
    assert x.to("jax").device == torch.device("jax:0")  # (current again)
    assert torch.Tensor.to is torch._C.TensorBase.to  # (PyTorch's own again)
    with torch.jax.device(1):  # (a lazy module moved while another device is current)
        lazy = torch.nn.LazyLinear(3).to("jax")
        assert lazy(torch.ones(2, 4, device="jax")).device == torch.device("jax:1")


@pytest.mark.two_devices
def test_jax_n_lives_on_jax_device_n():
    t = torch.arange(4.0, device="jax:1")
    assert t.device == torch.device("jax:1")
    assert _storage.array(_storage.box_of(t)).devices() == {jax.devices()[1]}
    u = (t * 2 + 1).exp()
    assert u.device == torch.device("jax:1")
    assert _storage.array(_storage.box_of(u)).devices() == {jax.devices()[1]}
    c = torch.arange(4.0).to("jax:1")
    assert _storage.array(_storage.box_of(c)).devices() == {jax.devices()[1]}


@pytest.mark.two_devices
def test_backward_on_second_device():
    x = torch.arange(3.0, device="jax:1", requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.device == torch.device("jax:1")
    assert x.grad.tolist() == [0.0, 2.0, 4.0]


@pytest.mark.two_devices
def test_mixing_devices_raises_the_cuda_error():
    a = torch.ones(3, device="jax:0")
    b = torch.ones(3, device="jax:1")
    with pytest.raises(
        RuntimeError,
        match="Expected all tensors to be on the same device, but found at least two devices, jax:0 and jax:1!",
    ):
        a + b
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(torch.ones(2, 2, device="jax"), torch.ones(2, 2))
    # CPU scalars (0-dim tensors) mix with device tensors, as on CUDA
    assert (a + torch.tensor(2.0)).tolist() == [3.0, 3.0, 3.0]


def test_manual_seed_rng_state_and_fork_rng():
    torch.manual_seed(7)
    a = torch.randn(5, device="jax")
    state = torch.jax.get_rng_state()
    b = torch.randn(5, device="jax")
    torch.jax.set_rng_state(state)
    b2 = torch.randn(5, device="jax")
    assert torch.equal(b.cpu(), b2.cpu())
    torch.manual_seed(7)
    assert torch.equal(torch.randn(5, device="jax").cpu(), a.cpu())
    assert torch.jax.initial_seed() == 7
    with torch.random.fork_rng(devices=range(torch.jax.device_count()), device_type="jax"):
        torch.randn(5, device="jax")
    assert torch.equal(torch.randn(5, device="jax").cpu(), b.cpu())
    assert len(torch.jax.get_rng_state_all()) == 2
    torch.jax.seed()
    assert torch.jax.initial_seed() != 7


def test_storage_of_the_device():
    s = torch.UntypedStorage(8, device="jax")
    assert s.device == torch.device("jax:0") and s.nbytes() == 8
    t = torch.empty(0, dtype=torch.uint8, device="jax").set_(torch.UntypedStorage([1, 2, 3], device="jax"))
    assert t.tolist() == [1, 2, 3]


def test_new_tensors_do_not_depend_on_the_shared_pycapsule_new():
    """ctypes.pythonapi.PyCapsule_New is one object per process whose argument types any
    library may set (jax.ffi.pycapsule sets a destructor type that rejects None): the
    device's DLPack capsules are built through a prototype of their own."""
    import ctypes

    import jax

    x = torch.arange(6.0, device="jax")
    jax.ffi.pycapsule(ctypes.cast(ctypes.pythonapi.Py_IncRef, ctypes.c_void_p))
    assert ctypes.pythonapi.PyCapsule_New.argtypes[2] is not ctypes.c_void_p  # (what the old code relied on)
    assert (x * 2).cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
