"""Building and loading the C++ FFI handlers of csrc/: each source is compiled with the
machine's C++ compiler against jaxlib's FFI headers the first time it is needed, into
the cache directory, and its handlers registered with XLA:CPU (NOTE [Matrix products
through PyTorch's BLAS] in ffi/_cpu_blas says where and how it is cached)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import jax
import jaxlib

from torch_jax._config import cache_dir, config
from torch_jax.tensor import _storage

CSRC = Path(__file__).with_name("csrc")


def build(source: Path, targets, flags=("-O2",)) -> ctypes.CDLL:
    """Compile an FFI source of csrc/ (once, into the cache directory; with compiler
    ``flags``), load it and register its handlers ``targets`` (symbol names) with XLA:CPU
    under those names. The source may include the headers beside it."""
    include = jax.ffi.include_dir()
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    signature = (
        source.read_bytes() + headers + " ".join(flags).encode() + jaxlib.__version__.encode() + include.encode()
    )
    key = hashlib.sha256(signature).hexdigest()[:16]
    out = cache_dir() / f"{source.stem}-{key}.so"
    if not out.exists():
        compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
        if not compiler:
            raise RuntimeError(f"no C++ compiler (c++, g++ or $CXX) to build {source.name}")
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)  # (built aside, renamed: processes may race)
        os.close(fd)
        try:
            cmd = [compiler, "-std=c++17", *flags, "-shared", "-fPIC", "-w", f"-I{include}", f"-I{source.parent}"]
            cmd += [str(source), "-o", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise RuntimeError(f"building {source.name} failed: {done.stderr.strip()[-500:]}")
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(out))
    for target in targets:
        # (the capsule as jax.ffi.pycapsule makes it, without resetting the argtypes of
        # the process's one ctypes.pythonapi.PyCapsule_New as that does)
        handler = ctypes.cast(getattr(lib, target), ctypes.c_void_p).value
        jax.ffi.register_ffi_target(target, _storage.capsule_new(handler, None, None), platform="cpu")
    return lib


class Handlers:
    """FFI handlers built, loaded and registered once per process by ``open_library``
    (which returns the loaded library, or raises OSError, RuntimeError or
    SubprocessError); ``status`` is None until tried, then "ok" or why not."""

    def __init__(self, open_library, unavailable: str):
        self._open = open_library
        self._unavailable = unavailable  # (what happens without them, for the debug log)
        self._lock = threading.Lock()
        self.status: str | None = None
        self.library = None  # (kept loaded while the process runs)

    def load(self) -> bool:
        """Whether the handlers are usable (tries once)."""
        if self.status is None:
            with self._lock:
                if self.status is None:
                    try:
                        self.library = self._open()
                        self.status = "ok"
                    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                        self.status = str(e)
                        if config.debug >= 1:
                            print(f"[torch_jax] {self._unavailable}: {self.status}")
        return self.status == "ok"
