"""Benchmarks of torch_jax against PyTorch, side by side: ``python -m benchmarks``."""


def write_report(out: str, name: str, report: dict, text: str) -> None:
    """``report`` as ``OUT/NAME.json`` and its Markdown ``text`` as ``OUT/NAME.md``."""
    import json
    import os

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(text)


def machine() -> dict:
    """The date, versions and CPU a report's numbers come from."""
    import datetime
    import os

    import jax
    import torch

    import torch_jax
    from torch_jax._config import cpuinfo

    return {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "jax": jax.__version__,
        "torch_jax": torch_jax.__version__,
        "cpus": os.cpu_count(),
        "cpu_model": cpuinfo("model name") or "?",
    }
