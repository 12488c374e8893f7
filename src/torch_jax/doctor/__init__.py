"""Migration evidence: ``torch-jax doctor``, ``scan``, ``rerun`` and ``evidence``.

A record says which workload ran, on which software, where each op ran, how close the
results came to the reference device's, what it cost in time and memory, what in the
code assumed CUDA and what was changed, and whether the user's acceptance criteria held
(the record's schema: record.schema.json, ``SCHEMA``). Records go to a JSON file, a
self-contained HTML report and a local SQLite database with full-text search.
"""

from __future__ import annotations

from torch_jax.doctor._doctor import SCHEMA, run

__all__ = ["SCHEMA", "run", "schema"]


def schema() -> dict:
    """The JSON schema of a record (version ``SCHEMA``)."""
    import json
    import os

    with open(os.path.join(os.path.dirname(__file__), "record.schema.json")) as f:
        return json.load(f)
