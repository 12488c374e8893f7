"""``torch.autocast("jax")`` with PyTorch's CUDA autocast policy.

PyTorch registers its autocast kernels in C++ for CUDA, CPU, MPS and a few other
backends; for PrivateUse1 it registers none, so the backend's fallthrough (see
_registration) lets every op run in the dtype it was given. These Python kernels at
the ``AutocastPrivateUse1`` key cast the arguments as CUDA's kernels do, then call
the op again below autocast.

NOTE [Autocast kernels only run inside autocast]: the dispatcher reaches an
``AutocastPrivateUse1`` kernel only while that key is not excluded from the
thread-local dispatch key set, which is what ``torch.is_autocast_enabled("jax")``
reads; ``torch.autocast("jax", enabled=False)`` excludes it again. So the kernels
do not check the flag themselves: they run for every matching op inside an enabled
region and never outside one.

Unlike CUDA there is no cast cache: CUDA keeps the low-precision copy of each fp32
leaf weight for the rest of the autocast region, in a C++ cache that
``torch.autocast.__exit__`` clears and that Python kernels cannot reach. A weight
used twice in one region (a tied embedding, an RNN cell in a loop) is cast twice.

NOTE [Cheap autoload] applies: this module imports nothing but torch.
"""

from __future__ import annotations

import torch

NAME = "jax"
KEY = "AutocastPrivateUse1"
aten = torch.ops.aten

# ---- the CUDA policy, as data ----
# From PyTorch's aten/src/ATen/autocast_mode.h (the AT_FORALL_LOWER_PRECISION_FP,
# AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE
# and AT_FORALL_PROMOTE lists) and autocast_mode.cpp (``TORCH_LIBRARY_IMPL(aten,
# Autocast, m)``, the CUDA registrations), as shipped with torch 2.13 (the header is
# in the wheel, torch/include/ATen/autocast_mode.h). "name" is the default overload,
# "name.overload" another one. The CUDA-only cudnn_convolution and
# cudnn_convolution_transpose are left out: they never reach the jax device.

# Floating arguments cast to the autocast dtype (torch.get_autocast_dtype("jax")).
LOWER_PRECISION_FP = (
    "_convolution.deprecated",
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
)

# Floating arguments cast to float32.
FP32 = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)

# Ops with an optional ``dtype``: when none is given and the first argument is
# eligible, dtype=float32 (the input is not cast; the op computes in float32).
FP32_SET_OPT_DTYPE = (
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord",
    "sum",
    "sum.dim_IntList",
)

# (overload without a dtype, overload it runs as with dtype=float32 appended, or the
# first argument's dtype when that is not eligible)
FP32_APPEND_DTYPE = (
    ("norm.Scalar", "norm.ScalarOpt_dtype"),
    ("norm.ScalarOpt_dim", "norm.ScalarOpt_dim_dtype"),
)

# Floating arguments cast to the widest floating dtype among the Tensor and Tensor[]
# arguments (float32 if any is float32, else the autocast dtype; float64 is ignored).
# cat and stack left this list: they promote natively.
PROMOTE = (
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
)

# Ops that raise under autocast, with CUDA's message.
BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
        "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast."
    ),
}

# ---- eligibility and casts (CUDA's is_eligible and cached_cast, without the cache) ----

# floating point and not float64
_ELIGIBLE = frozenset(
    d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_floating_point and d is not torch.float64
)
_FLOAT32 = torch.float32
_BELOW = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

REGISTERED: dict = {}  # op overload -> policy name
MISSING: list[str] = []  # policy entries this torch does not have
_lib = None


def _eligible(x) -> bool:
    return x.dtype in _ELIGIBLE and x.device.type == NAME


def _cast(x, dtype):
    if x is not None and x.dtype is not dtype and x.dtype in _ELIGIBLE and x.device.type == NAME:
        return x.to(dtype)
    return x


def _cast_args(args, tensors, lists, dtype):
    args = list(args)
    n = len(args)  # the dispatcher leaves out trailing arguments equal to their defaults
    for i in tensors:
        if i < n:
            args[i] = _cast(args[i], dtype)
    for i in lists:
        if i < n:
            args[i] = [_cast(t, dtype) for t in args[i]]
    return args


def _cast_kwargs(kwargs, names, dtype):
    for name in names:
        if name in kwargs:
            kwargs[name] = _cast(kwargs[name], dtype)


def _prioritize(current, x, low):
    """CUDA's ``prioritize``: the promote type after seeing ``x``."""
    d = x.dtype
    if d not in _ELIGIBLE or x.device.type != NAME:
        return current  # float64, integers and other devices do not take part
    if current is _FLOAT32 or d is _FLOAT32:
        return _FLOAT32
    if current is low and d is low:
        return low
    raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")


# ---- kernels ----


class _Slots:
    """Where an op's tensor arguments are: positional Tensor (``required``) and Tensor?
    (``optional``) positions, Tensor[] positions, kwarg-only Tensor/Tensor? names."""

    def __init__(self, op):
        self.required, self.optional, self.lists, self.kw = [], [], [], []
        for i, a in enumerate(op._schema.arguments):
            t = str(a.type)
            if t not in ("Tensor", "Optional[Tensor]", "List[Tensor]"):
                continue
            if a.kwarg_only:
                if t == "List[Tensor]":
                    raise RuntimeError(f"torch_jax: autocast of {op}: kwarg-only Tensor[] {a.name!r} is not handled")
                self.kw.append(a.name)
            elif t == "List[Tensor]":
                self.lists.append(i)
            elif t == "Tensor":
                self.required.append(i)
            else:
                self.optional.append(i)
        self.tensors = tuple(sorted(self.required + self.optional))
        self.required, self.lists, self.kw = tuple(self.required), tuple(self.lists), tuple(self.kw)


def _cast_to(op, dtype_of):
    """A kernel that casts the eligible floating arguments to ``dtype_of(args)``."""
    s = _Slots(op)
    tensors, lists, kw = s.tensors, s.lists, s.kw

    def kernel(*args, **kwargs):
        dtype = dtype_of(args)
        args = _cast_args(args, tensors, lists, dtype)
        if kw:
            _cast_kwargs(kwargs, kw, dtype)
        with torch._C._ExcludeDispatchKeyGuard(_BELOW):
            return op(*args, **kwargs)

    return kernel


def _lower_precision_fp(op):
    return _cast_to(op, lambda args: torch.get_autocast_dtype(NAME))


def _fp32(op):
    return _cast_to(op, lambda args: _FLOAT32)


def _fp32_set_opt_dtype(op):
    (pos,) = [i for i, a in enumerate(op._schema.arguments) if a.name == "dtype"]
    if op._schema.arguments[pos].kwarg_only:
        pos = None

    def kernel(*args, **kwargs):
        if _eligible(args[0]) and kwargs.get("dtype") is None:
            if pos is not None and pos < len(args):
                if args[pos] is None:
                    args = (*args[:pos], _FLOAT32, *args[pos + 1 :])
            else:
                kwargs["dtype"] = _FLOAT32
        with torch._C._ExcludeDispatchKeyGuard(_BELOW):
            return op(*args, **kwargs)

    return kernel


def _fp32_append_dtype(op, target):
    # the target overload has no defaults for the arguments op may leave out
    defaults = tuple(a.default_value if a.has_default_value() else None for a in op._schema.arguments)

    def kernel(*args):
        dtype = _FLOAT32 if _eligible(args[0]) else args[0].dtype
        args = args + defaults[len(args) :]
        with torch._C._ExcludeDispatchKeyGuard(_BELOW):
            return target(*args, dtype=dtype)

    return kernel


def _promote(op):
    s = _Slots(op)
    required, lists = s.required, s.lists

    def widest(args):
        low = torch.get_autocast_dtype(NAME)
        dtype = low
        n = len(args)
        # Tensor and Tensor[] arguments choose the type; Tensor? ones (bilinear's bias) are only cast
        for i in required:
            if i < n:
                dtype = _prioritize(dtype, args[i], low)
        for i in lists:
            if i < n:
                for t in args[i]:
                    dtype = _prioritize(dtype, t, low)
        return dtype

    return _cast_to(op, widest)


def _banned(message):
    def kernel(*args, **kwargs):
        raise RuntimeError(message)

    return kernel


# ---- registration ----


def _overload(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(aten, packet, None), overload or "default", None)


def _impl(name: str, policy: str, make) -> None:
    op = _overload(name)
    if op is None:
        MISSING.append(name)
        return
    _lib.impl(op, make(op), KEY)
    REGISTERED[op] = policy


def register() -> None:
    """Register the autocast kernels of the jax device (once; called by _registration)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (kernels for aten ops at AutocastPrivateUse1)
    for name in LOWER_PRECISION_FP:
        _impl(name, "lower_precision_fp", _lower_precision_fp)
    for name in FP32:
        _impl(name, "fp32", _fp32)
    for name in FP32_SET_OPT_DTYPE:
        _impl(name, "fp32_set_opt_dtype", _fp32_set_opt_dtype)
    for name, target in FP32_APPEND_DTYPE:
        target_op = _overload(target)
        if target_op is None:
            MISSING.append(target)
        else:
            _impl(name, "fp32_append_dtype", lambda op, t=target_op: _fp32_append_dtype(op, t))
    for name in PROMOTE:
        _impl(name, "promote", _promote)
    for name, message in BANNED.items():
        _impl(name, "banned", lambda op, m=message: _banned(m))
