"""The layers the folders promise are the layers the imports have (NOTE [One place installs
the layers] in device/_start): each top-level part of the package imports only the parts
below it, at module level or inside a function alike, and only torch_jax/_registration
(with the package's ``__init__``) installs the layers. Read from the source, not by
importing it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "torch_jax"

# bottom to top; a part may import itself and the parts before it
LAYERS = [
    {"_warnings", "_config", "_compat"},
    {"device"},  # the devices, torch.jax, torch.accelerator, the patches of other libraries
    {"tensor"},  # storages, strided views, dtypes, nested tensors
    {"ffi"},  # XLA:CPU custom calls and their C++ handlers
    {"ops"},  # the lowering table
    {"runtime"},  # the executors, copies, the CPU fallback
    {"sparse"},
    {"distributed"},
    {"compile"},
    {"kernels"},
    {"__init__", "_registration"},  # the API, and the one place that installs every layer
    {"vllm", "report", "doctor", "__main__"},
]
RANK = {part: i for i, parts in enumerate(LAYERS) for part in parts}


def _part(module: str) -> str:
    """'torch_jax.runtime._executor' -> 'runtime'; 'torch_jax' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(source: str, module: str, is_package: bool) -> set[str]:
    """The torch_jax modules a file imports anywhere in it (relative imports resolved)."""
    found = set()
    package = module if is_package else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            found |= {f"{base}.{a.name}" for a in node.names} if base == "torch_jax" else {base}
    return {m for m in found if m == "torch_jax" or m.startswith("torch_jax.")}


def _upward(source: str, module: str, is_package: bool = False) -> list[str]:
    here = _part(module)
    return [t for t in sorted(_imports(source, module, is_package)) if RANK.get(_part(t), -1) > RANK[here]]


def test_every_part_of_the_package_has_a_layer():
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    parts -= {"__pycache__"}
    assert parts <= set(RANK), f"parts without a layer in tests/test_layers.py: {sorted(parts - set(RANK))}"


def test_each_layer_imports_only_the_layers_below_it():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_of(path)
        for target in _upward(path.read_text(), module, path.name == "__init__.py"):
            upward.append(f"{path.relative_to(PACKAGE)} imports {target}")
    assert not upward, "imports of a layer above:\n" + "\n".join(upward)


def test_the_check_finds_an_upward_import_inside_a_function():
    # (a check that finds nothing must be able to find something)
    source = "from torch_jax.tensor import _dtypes\n\ndef f():\n    from ..runtime import _executor\n"
    assert _upward(source, "torch_jax.tensor._example") == ["torch_jax.runtime"]
    assert _upward(source, "torch_jax.compile._example") == []
