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
