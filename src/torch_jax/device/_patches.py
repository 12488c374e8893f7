"""Python-level fixes for PyTorch behaviour that a C++ backend gets from C++ and a
Python PrivateUse1 backend does not. Each leaves every other device untouched."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import io
import logging
import sys
import threading

import torch

from torch_jax.device import _flex, _ray

NAME = "jax"


def install() -> None:
    _patch_storage_pickle()
    _patch_module_apply()
    _patch_hub_kernels()
    _patch_max_memory()
    _patch_pipelines()
    _patch_training_args()
    on_import("torch.nn.attention.flex_attention", _flex.allow_jax)  # NOTE [FlexAttention on jax]
    on_import("ray.train.torch.config", _ray.patch_torch_config)  # NOTE [Ray Train on jax]
    on_import("ray.train.v2._internal.execution.worker_group.worker_group", _ray.patch_worker_group)


def _patch_storage_pickle() -> None:
    """NOTE [Pickling storages]: ``pickle``/``multiprocessing`` reduce a tensor to its
    storage, and PyTorch reduces a storage with the legacy ``torch.save`` format, which
    reads device storages through ``from_blob`` on the raw data pointer: a new
    StorageImpl without our payload. jax storages are reduced with the current format
    instead (the one ``torch.save`` uses), which copies them through the storage itself
    and restores them on the same jax device."""
    for cls in (torch.UntypedStorage, torch.storage.TypedStorage):
        reduce = cls.__reduce__

        def __reduce__(self, _reduce=reduce):
            if getattr(self, "_untyped_storage", self).device.type != NAME:  # (TypedStorage.device warns)
                return _reduce(self)
            buf = io.BytesIO()
            torch.save(self, buf)
            return (torch.storage._load_from_bytes, (buf.getvalue(),))

        cls.__reduce__ = __reduce__


_applying = threading.local()


def _patch_module_apply() -> None:
    """NOTE [Tied parameters across .to("jax")]: ``Module._apply`` (``.to``, ``.half``...)
    keeps each Parameter object and swaps its data with ``param.data = new`` only when
    PyTorch's C++ ``_has_compatible_shallow_copy_type`` says the two tensor types match,
    which it says for CPU/CUDA/XPU/... but not for PrivateUse1. Otherwise it wraps every
    converted tensor in a new Parameter, slot by slot, so a parameter shared by two
    modules (tied embeddings and output layer) would become two. After the outermost
    ``_apply``, slots that shared one Parameter before and now hold jax parameters get one
    Parameter again, as on CUDA (and back from jax to the CPU).

    The new Parameter is a plain one, too, where ``param.data = new`` keeps the object and
    so its class: a lazy module's ``UninitializedParameter`` would become an empty
    initialized Parameter and its first forward would fail. A wrapped parameter of a
    subclass gets its class back, by the same ``__class__`` assignment PyTorch's own
    ``materialize()`` uses."""
    apply = torch.nn.Module._apply

    def _apply(self, fn, recurse=True):
        if getattr(_applying, "active", False):
            return apply(self, fn, recurse)
        slots: dict[int, list[tuple[torch.nn.Module, str]]] = {}
        classes = []  # (module, key, class, on jax) of Parameter subclasses
        modules = self.modules() if recurse else (self,)
        for m in modules:
            for key, p in m._parameters.items():
                if p is not None:
                    slots.setdefault(id(p), []).append((m, key))
                    if type(p) is not torch.nn.Parameter and isinstance(p, torch.nn.Parameter):
                        classes.append((m, key, type(p), _is_jax(p)))
        tied = [(s, _is_jax(s[0][0]._parameters[s[0][1]])) for s in slots.values() if len(s) > 1]
        _applying.active = True
        try:
            out = apply(self, fn, recurse)
        finally:
            _applying.active = False
        for m, key, cls, was_jax in classes:
            p = m._parameters[key]
            if type(p) is torch.nn.Parameter and (was_jax or _is_jax(p)):
                p.__class__ = cls
        for group, was_jax in tied:
            first = group[0][0]._parameters[group[0][1]]
            if not (was_jax or _is_jax(first)):
                continue
            for m, key in group[1:]:
                m._parameters[key] = first
        return out

    torch.nn.Module._apply = _apply


def _is_jax(t) -> bool:
    return t is not None and t.device.type == NAME


# NOTE [Meta kernels without importing dynamo]: PyTorch's Python meta kernels (its refs
# and decompositions, which the executor runs for every op's errors and output shapes)
# are wrapped in ``torch._disable_dynamo``, whose first call imports ``torch._dynamo``
# (and FSDP, DTensor's ops and symbolic shapes through it): 1.5-2.5 s in a process that
# only runs eager ops (measured on the 2-core EPYC, 2026-12-07), which PyTorch's own CPU
# and CUDA kernels never pay. Without ``torch._dynamo`` imported nothing can be tracing,
# so disabling it is running the function; that wrapper looks up the disabled function
# it made on the wrapped one (``fn.__dynamo_disable``), and this puts there one that runs
# the function until ``torch._dynamo`` exists, then removes itself and calls the wrapper
# again, which makes its own. Wrappers made after this runs (modules imported later)
# keep their import.
def defer_dynamo_in_meta_kernels() -> None:
    if "torch._dynamo" in sys.modules:
        return  # (imported already: nothing to defer)
    import gc

    from torch import _compile

    code = _compile._disable_dynamo(lambda: None).__code__
    if "__dynamo_disable" not in code.co_consts or "fn" not in code.co_freevars:
        return  # (another PyTorch's wrapper: left as it is)
    slot = code.co_freevars.index("fn")
    for inner in gc.get_referrers(code):
        if getattr(inner, "__code__", None) is not code:
            continue
        fn = inner.__closure__[slot].cell_contents
        if getattr(fn, "__dynamo_disable", None) is None:
            try:
                fn.__dynamo_disable = functools.partial(_until_dynamo, fn, inner)
            except AttributeError:
                pass


def _until_dynamo(fn, inner, *args, **kwargs):
    if getattr(sys.modules.get("torch._dynamo"), "disable", None) is None:
        return fn(*args, **kwargs)
    vars(fn).pop("__dynamo_disable", None)  # (another thread may have)
    return inner(*args, **kwargs)


def on_import(name: str, patch) -> None:
    """Runs ``patch(module)`` on module ``name`` once it is imported (at once if it is)."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _PatchOnImport(name, patch))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                self.patch(module)

            spec.loader.exec_module = exec_and_patch
        return spec


# NOTE [Hub kernels on jax]: transformers (5.25 on, with the `kernels` package it now
# installs) kernelizes every model it loads and again at each ``model.train()``/``eval()``,
# and ``kernels`` refuses a device type it does not know ("Unsupported device type
# 'jax'"). No hub kernel is built for jax, so on a jax model kernelizing runs with an
# empty kernel mapping, which gives every layer its PyTorch forward (what transformers'
# own ``reset_kernels`` does), as kernelizing with no kernel found does on other devices.
# transformers is patched when it imports the module, or at once if it already has.
#
# Where the model was loaded with a device map, the map says where it runs (offloaded
# parameters sit on "meta"): ``device_map="auto"`` and accelerate's planning give device
# indices (``{"": 0}``), which name the current accelerator as ``torch.device(0)`` does,
# so jax here. The first device that is not "cpu" or "disk" is the one it runs on, as
# transformers reads the map, and it is kept on the model (as a ``torch.device``, which
# transformers' later kernelizations read; its own int 0 would be falsy) for the
# kernelizations of ``train()``/``eval()``.
def _patch_hub_kernels() -> None:
    on_import("transformers.integrations.hub_kernels", _wrap_kernelize)


def _wrap_kernelize(hub_kernels) -> None:
    kernelize = getattr(hub_kernels, "kernelize", None)
    if kernelize is None or getattr(kernelize, "_torch_jax", False):
        return

    @functools.wraps(kernelize)
    def wrapper(model, mode=None, kernel_config=None, device_map=None):
        if device_map is not None:
            runs_on = _device_of_map(device_map)
            if _names_jax(runs_on):
                model._kernels_device = torch.device(runs_on)
        runs_on = getattr(model, "_kernels_device", None)
        if not _names_jax(model.device if runs_on is None else runs_on):
            return kernelize(model, mode=mode, kernel_config=kernel_config, device_map=device_map)
        from transformers.utils.kernel_config import KernelConfig

        model._kernels_device = "cpu"  # (a device kernels knows; the mapping is empty)
        # (kernels warns of each layer that the empty mapping lacks: "No kernel mapping found
        # for layer ...", five times for a two-layer GPT-2, which no other device shows; the
        # logger is the one transformers' own ``suppress_kernels_logging`` quiets)
        log = logging.getLogger("kernels._internals.layer.layer")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            kernelize(model, mode=mode, kernel_config=KernelConfig(kernel_mapping={}, inherit_mapping=False))
        finally:
            log.setLevel(level)
            if runs_on is None:
                model.__dict__.pop("_kernels_device", None)
            else:
                model._kernels_device = runs_on

    wrapper._torch_jax = True
    hub_kernels.kernelize = wrapper
    modeling_utils = sys.modules.get("transformers.modeling_utils")
    if modeling_utils is not None and getattr(modeling_utils, "kernelize", None) is kernelize:
        modeling_utils.kernelize = wrapper


def _device_of_map(device_map: dict):
    """The device a model loaded with ``device_map`` runs on (its first value that is not
    "cpu" or "disk", else "cpu"), as transformers' ``kernelize`` reads the map."""
    return next((d for d in device_map.values() if d not in ("cpu", "disk")), "cpu")


def _names_jax(device) -> bool:
    """``device`` (a torch.device, a string, or an accelerator index) is a jax device."""
    if isinstance(device, (str, int)) and not isinstance(device, bool):
        try:
            device = torch.device(device)  # (an int: the current accelerator's device of that index)
        except (RuntimeError, ValueError):  # ("disk", and names that are no device)
            return False
    return isinstance(device, torch.device) and device.type == NAME


# NOTE [Device-map memory on XLA:CPU]: ``device_map="auto"`` plans with accelerate's
# ``get_max_memory``: each accelerator's free memory (``torch.accelerator.get_memory_info``,
# which is ``torch.jax.mem_get_info``: the PJRT allocator's limit less its bytes in use on
# a GPU or TPU), then the host's free memory as "cpu", where offloaded layers wait. On
# XLA:CPU a jax device's buffers are host memory, so that budget counted the host's
# memory twice, and a model larger than it was planned into memory half on jax:0 and half
# on "cpu", rather than offloaded to disk as on a CPU-only machine. accelerate drops "cpu"
# for the devices that share host memory (MPS, integrated CUDA GPUs); on XLA:CPU it is
# dropped the same way. A ``max_memory`` the caller gives is theirs and is kept.
def _patch_max_memory() -> None:
    on_import("accelerate.utils.modeling", _wrap_get_max_memory)


def _wrap_get_max_memory(modeling) -> None:
    get_max_memory = getattr(modeling, "get_max_memory", None)
    if get_max_memory is None or getattr(get_max_memory, "_torch_jax", False):
        return

    @functools.wraps(get_max_memory)
    def wrapper(max_memory=None):
        planned = get_max_memory(max_memory)
        if max_memory is None and _host_is_the_device():
            planned.pop("cpu", None)
        return planned

    wrapper._torch_jax = True
    modeling.get_max_memory = wrapper
    # (names bound before the patch: accelerate's re-export, transformers' import of it,
    # as ``get_max_memory`` in 5.0 and ``accelerate_max_memory`` in 5.25)
    for module, name in (
        ("accelerate.utils", "get_max_memory"),
        ("transformers.integrations.accelerate", "get_max_memory"),
        ("transformers.integrations.accelerate", "accelerate_max_memory"),
    ):
        if getattr(sys.modules.get(module), name, None) is get_max_memory:
            setattr(sys.modules[module], name, wrapper)


def _host_is_the_device() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == NAME and torch.jax.get_device_properties(0).platform == "cpu"


# NOTE [Pipelines on jax]: a pipeline takes its device as an index of the accelerator
# (``device=0``; given none, the first device of the model's ``hf_device_map``, else 0)
# and turns an index into a device through the accelerators transformers knows (CUDA,
# XPU, MPS, NPU...): an index of any other is the CPU. So with transformers 5.0,
# ``pipeline(..., device_map="auto")`` moved the model that accelerate had put on jax:0
# back to the CPU (a one-device map leaves no ``hf_device_map``; 5.25 passes the model's
# device itself), a model split by a device map got its inputs on the CPU, and
# ``device=0`` meant the CPU. Where jax is the accelerator, an index names a jax device
# here, as ``torch.device(0)`` does; given no device, a pipeline runs on jax:0, as it runs
# on cuda:0 (transformers' default index is 0), except that a model already on a jax
# device stays there. A device the caller names (``"cpu"``, a ``torch.device``, -1) is
# left alone.
def _patch_pipelines() -> None:
    on_import("transformers.pipelines.base", _wrap_pipeline_init)


def _wrap_pipeline_init(base) -> None:
    cls = getattr(base, "Pipeline", None)
    init = None if cls is None else cls.__dict__.get("__init__")
    if init is None or getattr(init, "_torch_jax", False):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        model = kwargs.get("model", args[0] if args else None)
        mapped = getattr(model, "hf_device_map", None)
        device = kwargs.get("device")
        if mapped is None:
            if device is None:
                on = getattr(model, "device", None)
                device = on if _names_jax(on) else 0
            if _names_jax(device) and (_is_index(device) or isinstance(device, torch.device)):
                kwargs["device"] = torch.device(device)
            return init(self, *args, **kwargs)
        init(self, *args, **kwargs)  # (a device beside a device map is an error there)
        first = next(iter(mapped.values()), None)
        if device is None and _is_index(first) and _names_jax(first):
            self.device = torch.device(first)

    __init__._torch_jax = True
    cls.__init__ = __init__


def _is_index(device) -> bool:
    return isinstance(device, int) and not isinstance(device, bool) and device >= 0


# NOTE [The Trainer's device]: accelerate (1.16) finds the accelerator through
# ``torch.accelerator``, so its state, and the Trainer's data loader with it, put batches
# on ``jax``; transformers' ``TrainingArguments`` (5.25) knows accelerators only by name
# and, finding no CUDA, chooses ``ACCELERATE_TORCH_DEVICE`` or the CPU, where the Trainer
# then puts the model: the first step failed with tensors on two devices. Where accelerate
# chose a jax device and transformers the CPU without being asked to (``use_cpu``,
# ``ACCELERATE_USE_CPU``), the arguments take accelerate's device, as they take CUDA's.
def _patch_training_args() -> None:
    on_import("transformers.training_args", _wrap_setup_devices)


def _wrap_setup_devices(training_args) -> None:
    cls = getattr(training_args, "TrainingArguments", None)
    prop = None if cls is None else cls.__dict__.get("_setup_devices")
    if not isinstance(prop, functools.cached_property) or getattr(prop.func, "_torch_jax", False):
        return
    setup = prop.func

    @functools.wraps(setup)
    def _setup_devices(self):
        device = setup(self)
        state = getattr(self, "distributed_state", None)
        chosen = getattr(state, "device", None)
        if device.type == "cpu" and _names_jax(chosen) and not self.use_cpu:
            device = torch.device(NAME, 0 if chosen.index is None else chosen.index)
        return device

    _setup_devices._torch_jax = True
    wrapped = functools.cached_property(_setup_devices)
    wrapped.__set_name__(cls, "_setup_devices")
    cls._setup_devices = wrapped


_originals: dict = {}  # while filled in: (owner, name) -> what PyTorch had there


def fill_current_device(on: bool) -> None:
    """NOTE [The current device in .to("jax")]: ``tensor.to("jax")`` (and ``Module.to``,
    ``torch.tensor(..., device="jax")``, ``torch.as_tensor``) must go to the current jax
    device, as ``.to("cuda")`` goes to ``torch.cuda.current_device()``. PyTorch fills in a
    missing index from the backend's device guard before any kernel sees it, and a Python
    backend's guard always answers device 0. So while another device is current
    (``torch.jax.set_device(1)``, ``with torch.jax.device(1)``, DeviceMesh under torchrun),
    those three are wrapped to fill in the current index themselves (``on``); with device 0
    current again PyTorch's own are back. The wrapper of ``Tensor.to`` joins the methods an
    uninitialized (lazy) parameter allows, which PyTorch lists by identity."""
    if on == bool(_originals):
        return
    if not on:
        for (owner, name), original in _originals.items():
            setattr(owner, name, original)
        allowed = torch.nn.parameter.UninitializedTensorMixin._allowed_methods
        allowed[:] = [m for m in allowed if not getattr(m, "_torch_jax_fill", False)]
        _originals.clear()
        return
    from torch_jax.device import _state

    def fill(device):
        if device == NAME or (isinstance(device, torch.device) and device.type == NAME and device.index is None):
            return torch.device(NAME, _state.current())
        return device

    to = torch.Tensor.to

    @functools.wraps(to)
    def to_current(self, *args, **kwargs):
        if args and isinstance(args[0], (str, torch.device)):
            args = (fill(args[0]),) + args[1:]
        elif "device" in kwargs:
            kwargs["device"] = fill(kwargs["device"])
        return to(self, *args, **kwargs)

    to_current._torch_jax_fill = True
    _originals[(torch.Tensor, "to")] = to
    torch.Tensor.to = to_current
    torch.nn.parameter.UninitializedTensorMixin._allowed_methods.append(to_current)
    for name in ("tensor", "as_tensor"):
        make = getattr(torch, name)

        @functools.wraps(make)
        def make_current(data, *args, _make=make, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = fill(kwargs["device"])
            return _make(data, *args, **kwargs)

        _originals[(torch, name)] = make
        setattr(torch, name, make_current)
