"""``torch-jax scan PATH``: the CUDA assumptions in a workload's Python sources.

For someone moving a PyTorch workload off CUDA (to the ``jax`` device or any other), each
finding names a line that assumes CUDA and its device-agnostic form, concrete for that line
where the line allows it. The scan reads the syntax tree (``ast``), so comments, docstrings
and strings that merely mention CUDA are left alone; it never imports or runs the code.

Kinds: ``cuda-call`` (``x.cuda()``), ``cuda-device-string`` (``"cuda"`` used as a device,
``x.is_cuda``), ``torch-cuda-api`` (``torch.cuda.*``), ``cudnn-flag``
(``torch.backends.cudnn/cuda.*``), ``nccl``, ``cuda-extension`` (CUDA C++ extensions and
``.cu`` files), ``triton-kernel``, ``pin-memory``, ``cuda-env`` (``CUDA_VISIBLE_DEVICES``
and friends); ``syntax-error`` and ``unreadable`` for a file that was not scanned.
"""

from __future__ import annotations

import argparse
import ast
import collections
import copy
import dataclasses
import json
import os
import re
import sys
import warnings

ACCELERATOR = "torch.accelerator.current_accelerator()"
# where a CPU-only machine must keep working, as `"cuda" if torch.cuda.is_available() else "cpu"` did
ACCELERATOR_OR_CPU = 'torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")'
DEVICE_NOTE = f"  # device = {ACCELERATOR}"
GUARD = "no device-agnostic equivalent; guard with torch.cuda.is_available()"
DEFAULT_BACKEND = "torch.distributed.get_default_backend_for_device(device)"

# what each kind's findings have in common, for the summary at the end of the report
KINDS = {
    "cuda-call": "move with .to(device) instead of .cuda()",
    "cuda-device-string": 'take the device from torch.accelerator, not the string "cuda"',
    "torch-cuda-api": "torch.accelerator / torch.amp in place of torch.cuda",
    "cudnn-flag": "torch.backends.cudnn/cuda flags affect CUDA only",
    "nccl": "let torch.distributed pick the backend for the device",
    "cuda-extension": "CUDA C++ kernels build and run on CUDA only",
    "triton-kernel": "Triton kernels run on the GPUs Triton targets only",
    "pin-memory": "pinning assumes a CUDA host allocator",
    "cuda-env": "CUDA environment variables affect CUDA only",
    "syntax-error": "files that do not parse, not scanned",
    "unreadable": "files that could not be read, not scanned",
}
NOT_SCANNED = "this file was not scanned"

SKIPPED_DIRS = frozenset({"venv", "__pycache__", "site-packages", "node_modules", "build", "dist"})
CUDA_SOURCE_SUFFIXES = (".cu", ".cuh")

# torch.cuda.<name> -> (its device-agnostic callable, an argument to put first, the names of the
# CUDA function's positional parameters where the replacement takes them as keywords)
_MEMORY = (
    "empty_cache memory_allocated max_memory_allocated memory_reserved max_memory_reserved "
    "memory_stats reset_peak_memory_stats reset_accumulated_memory_stats"
).split()
CUDA_API = {
    "is_available": ("torch.accelerator.is_available", None, ()),
    "device_count": ("torch.accelerator.device_count", None, ()),
    "synchronize": ("torch.accelerator.synchronize", None, ()),
    "current_device": ("torch.accelerator.current_device_index", None, ()),
    "set_device": ("torch.accelerator.set_device_index", None, ()),
    "device": ("torch.accelerator.device_index", None, ()),
    "current_stream": ("torch.accelerator.current_stream", None, ()),
    "set_stream": ("torch.accelerator.set_stream", None, ()),
    "Stream": ("torch.Stream", None, ("device", "priority")),
    "Event": ("torch.Event", None, ("enable_timing", "blocking", "interprocess")),
    "mem_get_info": ("torch.accelerator.get_memory_info", None, ()),
    "get_device_capability": ("torch.accelerator.get_device_capability", None, ()),
    "manual_seed": ("torch.manual_seed", None, ()),  # (torch.manual_seed seeds every device)
    "manual_seed_all": ("torch.manual_seed", None, ()),
    "seed": ("torch.seed", None, ()),
    "seed_all": ("torch.seed", None, ()),
    "OutOfMemoryError": ("torch.OutOfMemoryError", None, ()),
    "amp": ("torch.amp", None, ()),
    "amp.autocast": ("torch.amp.autocast", "device.type", ("enabled", "dtype", "cache_enabled")),
    "amp.GradScaler": ("torch.amp.GradScaler", "device.type", ()),
    "amp.custom_fwd": ("torch.amp.custom_fwd", "device_type=device.type", ()),
    "amp.custom_bwd": ("torch.amp.custom_bwd", "device_type=device.type", ()),
    **{name: (f"torch.accelerator.{name}", None, ()) for name in _MEMORY},
}
LEGACY_TENSOR_TYPES = {
    "FloatTensor": "float32",
    "DoubleTensor": "float64",
    "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16",
    "LongTensor": "int64",
    "IntTensor": "int32",
    "ShortTensor": "int16",
    "CharTensor": "int8",
    "ByteTensor": "uint8",
    "BoolTensor": "bool",
}

# torch.backends.<name> -> the device-agnostic (setting, reading) of it
BACKEND_FLAGS = {
    "cudnn.deterministic": ("torch.use_deterministic_algorithms(True)", "torch.are_deterministic_algorithms_enabled()"),
    "cudnn.allow_tf32": (
        'torch.set_float32_matmul_precision("high")',
        'torch.get_float32_matmul_precision() != "highest"',
    ),
    "cuda.matmul.allow_tf32": (
        'torch.set_float32_matmul_precision("high")',
        'torch.get_float32_matmul_precision() != "highest"',
    ),
    "cudnn.benchmark": ("nothing to set: cuDNN autotuning affects CUDA only and is ignored elsewhere",) * 2,
    **{
        f"cuda.{name}": ("with torch.nn.attention.sdpa_kernel([SDPBackend.MATH, ...]):",) * 2
        for name in (
            "sdp_kernel",
            "enable_flash_sdp",
            "enable_mem_efficient_sdp",
            "enable_math_sdp",
            "enable_cudnn_sdp",
        )
    },
}
BACKEND_FLAG = (
    "torch.backends flags affect CUDA only: for determinism torch.use_deterministic_algorithms(True), "
    'for TF32 torch.set_float32_matmul_precision("high"); otherwise drop it on other devices'
)

CUDA_ENV = {
    "CUDA_VISIBLE_DEVICES": "choose the device in code: torch.accelerator.set_device_index(i) or "
    "torch.device(device.type, i) (the variable hides CUDA devices only)",
    "CUDA_LAUNCH_BLOCKING": "call torch.accelerator.synchronize() where an error must surface "
    "(the variable makes CUDA launches synchronous only)",
    "CUDA_DEVICE_ORDER": "no device-agnostic equivalent (the variable orders CUDA devices only)",
    "PYTORCH_CUDA_ALLOC_CONF": "no device-agnostic equivalent "
    "(the variable configures the CUDA caching allocator only)",
}

# keywords and calls whose argument is a device, or a device type
DEVICE_KEYWORDS = frozenset({"map_location", "device_map"})  # (and every keyword with "device" in its name)
TYPE_KEYWORDS = frozenset({"device_type"})
DEVICE_FIRST = frozenset({"set_default_device", "Generator", "Stream", "Event", "get_default_backend_for_device"})
TYPE_FIRST = frozenset(
    {"autocast", "GradScaler", "get_autocast_dtype", "set_autocast_dtype", "is_autocast_enabled", "get_device_module"}
)
BACKEND_FIRST = frozenset({"init_process_group", "new_group"})


@dataclasses.dataclass(frozen=True)
class Finding:
    """One line that assumes CUDA."""

    path: str  # as given, or relative to the scanned directory
    line: int  # 1-based
    col: int  # 0-based, as ast's col_offset
    kind: str
    code: str  # the source line, stripped
    message: str  # what assumes CUDA
    rewrite: str  # the device-agnostic form

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def scan(path: str | os.PathLike) -> list[Finding]:
    """The findings in a Python file, or in every ``*.py`` (and ``.cu``/``.cuh``) file under a
    directory, sorted by (path, line, col). Paths under a directory are relative to it."""
    root = os.fspath(path)
    if os.path.isdir(root):
        findings = []
        for file in _walk(root):
            findings += _scan_file(file, os.path.relpath(file, root).replace(os.sep, "/"))
    elif os.path.exists(root):
        findings = _scan_file(root, root)
    else:
        raise FileNotFoundError(f"torch-jax scan: {root}: no such file or directory")
    return sorted(findings, key=lambda f: (f.path, f.line, f.col, f.kind))


def format_findings(findings: list[Finding], root: str | os.PathLike | None = None) -> str:
    """Terminal text: ``path:line:col: kind: message``, the line and ``-> rewrite`` under it, then
    one line per kind. Columns are 1-based here, as editors read them; ``root``, when given, is the
    directory the paths are relative to and is put in front of them."""
    if not findings:
        return "no CUDA assumptions found"
    lines = []
    for f in findings:
        path = os.path.normpath(os.path.join(os.fspath(root), f.path)) if root is not None else f.path
        lines.append(f"{path}:{f.line}:{f.col + 1}: {f.kind}: {f.message}")
        if f.code:
            lines.append(f"    {f.code}")
        lines.append(f"    -> {f.rewrite}")
    files = len({f.path for f in findings})
    lines += ["", f"{len(findings)} CUDA assumption{'s' * (len(findings) != 1)} in {files} file{'s' * (files != 1)}:"]
    for kind, n in sorted(collections.Counter(f.kind for f in findings).items()):
        lines.append(f"  {kind:<20} {n:>4}  {KINDS.get(kind, '')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="torch-jax scan", description="List the CUDA assumptions in Python sources.")
    parser.add_argument("path", help="a Python file or a directory (searched for *.py, .cu and .cuh files)")
    parser.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not os.path.exists(args.path):
        print(f"torch-jax scan: {args.path}: no such file or directory", file=sys.stderr)
        return 2
    findings = scan(args.path)
    if args.json:
        print(json.dumps([f.as_dict() for f in findings], indent=2))
    else:
        print(format_findings(findings, root=args.path if os.path.isdir(args.path) else None))
    return 0  # a report, not a check: findings are no failure


def _walk(root: str):
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        for name in sorted(files):
            if name.endswith((".py", *CUDA_SOURCE_SUFFIXES)):
                yield os.path.join(folder, name)


def _scan_file(file: str, shown: str) -> list[Finding]:
    if file.endswith(CUDA_SOURCE_SUFFIXES):
        rewrite = f"CUDA kernels run on CUDA only; {_native('its kernels')}"
        return [
            Finding(shown, line=1, col=0, kind="cuda-extension", code="", message="a CUDA source file", rewrite=rewrite)
        ]
    try:
        with open(file, "rb") as f:
            source = f.read().decode("utf-8-sig", errors="replace")
    except OSError as e:  # (a dangling link, a file without read permission)
        message = f"{type(e).__name__}: {e.strerror or e}"
        return [Finding(shown, line=1, col=0, kind="unreadable", code="", message=message, rewrite=NOT_SCANNED)]
    return _scan_source(source, shown)


def _scan_source(source: str, path: str) -> list[Finding]:
    # the line numbers of ast count \n, \r\n and \r only (str.splitlines also splits at \f and others)
    lines = re.split(r"\r\n|\r|\n", source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (SyntaxWarning for invalid escapes in the scanned code)
            tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError) as e:  # (ValueError: null bytes, on older Pythons)
        line = getattr(e, "lineno", None) or 1
        col = max((getattr(e, "offset", None) or 1) - 1, 0)  # (SyntaxError's offset is 1-based)
        code = lines[line - 1].strip() if line <= len(lines) else ""
        message = f"SyntaxError: {getattr(e, 'msg', None) or e}"
        rewrite = f"{NOT_SCANNED}: fix it, or scan with the Python version it targets"
        return [Finding(path, line, col, kind="syntax-error", code=code, message=message, rewrite=rewrite)]
    scanner = _Scanner(tree, lines, path)
    scanner.visit(tree)
    return list(scanner.found.values())


def _cuda_literal(node) -> str | None:
    """For an expression that spells a CUDA device ("cuda", "cuda:1", f"cuda:{rank}",
    "cuda:" + str(rank), "cuda:%d" % rank, "cuda:{}".format(rank)): its index as source text,
    "" when it has none. None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        m = re.fullmatch(r"cuda(?::(\d+))?", node.value)
        return None if m is None else m.group(1) or ""
    if isinstance(node, ast.JoinedStr) and len(node.values) == 2:
        head, index = node.values
        if isinstance(head, ast.Constant) and head.value == "cuda:" and isinstance(index, ast.FormattedValue):
            return ast.unparse(index.value)
    if isinstance(node, ast.BinOp) and isinstance(node.left, ast.Constant):
        if (isinstance(node.op, ast.Add) and node.left.value == "cuda:") or (
            isinstance(node.op, ast.Mod) and node.left.value in ("cuda:%d", "cuda:%s")
        ):
            index = node.right
            if isinstance(index, ast.Call) and _name(index.func) == "str" and len(index.args) == 1:
                index = index.args[0]
            return ast.unparse(index)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        if isinstance(node.func.value, ast.Constant) and node.func.value.value == "cuda:{}" and len(node.args) == 1:
            return ast.unparse(node.args[0])
    return None


def _agnostic(index: str, as_type: bool = False) -> ast.expr:
    """The device-agnostic expression for a CUDA device with this index (or its type)."""
    if as_type:
        text = f"{ACCELERATOR}.type"
    else:
        text = ACCELERATOR if index == "" else f"torch.device({ACCELERATOR}.type, {index})"
    return ast.parse(text, mode="eval").body


class _Agnostic(ast.NodeTransformer):
    """Rewrites every CUDA device in an expression (on a copy): a literal to the current
    accelerator, `"cuda" if ... else "cpu"` to the accelerator or the CPU."""

    def __init__(self, as_type: bool):
        self.as_type = as_type

    def visit(self, node):
        if isinstance(node, ast.IfExp) and any(_cuda_literal(n) is not None for n in (node.body, node.orelse)):
            new = ast.parse(ACCELERATOR_OR_CPU, mode="eval").body
            return ast.Attribute(new, "type", ast.Load()) if self.as_type else new
        index = _cuda_literal(node)
        return super().visit(node) if index is None else _agnostic(index, self.as_type)


def _rewritten(node, as_type: bool = False) -> str:
    return ast.unparse(_Agnostic(as_type).visit(copy.deepcopy(node)))


def _name(node) -> str | None:
    """`a.b.c` as written, or None where the chain does not start with a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _with_device(text: str) -> str:
    """The text, with where `device` comes from where it uses a variable of that name."""
    return text + DEVICE_NOTE if re.search(r"(?<![\w.-])device(?![\w-]|\s*=)", text) else text


def _native(what: str) -> str:
    return f"write {what} with torch ops, or as a JAX/Pallas kernel for the jax device"


class _Scanner(ast.NodeVisitor):
    """One module's findings: names resolved through its imports, each string judged by what
    holds it (a ``device=`` keyword, a comparison, an assignment to ``device``, ...)."""

    def __init__(self, tree: ast.AST, lines: list[str], path: str):
        self.lines, self.path = lines, path
        self.found: dict[tuple[int, int, str], Finding] = {}  # one finding per (line, col, kind)
        self.parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        self.aliases = {}  # local name -> the module or object it was imported as
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def add(self, node, kind: str, message: str, rewrite: str):
        line = node.lineno
        key = (line, node.col_offset, kind)
        code = self.lines[line - 1].strip() if line <= len(self.lines) else ""
        self.found.setdefault(key, Finding(self.path, line, node.col_offset, kind, code, message, rewrite))

    def resolve(self, node) -> str | None:
        """The dotted name a chain refers to, through the module's imports."""
        name = _name(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        head = self.aliases.get(head, head)
        return f"{head}.{rest}" if rest else head

    def called(self, node) -> ast.Call | None:
        parent = self.parents.get(node)
        return parent if isinstance(parent, ast.Call) and parent.func is node else None

    # ---- imports

    def visit_Import(self, node):
        for a in node.names:
            if a.name == "torch.cuda" or a.name.startswith("torch.cuda."):
                self.add(
                    node,
                    "torch-cuda-api",
                    f"imports `{a.name}`",
                    "import torch (torch.accelerator and torch.amp are device-agnostic)",
                )
            elif a.name.split(".")[0] == "triton":
                self._triton(node, f"imports `{a.name}`")

    def visit_ImportFrom(self, node):
        module, names = node.module or "", [a.name for a in node.names]
        if node.level:
            return
        listed = ", ".join(names)
        if module == "torch.cuda.amp" or (module == "torch.cuda" and names == ["amp"]):
            where = "torch.amp" if module == "torch.cuda.amp" else "torch"
            self.add(
                node,
                "torch-cuda-api",
                f"imports CUDA's automatic mixed precision: `from {module} import {listed}`",
                f"from {where} import {listed}  (these take the device type: autocast(device.type), "
                "GradScaler(device.type))",
            )
        elif module == "torch.cuda" or module.startswith("torch.cuda."):
            targets = [self._cuda_api(f"{module}.{name}")[0] for name in names]
            self.add(
                node,
                "torch-cuda-api",
                f"imports CUDA's API: `from {module} import {listed}`",
                "; ".join(f"{name} -> {target}" for name, target in zip(names, targets)),
            )
        elif module == "torch" and "cuda" in names:
            self.add(
                node, "torch-cuda-api", "imports `torch.cuda`", "torch.accelerator / torch.amp in place of torch.cuda"
            )
        elif module == "torch.utils.cpp_extension" and {"CUDAExtension", "CUDA_HOME"} & set(names):
            self._extension(node, f"imports CUDA's C++ extension support: `from {module} import {listed}`")
        elif module.split(".")[0] == "triton":
            self._triton(node, f"imports from `{module}`")

    # ---- names and attributes

    def visit_Attribute(self, node):
        if node.attr == "is_cuda":
            receiver = ast.unparse(node.value)
            self.add(node, "cuda-device-string", "`.is_cuda` is True on CUDA only", f'{receiver}.device.type != "cpu"')
        name = self.resolve(node)
        if name is None:
            self.generic_visit(node)
        else:
            self._chain(node, name)  # (the chain's parts are names and attributes only: nothing else to visit)

    def visit_Name(self, node):
        if node.id in self.aliases:
            self._chain(node, self.aliases[node.id])

    def _chain(self, node, name: str):
        if name == "torch.cuda" or name.startswith("torch.cuda."):
            rewrite = self._cuda_api(name, self.called(node))[1]
            self.add(node, "torch-cuda-api", f"`{name}` works on CUDA only", rewrite)
        elif name.startswith(("torch.backends.cudnn.", "torch.backends.cuda.")):
            self._backend_flag(node, name)
        elif name.endswith("Backend.NCCL"):
            self.add(node, "nccl", "the NCCL backend needs CUDA GPUs", _with_device(DEFAULT_BACKEND))
        elif name.endswith("is_nccl_available"):
            rewrite = f"torch.distributed.is_backend_available({DEFAULT_BACKEND})"
            self.add(node, "nccl", "the NCCL backend needs CUDA GPUs", _with_device(rewrite))
        elif name.endswith(("cpp_extension.CUDAExtension", "cpp_extension.CUDA_HOME")):
            self._extension(node, f"`{name.rpartition('.')[2]}` builds CUDA C++ code")

    def _cuda_api(self, name: str, call: ast.Call | None = None) -> tuple[str, str]:
        """(the replacement of torch.cuda.<name>, the rewrite of its use)."""
        suffix = name.removeprefix("torch.cuda").removeprefix(".").removeprefix("memory.")
        if suffix == "":
            return "torch.accelerator", "torch.accelerator / torch.amp in place of torch.cuda"
        if suffix in LEGACY_TENSOR_TYPES:
            text = f"torch.tensor(data, dtype=torch.{LEGACY_TENSOR_TYPES[suffix]}, device=device)"
            return text, _with_device(text)
        if suffix.split(".")[0] == "nvtx":
            text = "with torch.profiler.record_function(name):"
            return text, f"{text} (a range in every profiler, on every device)"
        if suffix not in CUDA_API:
            return GUARD, GUARD
        target, first, positional = CUDA_API[suffix]
        if call is None:
            return target, target if first is None else f"{target} (it takes {first} first){DEVICE_NOTE}"
        args = [first] if first else []
        for i, arg in enumerate(call.args):
            args.append(f"{positional[i]}={ast.unparse(arg)}" if i < len(positional) else ast.unparse(arg))
        args += [ast.unparse(k) for k in call.keywords]
        return target, _with_device(f"{target}({', '.join(args)})")

    def _backend_flag(self, node, name: str):
        suffix = name.removeprefix("torch.backends.")
        setting, reading = BACKEND_FLAGS.get(suffix, (BACKEND_FLAG, BACKEND_FLAG))
        rewrite = setting if isinstance(node.ctx, ast.Store) else reading
        assigned = self.parents.get(node)
        value = assigned.value if isinstance(assigned, ast.Assign) and node in assigned.targets else None
        if suffix in BACKEND_FLAGS and isinstance(value, ast.Constant) and value.value is False:
            # switching TF32 or determinism off: the settings' strict forms
            rewrite = rewrite.replace('"high"', '"highest"').replace("(True)", "(False)")
        self.add(node, "cudnn-flag", f"`{name}` configures CUDA (cuDNN / cuBLAS) only", rewrite)

    # ---- calls

    def visit_Call(self, node):
        func, name = node.func, self.resolve(node.func) or ""
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and name != "torch.cuda":
            self._cuda_call(node)
        if isinstance(func, ast.Attribute) and func.attr == "pin_memory":
            receiver = ast.unparse(func.value)
            self.add(
                node,
                "pin-memory",
                "`.pin_memory()` assumes a CUDA host allocator (the jax device accepts it)",
                f"{receiver}.pin_memory() if torch.accelerator.is_available() else {receiver}",
            )
        for k in node.keywords:
            if k.arg == "pin_memory" and isinstance(k.value, ast.Constant) and k.value.value is True:
                self.add(
                    k,
                    "pin-memory",
                    "`pin_memory=True` assumes a CUDA host allocator (the jax device accepts it)",
                    "pin_memory=torch.accelerator.is_available(), or leave it off",
                )
            if k.arg in CUDA_ENV and isinstance(func, ast.Attribute) and self.is_environ(func.value):
                self._env(k, k.arg)
        if name.endswith("cpp_extension.load") and self._cuda_sources(node, "sources", 1):
            self._extension(node, "`load` compiles .cu sources")
        elif name.endswith("cpp_extension.load_inline") and self._cuda_sources(node, "cuda_sources", 2):
            self._extension(node, "`load_inline` compiles CUDA sources")
        self.generic_visit(node)

    def _cuda_call(self, node: ast.Call):
        receiver = ast.unparse(node.func.value)
        index = list(node.args) + [k.value for k in node.keywords if k.arg == "device"]
        rest = [ast.unparse(k) for k in node.keywords if k.arg != "device"]
        where = f"torch.device(device.type, {ast.unparse(index[0])})" if index else "device"
        rewrite = f"{receiver}.to({', '.join([where, *rest])}){DEVICE_NOTE}"
        self.add(node, "cuda-call", "`.cuda()` moves to a CUDA device", rewrite)

    @staticmethod
    def _cuda_sources(call: ast.Call, keyword: str, position: int) -> bool:
        given = [k.value for k in call.keywords if k.arg == keyword] + call.args[position : position + 1]
        if keyword == "cuda_sources":
            return any(not (isinstance(v, ast.Constant) and v.value is None) for v in given)
        return any(
            isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith(CUDA_SOURCE_SUFFIXES)
            for v in given
            for n in ast.walk(v)
        )

    def visit_FunctionDef(self, node):
        for decorator in node.decorator_list:
            name = self.resolve(decorator.func if isinstance(decorator, ast.Call) else decorator) or ""
            if name.startswith("triton."):
                self._triton(decorator, f"`@{name}` makes `{node.name}` a Triton kernel", node.name)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _triton(self, node, message: str, kernel: str | None = None):
        what = f"`{kernel}`" if kernel else "the kernel"
        rewrite = f"Triton kernels run only on the GPUs Triton targets; on a jax device {_native(what)}"
        self.add(node, "triton-kernel", message, rewrite)

    def _extension(self, node, message: str):
        self.add(
            node, "cuda-extension", message, f"CUDA C++ kernels build and run on CUDA only; {_native('the kernels')}"
        )

    # ---- strings: devices, backends, environment variables

    def visit(self, node):
        # a device spelled as an f-string, a % or a .format is one literal: judged here, as a whole
        index = _cuda_literal(node)
        if index is None:
            return super().visit(node)
        self._device(node, index)
        self.generic_visit(node)  # (the index expression, in "cuda:{}".format(...))

    def visit_Constant(self, node):
        if not isinstance(node.value, str):
            return
        if node.value in CUDA_ENV and self._in_environ(node):
            self._env(node, node.value)
        elif " " not in node.value and "nccl" in re.split(r"[:,]", node.value.lower()):
            self._nccl(node)

    def _context(self, node):
        """The expression the string is a part of (through `a if c else b`, `a or b` and tuples),
        and what holds that expression."""
        top = node
        while isinstance(self.parents.get(top), (ast.IfExp, ast.BoolOp, ast.Tuple, ast.List, ast.Set)):
            parent = self.parents[top]
            if isinstance(parent, ast.IfExp) and top is parent.test:
                break
            top = parent
        return top, self.parents.get(top)

    def _device(self, node, index: str):
        """A CUDA device literal: a finding where it is used as a device."""
        top, parent = self._context(node)
        rewrite = None
        if isinstance(parent, ast.keyword) and parent.arg:
            if parent.arg in TYPE_KEYWORDS:
                rewrite = _rewritten(parent, as_type=True)
            elif "device" in parent.arg or parent.arg in DEVICE_KEYWORDS:
                rewrite = _rewritten(parent)
            elif parent.arg == "default" and self._option_named(parent, "device"):
                rewrite = f"default=str({_rewritten(top)})"
        elif isinstance(parent, ast.Call) and top in parent.args:
            name = self.resolve(parent.func) or ""
            last = name.rpartition(".")[2]
            if name == "torch.device" and top is parent.args[0]:
                rewrite = _rewritten(top) if len(parent.args) == 1 else _rewritten(parent, as_type=True)
            elif isinstance(parent.func, ast.Attribute) and parent.func.attr == "to":
                rewrite = _rewritten(parent)
            elif last in DEVICE_FIRST | TYPE_FIRST and top is parent.args[0]:
                rewrite = _rewritten(parent, as_type=last in TYPE_FIRST)
            elif (
                isinstance(parent.func, ast.Attribute)
                and parent.func.attr in ("startswith", "endswith")
                and "device" in ast.unparse(parent.func.value)
            ):
                rewrite = f'{self._device_type(parent.func.value)} != "cpu"'
        elif isinstance(parent, ast.Compare) and self._compared_with(top, parent, "device", ".type"):
            rewrite = self._comparison(top, parent)
        elif isinstance(parent, ast.arguments):
            rewrite = self._default(top, parent)
        elif isinstance(parent, (ast.Assign, ast.AnnAssign)) and self._target_named(parent, "device", "dev"):
            rewrite = _rewritten(parent).strip()
        elif isinstance(parent, ast.Dict) and top in parent.values:
            key = parent.keys[parent.values.index(top)]
            if isinstance(key, ast.Constant) and "device" in str(key.value):
                rewrite = f"{ast.unparse(key)}: {_rewritten(top)}"
        elif isinstance(parent, ast.Return) and "device" in self._function_name(parent):
            rewrite = _rewritten(parent)
        if rewrite is not None:
            shown = ast.unparse(node)
            self.add(node, "cuda-device-string", f"the device {shown} names CUDA", rewrite)

    def _device_type(self, node) -> str:
        """Source text for the device type of a device, a device string or a device type."""
        if isinstance(node, ast.Call) and _name(node.func) == "str" and len(node.args) == 1:
            node = node.args[0]
        text = ast.unparse(node)
        return text if text.endswith(".type") else f"torch.device({text}).type"

    @staticmethod
    def _other_side(top, compare: ast.Compare):
        """(what a string is compared with, the operator)"""
        sides = [compare.left, *compare.comparators]
        i = sides.index(top)
        return (sides[i - 1], compare.ops[i - 1]) if i else (sides[1], compare.ops[0])

    def _compared_with(self, top, compare: ast.Compare, *words: str) -> bool:
        """Whether the string is compared with something its source names as a device (or a
        backend): `x.device.type == "cuda"` is, `func.attr == "cuda"` is not."""
        text = ast.unparse(self._other_side(top, compare)[0])
        return any(w in text for w in words)

    def _comparison(self, top, compare: ast.Compare) -> str:
        other, op = self._other_side(top, compare)
        if top is not compare.left and not isinstance(top, ast.Constant | ast.JoinedStr | ast.BinOp | ast.Call):
            # `device.type in ("cuda", "cpu")`: the accelerator's type takes CUDA's place in the collection
            return _rewritten(compare, as_type=True)
        if top is compare.left and isinstance(op, ast.In | ast.NotIn):
            # `"cuda" in device_types`, or a substring of `str(device)`
            if not (isinstance(other, ast.Call) and _name(other.func) == "str"):
                return _rewritten(compare, as_type=True)
            op = ast.Eq() if isinstance(op, ast.In) else ast.NotEq()
        same = isinstance(op, ast.Eq | ast.Is | ast.In)
        return f'{self._device_type(other)} {"!=" if same else "=="} "cpu"'

    @staticmethod
    def _default(top, arguments: ast.arguments) -> str:
        positional = arguments.posonlyargs + arguments.args
        if top in arguments.defaults:
            name = positional[len(positional) - len(arguments.defaults) + arguments.defaults.index(top)].arg
        else:
            name = arguments.kwonlyargs[arguments.kw_defaults.index(top)].arg
        return f"{name}=None, and in the body: {name} = {name} or {_rewritten(top)}"

    def _target_named(self, assign, *words: str) -> bool:
        targets = assign.targets if isinstance(assign, ast.Assign) else [assign.target]
        for target in targets:
            name = (target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")).lower()
            if any(w in name.split("_") or (len(w) > 3 and w in name) for w in words):
                return True
        return False

    def _option_named(self, keyword: ast.keyword, word: str) -> bool:
        """Whether the keyword is `default=` of an argparse option whose name has the word."""
        call = self.parents.get(keyword)
        first = call.args[0] if isinstance(call, ast.Call) and call.args else None
        return isinstance(first, ast.Constant) and isinstance(first.value, str) and word in first.value

    def _function_name(self, node) -> str:
        while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node = self.parents.get(node)
        return node.name if node is not None else ""

    def _nccl(self, node):
        top, parent = self._context(node)
        rewrite = None
        if isinstance(parent, ast.keyword) and parent.arg and "backend" in parent.arg:
            call = self.parents.get(parent)
            if parent.arg == "backend" and isinstance(call, ast.Call):
                rewrite = self._without_backend(call, parent)
            else:
                rewrite = f"{parent.arg}={DEFAULT_BACKEND}"
        elif isinstance(parent, ast.keyword) and parent.arg == "default" and self._option_named(parent, "backend"):
            rewrite = "default=None (init_process_group() then picks the backend for the device)"
        elif isinstance(parent, ast.Call) and parent.args and top is parent.args[0]:
            if (self.resolve(parent.func) or "").rpartition(".")[2] in BACKEND_FIRST:
                rewrite = self._without_backend(parent, top)
        elif isinstance(parent, (ast.Assign, ast.AnnAssign)) and self._target_named(parent, "backend"):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            rewrite = f"{ast.unparse(targets[0])} = {DEFAULT_BACKEND}"
        elif isinstance(parent, ast.Compare) and top is node and self._compared_with(top, parent, "backend"):
            other, op = self._other_side(top, parent)
            negated = isinstance(op, ast.NotEq | ast.IsNot | ast.NotIn)
            if isinstance(op, ast.In | ast.NotIn):  # `"nccl" in backend`
                rewrite = f"{DEFAULT_BACKEND} {'not in' if negated else 'in'} {ast.unparse(other)}"
            else:
                rewrite = f"{ast.unparse(other)} {'!=' if negated else '=='} {DEFAULT_BACKEND}"
        if rewrite is not None:
            self.add(node, "nccl", f"the backend {ast.unparse(node)} needs CUDA GPUs (NCCL)", _with_device(rewrite))

    @staticmethod
    def _without_backend(call: ast.Call, backend) -> str:
        """The call with the backend left for torch.distributed to pick."""
        call = copy.copy(call)
        call.keywords = [k for k in call.keywords if k is not backend]
        if call.args and call.args[0] is backend:
            call.args = call.args[1:] if len(call.args) == 1 else [ast.Constant(None), *call.args[1:]]
        return f"{ast.unparse(call)}  (or backend={DEFAULT_BACKEND})"

    def _in_environ(self, node) -> bool:
        """Whether a string is a name looked up in, or set in, the environment."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Subscript):  # os.environ["..."]
            return self.is_environ(parent.value)
        if isinstance(parent, ast.Call):  # os.getenv("..."), os.environ.get("..."), monkeypatch.setenv("...")
            func = parent.func
            setter = isinstance(func, ast.Attribute) and func.attr in (
                "getenv",
                "putenv",
                "unsetenv",
                "setenv",
                "delenv",
            )
            return setter or (isinstance(func, ast.Attribute) and self.is_environ(func.value))
        if isinstance(parent, ast.Compare):  # "..." in os.environ
            return any(self.is_environ(c) for c in parent.comparators)
        if isinstance(parent, ast.Dict) and node in parent.keys:  # an environment for a subprocess
            holder = self.parents.get(parent)
            merged = any(k is None and self.is_environ(v) for k, v in zip(parent.keys, parent.values))
            return merged or (isinstance(holder, ast.keyword) and holder.arg == "env")
        return False

    def is_environ(self, node) -> bool:
        return (self.resolve(node) or "").endswith("environ")

    def _env(self, node, variable: str):
        self.add(node, "cuda-env", f"`{variable}` is read by CUDA only", CUDA_ENV[variable])
