"""The sparse section of the coverage report: PyTorch's OpInfo sparse samples on jax.

Every OpInfo of ``sparse_unary_ufuncs`` and ``sparse_reduction_ops`` runs on sparse COO
and CSR inputs, on the CPU and on jax; a sample counts only if it runs on the CPU. Unary
ufuncs have no sparse sample functions of their own, so their strided samples are made
sparse as PyTorch's ``test_sparse_consistency`` does (``to_sparse()`` of each input, and
``to_sparse_csr()`` of the 2-d ones); reductions use ``OpInfo.sample_inputs_sparse``.
A result matches when its layout, dtype and shape are the CPU's and its dense values are
equal within ``torch.testing``'s default tolerances.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils._pytree import tree_map

import torch_jax

LAYOUTS = (torch.sparse_coo, torch.sparse_csr)
DTYPES = (torch.float32, torch.float64)
START, END = "<!-- sparse:start -->", "<!-- sparse:end -->"


@dataclasses.dataclass
class Result:
    op: str
    layout: str
    dtype: str
    status: str  # "native", "fallback", "fail", or "skip" (no sample runs on the CPU)
    samples: int = 0
    fallback_ops: tuple = ()
    message: str = ""


def opinfos():
    from torch.testing._internal.common_methods_invocations import sparse_reduction_ops, sparse_unary_ufuncs

    return [*sparse_unary_ufuncs, *sparse_reduction_ops]


def _is_unary(op) -> bool:
    from torch.testing._internal.common_methods_invocations import sparse_unary_ufuncs

    return any(op is u for u in sparse_unary_ufuncs)


def samples(op, layout, dtype):
    """(input, args, kwargs) on the CPU, sparse in ``layout``."""
    if not _is_unary(op):
        for s in op.sample_inputs_sparse(layout, "cpu", dtype):
            yield s.input, s.args, s.kwargs
        return
    if not (op.supports_sparse if layout == torch.sparse_coo else op.supports_sparse_csr):
        return
    for s in op.sample_inputs("cpu", dtype):
        x = s.input
        if layout == torch.sparse_coo and x.dim() > 0:
            yield x.to_sparse(), s.args, s.kwargs
        elif layout == torch.sparse_csr and x.dim() == 2:
            yield x.to_sparse_csr(), s.args, s.kwargs


def _to(device):
    return lambda x: x.detach().to(device) if isinstance(x, torch.Tensor) else x


def compare(got, expected) -> None:
    """Raise AssertionError unless ``got`` (jax) matches ``expected`` (CPU)."""
    if not isinstance(expected, torch.Tensor):
        assert got == expected, f"{got!r} != {expected!r}"
        return
    assert got.device.type == "jax", f"result on {got.device}"
    assert got.layout == expected.layout, f"layout {got.layout} != {expected.layout}"
    assert got.dtype == expected.dtype, f"dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} != {tuple(expected.shape)}"
    got = got.cpu()
    if expected.layout != torch.strided:
        got, expected = got.to_dense(), expected.to_dense()
    torch.testing.assert_close(got, expected, equal_nan=True)


def check(op, layout, dtype, max_samples=None) -> Result:
    """Run ``op``'s sparse samples on jax, comparing with the CPU; fallbacks are allowed
    and recorded."""
    result = Result(op.name, str(layout).replace("torch.", ""), str(dtype).replace("torch.", ""), "skip")
    before = dict(torch_jax.stats()["fallback_ops"])
    saved, torch_jax.config.fallback = torch_jax.config.fallback, "silent"
    try:
        for x, args, kwargs in samples(op, layout, dtype):
            if max_samples is not None and result.samples >= max_samples:
                break
            try:
                expected = op(x, *args, **kwargs)
            except Exception:  # the CPU does not support this sample: not counted
                continue
            result.samples += 1
            try:
                got = op(*tree_map(_to("jax"), (x, *args)), **tree_map(_to("jax"), kwargs))
                compare(got, expected)
            except Exception as e:  # noqa: BLE001 (a report records every failure)
                result.status, result.message = "fail", f"{type(e).__name__}: {e}".splitlines()[0][:300]
                break
    finally:
        torch_jax.config.fallback = saved
    after = torch_jax.stats()["fallback_ops"]
    result.fallback_ops = tuple(sorted(k for k, n in after.items() if n > before.get(k, 0)))
    if result.status != "fail" and result.samples:
        result.status = "fallback" if result.fallback_ops else "native"
    return result


def run(dtypes=DTYPES, max_samples=None, progress=False):
    results = []
    for op in opinfos():
        for layout in LAYOUTS:
            for dtype in dtypes:
                results.append(check(op, layout, dtype, max_samples))
                if progress:
                    r = results[-1]
                    print(f"sparse {r.op} {r.layout} {r.dtype}: {r.status} ({r.samples} samples)", flush=True)
    return results


MARKS = {"native": "ok", "fallback": "fb", "fail": "FAIL", "skip": ""}


def markdown(results) -> list[str]:
    """The sparse section of COVERAGE.md: one row per OpInfo, one column per (layout, dtype)."""
    columns = sorted({(r.layout, r.dtype) for r in results}, key=lambda c: (c[0] != "sparse_coo", c[1]))
    rows: dict = {}
    for r in results:
        rows.setdefault(r.op, {})[r.layout, r.dtype] = MARKS[r.status]
    native = sum(r.status == "native" for r in results)
    ran = sum(r.status != "skip" for r in results)
    lines = [
        START,
        "## Sparse tensors (OpInfo sparse samples)",
        "",
        "The OpInfos of `sparse_unary_ufuncs` and `sparse_reduction_ops` on sparse COO and CSR inputs "
        "(`src/torch_jax/report/_sparse.py`, `tests/test_sparse.py`); only samples that run on the CPU count. "
        "`ok`: matches the CPU with no op through the sparse CPU fallback; `fb`: matches with some op through it; "
        "`FAIL`: does not match; blank: no sample runs on the CPU in that layout.",
        "",
        f"**{native} of {ran} (OpInfo, layout, dtype) cases match the CPU with no CPU fallback.**",
        "",
        "| OpInfo | " + " | ".join(f"{layout.replace('sparse_', '')} {dtype}" for layout, dtype in columns) + " |",
        "| --- |" + " --- |" * len(columns),
    ]
    lines += [f"| {op} | " + " | ".join(row.get(c, "") for c in columns) + " |" for op, row in rows.items()]
    fallbacks = sorted({name for r in results if r.status == "fallback" for name in r.fallback_ops})
    lines += ["", "Ops through the sparse CPU fallback: " + (", ".join(f"`{n}`" for n in fallbacks) or "none.")]
    failing = [r for r in results if r.status == "fail"]
    lines += ["", "Failing cases: " + ("none." if not failing else "")]
    lines += [f"- {r.op} {r.layout} {r.dtype}: {r.message.replace('|', '/')}" for r in failing]
    return lines + [END]
