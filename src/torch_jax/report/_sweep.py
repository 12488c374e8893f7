"""The OpInfo conformance sweep: PyTorch's OpInfo database run on ``jax`` against CPU.

One function, :func:`check`, runs every sample input of one OpInfo in one dtype on the
device and on the CPU and compares them: outputs (values, dtype, shape), the in-place
and ``out=`` variants, and for differentiable ops in float32/float64 the gradients.
The test module and the coverage report both use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import traceback
import warnings

import torch

import torch_jax

DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
    torch.complex64,
]
GRAD_DTYPES = (torch.float32, torch.float64)

# OpInfo name (with variant) -> why it is not compared at all
EXCLUDED = {
    "as_strided.partial_views": "samples are views into a larger storage; copying a view to another device "
    "copies only the view (as on CUDA), so the two runs see different storages",
    "chalf": "complex32 has no JAX dtype (a documented unsupported dtype)",
    "sparse.sampled_addmm": "runs on jax through the sparse CPU fallback (no jax kernel for its sparse op yet; "
    "tests/test_sparse.py checks it with gradients)",
    "sparse.mm.reduce": "runs on jax through the sparse CPU fallback (no jax kernel for its sparse op yet; "
    "tests/test_sparse.py checks it with gradients)",
    "jiterator_unary": "jiterator is a CUDA-only feature",
    "jiterator_binary": "jiterator is a CUDA-only feature",
    "jiterator_binary_return_by_ref": "jiterator is a CUDA-only feature",
    "jiterator_4inputs_with_extra_args": "jiterator is a CUDA-only feature",
    "jiterator_2inputs_2outputs": "jiterator is a CUDA-only feature",
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu": "the CPU's own attention kernel (an OpInfo from "
    "torch 2.14), which PyTorch dispatches only for CPU tensors and has no CUDA kernel for; the jax device's "
    "attention is scaled_dot_product_attention's (tests/test_attention.py)",
}

# (OpInfo name, dtype) -> why that pair is not compared
EXCLUDED_PAIRS = {
    ("matrix_exp", torch.bfloat16): "PyTorch's CPU kernel returns inf/nan for half types (it reads its double "
    "coefficient tables as the half type): there is no reference to compare with",
    ("matrix_exp", torch.float16): "PyTorch's CPU kernel returns inf/nan for half types (it reads its double "
    "coefficient tables as the half type): there is no reference to compare with",
    ("view_as_complex", torch.float16): "the result is complex32, which has no JAX dtype (a documented unsupported "
    "dtype)",
    ("complex", torch.float16): "the result is complex32, which has no JAX dtype (a documented unsupported dtype)",
    ("polar", torch.float16): "the result is complex32, which has no JAX dtype (a documented unsupported dtype; "
    "torch 2.14's CPU supports it)",
}

# OpInfo name -> why its out= variant is not compared
NO_OUT_CHECK = {
    "fft.ihfftn": "PyTorch's CPU ihfftn(out=) over one dim never writes out (a PyTorch bug): "
    "the CPU run leaves the out tensor uninitialized",
    # measured: CPU ihfft2(x, dim=0, out=o) leaves o as it was (filled with 0, 1 or 2,
    # it still holds 0, 1 or 2); ours runs the same composite and leaves o as it was too
    "fft.ihfft2": "PyTorch's ihfft2(out=) over one dim (dim=0) never writes out, as ihfftn's (a PyTorch bug): "
    "the out tensors keep their uninitialized contents",
}

# ops whose results are random or uninitialized: only shapes and dtypes are compared
RANDOM = {
    "bernoulli", "normal", "normal.number_mean", "normal.in_place", "multinomial", "rand_like", "randn_like",
    "randint", "randint_like", "uniform", "exponential", "geometric", "log_normal", "cauchy",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train", "nn.functional.feature_alpha_dropout.without_train",
    "nn.functional.rrelu", "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "svd_lowrank", "pca_lowrank", "randn", "rand",
    "empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted",
    "torch.ops.aten._efficientzerotensor",
}  # fmt: skip

# (rtol, atol) overrides where results legitimately differ more than PyTorch's defaults:
# XLA and oneDNN sum long convolutions in different orders; the CPU computes attention
# with a blocked online softmax, we compute it directly
TOLERANCE = {
    # cov's gradients are differences of large sums of products (the weights' gradient
    # cancels to ~1e-4 from terms ~40): float32 summation order shows at ~1e-4 absolute
    ("cov", torch.float32): (1e-5, 5e-4),
    # PyTorch's CPU Bessel approximations are off by up to ~3e-7 for 5 < x < 25 in double;
    # ours agree with scipy (j0(5.1) = -0.14433475, the CPU gives -0.14433507)
    ("special.bessel_j0", torch.float64): (1e-6, 1e-6),
    ("special.bessel_j1", torch.float64): (1e-6, 1e-6),
    ("special.bessel_y0", torch.float64): (1e-6, 1e-6),
    ("special.bessel_y1", torch.float64): (1e-6, 1e-6),
    # the CPU's single-precision complex pow is itself ~1.4e-6 off the exact value
    ("pow", torch.complex64): (5e-6, 1e-5),
    ("__rpow__", torch.complex64): (5e-6, 1e-5),
    ("special.log_ndtr", torch.float32): (1e-5, 1e-5),
    # kl_div subtracts two terms of similar size (xlogy(t, t) - t * x); in bfloat16 our
    # xlogy rounds once from float32 (as CUDA's does), the CPU rounds the log to bfloat16
    # first: 1 ulp apart (0.002 at 0.33), which the subtraction leaves as 4% of a 0.026
    # result (float64: 0.02650; CPU 0.02637, ours 0.02539)
    ("nn.functional.kl_div", torch.bfloat16): (1.6e-2, 2e-3),
    # the grid's gradient sums over channels and corners: summation order shows at ~1e-5
    ("grid_sampler_2d", torch.float32): (1e-4, 1e-4),
    ("grid_sampler_3d", torch.float32): (1e-4, 2e-4),
    ("nn.functional.grid_sample", torch.float32): (1e-4, 1e-4),
    # pocketfft and XLA's FFT, and LAPACK paths, round float32 differently at ~1e-5
    ("fft.hfft2", torch.float32): (1e-4, 1e-4),
    # (integer inputs transform in float32 too; at the worst samples, of values up to
    # 180-400, the CPU's results are 1.9e-5 to 4.1e-5 from float64 and ours 1.7e-5 to
    # 3.8e-5, at different elements)
    ("fft.hfft2", torch.int64): (1e-4, 1e-4),
    ("fft.hfft2", torch.int32): (1e-4, 1e-4),
    ("fft.hfft2", torch.complex64): (1e-4, 1e-4),
    ("fft.fft2", torch.int64): (1e-4, 1e-4),
    ("fft.fft2", torch.int32): (1e-4, 1e-4),
    ("linalg.tensorsolve", torch.float32): (1e-4, 1e-4),
    # the CPU's own float32 CTC gradient is 7.6e-5 from the float64 one
    ("nn.functional.ctc_loss", torch.float32): (1e-4, 1e-4),
    # the gradient of a size-1 weight sums the whole input: summation order shows at 5e-5
    ("nn.functional.layer_norm", torch.float32): (1e-4, 1e-4),
    ("native_layer_norm", torch.float32): (1e-4, 1e-4),
    # addbmm sums a batch of products: on a 2-core AMD EPYC (AVX2) XLA's dot and MKL
    # round that sum apart by 1.8e-5 at an element of 2.7 (2026-12-02; within the default
    # on the AVX-512 Xeon)
    ("addbmm", torch.float32): (1e-5, 5e-5),
    # four squarings in matrix_exp magnify MKL's and XLA's different matmul rounding
    ("matrix_exp", torch.float32): (1e-4, 1e-5),
    ("matrix_exp", torch.complex64): (1e-4, 1e-5),
    # float32 gradients through triangular solves and least squares: the forward matches
    # at the default tolerance, the backward (more solves) differs by ~3e-5
    ("triangular_solve", torch.float32): (1e-4, 1e-4),
    # (householder_product's gradient reaches 773 at sample 7: the CPU's is 4.4e-3 from the
    # float64 gradient there, ours 9.0e-3, 1.2e-5 of the largest element)
    ("linalg.householder_product", torch.float32): (3e-4, 1e-4),
    ("linalg.lstsq", torch.float32): (1e-4, 1e-4),
    ("linalg.lstsq.grad_oriented", torch.float32): (1e-4, 1e-4),
    ("linalg.pinv.hermitian", torch.float32): (1e-4, 1e-4),
    # SVD gradients scale the singular vectors' rounding by 1/(s_i^2 - s_j^2); jaxlib's
    # LAPACK rounds float32 vectors ~3x further from the float64 ones than PyTorch's
    # does, so at the worst sample (batched 5x5, gradient up to 2.4) the CPU's float32
    # gradient is 1.0e-5 from the float64 gradient and ours 7.3e-5
    ("svd", torch.float32): (1e-4, 1e-4),
    ("linalg.svd", torch.float32): (1e-4, 1e-4),
    # eig's float32 gradient: the CPU's is 1.6e-5 from the float64 gradient (up to 2.9),
    # ours 1.8e-6
    ("linalg.eig", torch.float32): (1e-4, 1e-4),
    # multi_dot's gradients chain products up to 1.1e4 (sample 6): the CPU's float32
    # gradients are up to 8.8e-4 from float64, ours 6.6e-4
    ("linalg.multi_dot", torch.float32): (1e-5, 1e-4),
    # masked.normalize's gradients reach 3.1e4 at sample 22; the CPU's float32 gradient
    # and ours are both 6.3e-4 from float64 (at different elements)
    ("masked.normalize", torch.float32): (1e-5, 1e-4),
    # (the CPU's blocked online softmax and ours round differently; against float64, at the
    # 7 samples without dropout among the first 13, the CPU's outputs are 6.6e-7 to 9.7e-6
    # off and ours 6.6e-7 to 7.0e-6, at values up to 9; the gradients are as close as the
    # CPU's: NOTE [Attention's backward])
    ("nn.functional.scaled_dot_product_attention", torch.float32): (1e-4, 1e-4),
    ("nn.functional.conv_transpose3d", torch.float32): (1e-4, 1e-4),
    ("nn.functional.conv_transpose3d", torch.complex64): (1e-4, 1e-4),
    ("nn.functional.conv3d", torch.float32): (1e-4, 1e-4),
    ("nn.functional.conv3d", torch.complex64): (1e-4, 1e-4),
    ("nn.functional.conv_transpose2d", torch.float32): (1e-4, 1e-4),
    ("nn.functional.conv2d", torch.float32): (1e-4, 1e-4),
    # (sample 26, two groups: the CPU's complex64 result and ours are both ~7e-5 from the
    # complex128 one at an element of 390, 2.2e-5 apart)
    ("nn.functional.conv2d", torch.complex64): (1e-4, 1e-4),
}


def _arg(args, kwargs, pos, name, default):
    return args[pos] if len(args) > pos else kwargs.get(name, default)


def tie_free(name, x, args, kwargs, out):
    """Outputs of selection ops with the index among equal values made irrelevant.

    PyTorch leaves unspecified which of several equal elements an unstable sort, topk,
    kthvalue, median or mode returns the index of (the CPU's choice follows its
    quickselect/introsort); CUDA picks differently too. So indices are compared through
    the values they select: ``x.gather(dim, indices)``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or name not in _SELECTION:
        return out
    dim_pos, keep_pos, default_dim = _SELECTION[name]
    if name in ("sort", "argsort") and kwargs.get("stable", False):
        return out
    if name in ("median", "nanmedian", "mode") and not isinstance(out, tuple):
        return out
    dim = _arg(args, kwargs, dim_pos, "dim", default_dim)
    keepdim = keep_pos is not None and _arg(args, kwargs, keep_pos, "keepdim", False)

    def select(indices):
        i = indices if keep_pos is None or keepdim else indices.unsqueeze(dim)
        picked = x.gather(dim, i)
        return picked if keep_pos is None or keepdim else picked.squeeze(dim)

    if name == "argsort":
        return select(out)
    values, indices = out
    if name == "topk" and not _arg(args, kwargs, 3, "sorted", True):
        return values.sort(dim).values, select(indices).sort(dim).values
    return values, select(indices)


# OpInfo name -> (position of dim in the sample's args, of keepdim (None: no reduction), default dim)
_SELECTION = {
    "sort": (0, None, -1),
    "argsort": (0, None, -1),
    "topk": (1, None, -1),
    "kthvalue": (1, 2, -1),
    "median": (0, 1, None),
    "nanmedian": (0, 1, None),
    "mode": (0, 1, -1),
}


def name_of(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def opinfos():
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def supported(op, dtype) -> bool:
    return dtype in op.supported_dtypes("cpu")


def random_sample(name: str, sample) -> bool:
    """Samples of deterministic ops that draw random numbers (attention dropout)."""
    kw = sample.kwargs
    if name == "nn.functional.multi_head_attention_forward":  # dropout_p is its 11th argument
        return bool(kw.get("training")) and sample.args[9] > 0
    return bool(kw.get("dropout_p", 0))


@dataclasses.dataclass
class Result:
    """The outcome of one OpInfo in one dtype."""

    op: str
    dtype: str
    status: str  # pass | fail | skip
    samples: int = 0
    message: str = ""
    fallback_ops: dict = dataclasses.field(default_factory=dict)  # aten op -> calls through the CPU fallback


class Mismatch(AssertionError):
    pass


@contextlib.contextmanager
def fallback_mode(mode: str):
    before = torch_jax.config.fallback
    torch_jax.config.fallback = mode
    try:
        yield
    finally:
        torch_jax.config.fallback = before


def _cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(y) for y in x)
    return x


def to_cpu_arg(x):
    """A sample argument for the CPU run: tensors copied, jax devices become the CPU."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, torch.device) and x.type != "cpu":
        return torch.device("cpu")
    if isinstance(x, str) and x.split(":")[0] == torch._C._get_privateuse1_backend_name():
        return "cpu"
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu_arg(y) for y in x)
    if isinstance(x, dict):
        return {k: to_cpu_arg(v) for k, v in x.items()}
    return x


def _cpu_device(x):
    """A device argument for the CPU run (tensors are left alone)."""
    return x if isinstance(x, torch.Tensor) else to_cpu_arg(x)


def _cpu_sample(sample):
    return to_cpu_arg(sample.input), to_cpu_arg(tuple(sample.args)), to_cpu_arg(dict(sample.kwargs))


def compare(got, expected, *, random: bool, where: str, tol=None) -> None:
    """``got`` (from the device) equals ``expected`` (from the CPU)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise Mismatch(f"{where}: expected a tensor, got {type(got).__name__}")
        if got.dtype != expected.dtype:
            raise Mismatch(f"{where}: dtype {got.dtype} != {expected.dtype}")
        if got.shape != expected.shape:
            raise Mismatch(f"{where}: shape {tuple(got.shape)} != {tuple(expected.shape)}")
        if not random:
            rtol, atol = tol if tol is not None else (None, None)
            try:
                torch.testing.assert_close(
                    got.cpu(), expected, rtol=rtol, atol=atol, equal_nan=True, check_device=False
                )
            except AssertionError as e:
                raise Mismatch(f"{where}: {e}") from None
    elif isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            raise Mismatch(f"{where}: expected a sequence of {len(expected)}")
        for i, (g, e) in enumerate(zip(got, expected)):
            compare(g, e, random=random, where=f"{where}[{i}]", tol=tol)
    elif isinstance(expected, (bool, int, float, complex)) and not random:
        try:
            torch.testing.assert_close(got, expected, equal_nan=True)
        except AssertionError as e:
            raise Mismatch(f"{where}: {e}") from None


def raises_same(fn_cpu, fn_dev, where: str):
    """Run both; if the CPU raises, the device must raise the same type. Returns
    (expected, got) or None when both raised."""
    try:
        expected = fn_cpu()
    except Exception as e:  # noqa: BLE001
        try:
            fn_dev()
        except Exception as d:  # noqa: BLE001
            if not isinstance(d, type(e)) and not isinstance(e, type(d)):
                raise Mismatch(f"{where}: CPU raises {type(e).__name__}, jax raises {type(d).__name__}: {d}") from None
            return None
        raise Mismatch(f"{where}: CPU raises {type(e).__name__} ({e}), jax does not") from None
    return expected, fn_dev()


def outputs(result):
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        return [r for r in result if isinstance(r, torch.Tensor)]
    return []


LOW_PRECISION = (torch.bfloat16, torch.float16)


class _Reference:
    """The op computed on the CPU in float64 from the same sample (low-precision tensors
    upcast), for judging bfloat16/float16 results; computed when first asked for."""

    def __init__(self, op, sample, name, dtype):
        self.op, self.sample, self.name, self.dtype = op, sample, name, dtype
        self._value = None

    def raw(self):
        if self._value is None:

            def up(x):
                if isinstance(x, torch.Tensor):
                    x = x.detach().cpu()
                    return x.double() if x.dtype in LOW_PRECISION else x
                if isinstance(x, (list, tuple)):
                    return type(x)(up(y) for y in x)
                if isinstance(x, torch.dtype) and x == self.dtype:
                    return torch.float64
                return to_cpu_arg(x)

            s = self.sample
            inp, args = up(s.input), [up(a) for a in s.args]
            kwargs = {k: up(v) for k, v in s.kwargs.items()}
            self._value = (self.op(inp, *args, **kwargs), inp, args, kwargs)
        return self._value[0]

    def tie_free(self):
        out = self.raw()
        _, inp, args, kwargs = self._value
        return tie_free(self.name, inp, args, kwargs, self.sample.output_process_fn_grad(out))


def compare_or_as_accurate(got, expected, reference, *, random: bool, where: str, tol):
    """``compare``; for bfloat16/float16 results that differ from the CPU's, accept them
    when they are at least as close to the float64 result as the CPU's are.

    The CPU rounds low-precision arithmetic its own way (bfloat16 conv and pooling sums
    accumulate in bfloat16, log_softmax sums in the input type), XLA accumulates in
    float32; neither is the right answer, float64 is."""
    try:
        compare(got, expected, random=random, where=where, tol=tol)
    except Mismatch:
        gots, exps = outputs(got), outputs(expected)
        if random or not any(e.dtype in LOW_PRECISION for e in exps):
            raise
        try:
            refs = outputs(reference())
        except Exception:  # noqa: BLE001 (no float64 kernel: keep the mismatch)
            raise Mismatch(f"{where}: differs from the CPU and there is no float64 reference") from None
        if len(refs) != len(exps) or not all(as_accurate(g, e, r) for g, e, r in zip(gots, exps, refs)):
            raise


def as_accurate(got, expected, ref, judged=LOW_PRECISION) -> bool:
    """Whether ``got`` is at least as close to the float64 ``ref`` as ``expected`` (the
    CPU's result) is, for results in the ``judged`` dtypes; others must match."""
    if expected.dtype not in judged:
        return torch.equal(got.cpu(), expected) or torch.allclose(got.cpu(), expected, equal_nan=True)
    g, e, r = got.cpu().double(), expected.double(), ref.double()
    if g.shape != r.shape or not torch.equal(g.isnan(), e.isnan()) or not torch.equal(g.isinf(), e.isinf()):
        return False
    finite = e.isfinite()
    if not finite.any():
        return True
    g, e, r = g[finite], e[finite], r[finite]
    slack = torch.finfo(expected.dtype).eps * r.abs().max()
    return bool((g - r).abs().max() <= 2 * (e - r).abs().max() + slack)


def check_sample(op, dtype, sample, *, name: str, index: int, variants: bool) -> None:
    """Compare one sample input on the device with the CPU (raises Mismatch)."""
    random = name in RANDOM or random_sample(name, sample)
    tol = TOLERANCE.get((name, dtype))
    where = f"{name} {str(dtype).replace('torch.', '')} sample {index}"
    c_input, c_args, c_kwargs = _cpu_sample(sample)

    def run_cpu(fn=op):
        torch.manual_seed(0)
        return fn(c_input, *c_args, **c_kwargs)

    def run_dev(fn=op):
        torch.manual_seed(0)
        return fn(sample.input, *sample.args, **sample.kwargs)

    reference = _Reference(op, sample, name, dtype)
    pair = raises_same(run_cpu, run_dev, where)
    if pair is not None:
        # output_process_fn_grad maps outputs that are not unique (the signs of singular
        # vectors, eigenvector phases) to what is, as PyTorch's own CUDA-vs-CPU test does
        process = sample.output_process_fn_grad
        got = tie_free(name, sample.input, sample.args, sample.kwargs, process(pair[1]))
        expected = tie_free(name, c_input, c_args, c_kwargs, process(pair[0]))
        compare_or_as_accurate(got, expected, reference.tie_free, random=random, where=where, tol=tol)
    if not variants or random:
        return
    inplace = op.inplace_variant
    if inplace is not None and isinstance(sample.input, torch.Tensor):

        def run_inplace_cpu():
            x = c_input.clone()
            return inplace(x, *c_args, **c_kwargs), x

        def run_inplace_dev():
            x = sample.input.clone()
            return inplace(x, *sample.args, **sample.kwargs), x

        pair = raises_same(run_inplace_cpu, run_inplace_dev, where + " in-place")
        if pair is not None:
            compare_or_as_accurate(
                pair[1][1], pair[0][1], reference.raw, random=False, where=where + " in-place (self)", tol=tol
            )
    if op.supports_out and name not in NO_OUT_CHECK:
        _check_out(op, run_cpu, c_input, c_args, c_kwargs, sample, where, tol, reference)


def _check_out(op, run_cpu, c_input, c_args, c_kwargs, sample, where: str, tol, reference) -> None:
    """The out= variant writes the same values into preallocated outputs."""
    try:
        expected = run_cpu()
    except Exception:  # noqa: BLE001
        return
    if isinstance(expected, torch.Tensor):
        out_cpu = torch.empty_like(expected)
        out_dev = torch.empty_like(expected, device="jax")
    elif isinstance(expected, tuple) and expected and all(isinstance(e, torch.Tensor) for e in expected):
        out_cpu = tuple(torch.empty_like(e) for e in expected)
        out_dev = tuple(torch.empty_like(e, device="jax") for e in expected)
    else:
        return

    def cpu():
        torch.manual_seed(0)
        return op(c_input, *c_args, **c_kwargs, out=out_cpu)

    def dev():
        torch.manual_seed(0)
        return op(sample.input, *sample.args, **sample.kwargs, out=out_dev)

    if raises_same(cpu, dev, where + " out=") is not None:
        process = sample.output_process_fn_grad
        got = tie_free(name_of(op), sample.input, sample.args, sample.kwargs, process(out_dev))
        expected = tie_free(name_of(op), c_input, c_args, c_kwargs, process(out_cpu))
        compare_or_as_accurate(got, expected, reference.tie_free, random=False, where=where + " out=", tol=tol)


def _check_grads(op, dtype, sample, *, where: str, tol) -> None:
    """Gradients of a fixed projection of the outputs w.r.t. every input the OpInfo marks
    as differentiable (a sample made with ``requires_grad=True``)."""

    def prepare(device):
        leaves = []

        def mark(t):
            if not isinstance(t, torch.Tensor):
                return t
            wants = t.requires_grad
            t = t.detach().cpu() if device == "cpu" else t.detach()
            if wants:
                t.requires_grad_(True)
                leaves.append(t)
            return t

        s2 = sample.transform(mark)
        kwargs = {k: _cpu_device(v) for k, v in s2.kwargs.items()} if device == "cpu" else s2.kwargs
        return s2.input, s2.args, kwargs, leaves

    def run(device):
        inp, args, kwargs, leaves = prepare(device)
        if not leaves:
            return None
        torch.manual_seed(0)
        out = sample.output_process_fn_grad(op(inp, *args, **kwargs))
        outs = [o for o in outputs(out) if o.requires_grad]
        if not outs:
            return None
        total = 0
        for o in outs:
            g = torch.linspace(-1, 1, o.numel(), dtype=torch.float64).reshape(o.shape)
            if o.dtype.is_complex:
                g = torch.complex(g, -g)
            term = o * g.to(o.dtype).to(o.device)
            total = total + (term.real.sum() if o.dtype.is_complex else term.sum())
        grads = torch.autograd.grad(total, leaves, allow_unused=True)
        return [None if g is None else g.detach().cpu() for g in grads]

    pair = raises_same(lambda: run("cpu"), lambda: run("jax"), where + " grad")
    if pair is None or pair[0] is None:
        return
    for i, (gc, gj) in enumerate(zip(*pair)):
        if (gc is None) != (gj is None):
            raise Mismatch(f"{where} grad[{i}]: one gradient is undefined")
        if gc is not None:
            compare(gj, gc, random=False, where=f"{where} grad[{i}]", tol=tol)


@contextlib.contextmanager
def recording(result: Result, fallback: str):
    """The block runs one sweep case with the CPU fallback in ``fallback`` mode; a Mismatch
    or any other error it raises becomes ``result``'s failure, and the aten ops that ran
    through the CPU fallback go into ``result.fallback_ops``."""
    from torch_jax.runtime import _stats

    before = dict(_stats.fallback_ops)
    # the samples call deprecated PyTorch APIs, which warn on both devices alike
    with fallback_mode(fallback), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        except Mismatch as e:
            result.status, result.message = "fail", str(e)[:2000]
        except Exception as e:  # noqa: BLE001
            result.status = "fail"
            result.message = (
                f"{type(e).__name__}: {e}"[:2000] + "\n" + "".join(traceback.format_tb(e.__traceback__)[-3:])
            )
    result.fallback_ops = {k: v - before.get(k, 0) for k, v in _stats.fallback_ops.items() if v != before.get(k, 0)}


def _uploaded(sample, dims):
    """``sample`` with each device tensor replaced by a copy uploaded from the CPU (a leaf
    that requires grad where the original did). ``dims``: (the input's, the others')
    dim that forced bucketing pads the upload along, or None (runtime/_buckets'
    ``force_dim``); or ("rows", d): every tensor whose size along ``d`` is the input's
    (a loss's input and targets, not its class weights) along ``d``."""
    from torch_jax.runtime import _buckets

    rows = None
    if dims[0] == "rows":
        d = dims[1]
        first = sample.input if isinstance(sample.input, torch.Tensor) else None
        rows = first.shape[d] if first is not None and first.dim() else -1

    def upload(t):
        if not isinstance(t, torch.Tensor) or t.device.type != "jax":
            return t
        if rows is not None:
            _buckets.force_dim = d if t.dim() and t.shape[d % t.dim()] == rows else None
        return t.detach().cpu().to("jax").requires_grad_(t.requires_grad)

    before = _buckets.force_dim
    try:
        _buckets.force_dim = dims[0]
        sample.input = torch.utils._pytree.tree_map(upload, sample.input)
        _buckets.force_dim = dims[1]
        sample.args = torch.utils._pytree.tree_map(upload, tuple(sample.args))
        sample.kwargs = torch.utils._pytree.tree_map(upload, dict(sample.kwargs))
    finally:
        _buckets.force_dim = before
    return sample


def check(op, dtype, *, max_samples=None, grads=True, variants=True, fallback="error", uploaded=False) -> Result:
    """Run one OpInfo in one dtype; the result says pass/fail/skip and which aten ops
    ran through the CPU fallback. ``uploaded``: each sample's tensors are made on the CPU
    and copied to the device (a batch's path), not made there; with bucketing forced,
    padded along the dims it gives (``_uploaded``)."""
    name = name_of(op)
    result = Result(name, str(dtype).replace("torch.", ""), "pass")
    if name in EXCLUDED or (name, dtype) in EXCLUDED_PAIRS:
        result.status, result.message = "skip", EXCLUDED.get(name) or EXCLUDED_PAIRS[(name, dtype)]
        return result
    with recording(result, fallback):
        samples = op.sample_inputs("jax", dtype, requires_grad=False)
        for i, sample in enumerate(samples):
            if max_samples is not None and i >= max_samples:
                break
            if uploaded:
                sample = _uploaded(sample, uploaded)
            check_sample(op, dtype, sample, name=name, index=i, variants=variants)
            result.samples += 1
        if grads and dtype in GRAD_DTYPES and op.supports_autograd and name not in RANDOM:
            tol = TOLERANCE.get((name, dtype))
            for i, sample in enumerate(op.sample_inputs("jax", dtype, requires_grad=True)):
                if max_samples is not None and i >= max_samples:
                    break
                if random_sample(name, sample):
                    continue
                if uploaded:
                    sample = _uploaded(sample, uploaded)
                where = f"{name} {result.dtype} sample {i}"
                _check_grads(op, dtype, sample, where=where, tol=tol)
    return result
