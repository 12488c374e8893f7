"""NOTE [Persistent compilation cache]: compiling a training step's graphs takes seconds
(XLA:CPU, GPT-2's forward and backward: several), every time a process starts. JAX can
keep executables on disk, keyed by the computation and the compiler's version and
options; the device turns that on when it starts, in ``cache_dir()/xla``
(``$TORCH_JAX_CACHE_DIR``, else ``~/.cache/torch_jax``), unless the program configured
JAX's cache itself (``jax_compilation_cache_dir``) or ``TORCH_JAX_COMPILATION_CACHE=0``.
JAX writes only computations that took a second or more to compile (its default), so the
thousands of small eager ops stay off the disk; ``torch.compile``'s graphs are written
whatever their time (:func:`keep`), and a later process that makes the same graphs loads
them instead of compiling: ``torch_jax.stats()`` counts ``compiled_graph_loads`` apart
from ``compiled_graph_compiles``.
"""

from __future__ import annotations

import contextlib
import threading

import jax

from torch_jax._config import cache_dir, config
from torch_jax.runtime import _stats

_hits = threading.local()
_HIT = "/jax/compilation_cache/cache_hits"
_enabled = False


def enable() -> None:
    """Turn on JAX's persistent cache in torch_jax's cache directory (at device start)."""
    global _enabled
    if _enabled or not config.compilation_cache:
        return
    _enabled = True
    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "xla"))
    jax.monitoring.register_event_listener(_listen)


def _listen(event: str, **kwargs) -> None:
    if event == _HIT:
        _stats.counters["persistent_cache_hits"] += 1
        _hits.count = getattr(_hits, "count", 0) + 1


def hits() -> int:
    """Persistent-cache hits on this thread so far."""
    return getattr(_hits, "count", 0)


@contextlib.contextmanager
def keep():
    """Compilations inside are written to the persistent cache whatever their time."""
    try:
        from jax._src import config as jax_config

        state = jax_config.persistent_cache_min_compile_time_secs
    except (ImportError, AttributeError):  # (JAX internals moved: JAX's own threshold then)
        state = None
    if state is None:
        yield
        return
    with state(0.0):
        yield
