"""mkdocs hooks (mkdocs.yml): pages made from the code when the manual is built, so that
nothing in them is written twice by hand.

- reference/settings.md: ``torch_jax.config``'s fields (name, environment variable,
  default, description), read from ``Config``'s source and docstring in
  src/torch_jax/_config.py without importing it, then ``ENVIRONMENT``'s other variables;
- reference/cli.md: the ``torch-jax`` command's help and each subcommand's.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "src" / "torch_jax" / "_config.py"
_FIELD_DOC = re.compile(r"^(\w+): ", re.M)  # (a field's paragraph in Config's docstring starts so)


def settings() -> dict:
    """{"fields": [(name, variable, default, description)], "environment": {variable: text}}
    from _config.py's source."""
    tree = ast.parse(CONFIG.read_text())
    config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    doc = ast.get_docstring(config)
    paragraphs = {}
    starts = list(_FIELD_DOC.finditer(doc))
    for m, nxt in zip(starts, starts[1:] + [None]):
        text = doc[m.end() : nxt.start() if nxt else len(doc)]
        paragraphs[m.group(1)] = " ".join(text.split())
    fields = []
    for node in config.body:
        if not isinstance(node, ast.AnnAssign):
            continue
        name = node.target.id
        call = next(
            n for n in ast.walk(node.value) if isinstance(n, ast.Call) and getattr(n.func, "id", "").startswith("_env_")
        )
        variable = "TORCH_JAX_" + ast.literal_eval(call.args[0])
        try:
            default = f"`{ast.literal_eval(call.args[1])}`"
        except ValueError:  # (computed where the program runs: the description says how)
            default = "the machine's (see what it does)"
        fields.append((name, variable, default, paragraphs.get(name, "")))
    environment = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "ENVIRONMENT"
    )
    return {"fields": fields, "environment": environment}


def _rst(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|")


def settings_markdown() -> str:
    s = settings()
    lines = [
        "## `torch_jax.config`",
        "",
        "`torch_jax.config.<name> = value` in Python, or `<variable>=value` in the environment before the "
        "program starts.",
        "",
        "| name | environment variable | default | what it does |",
        "| --- | --- | --- | --- |",
    ]
    for name, variable, default, text in s["fields"]:
        lines.append(f"| `{name}` | `{variable}` | {default} | {_rst(text)} |")
    lines += ["", "## Other environment variables", "", "| variable | what it does |", "| --- | --- |"]
    for variable, text in s["environment"].items():
        lines.append(f"| `{variable}` | {_rst(text)} |")
    return "\n".join(lines) + "\n"


def cli_markdown() -> str:
    from torch_jax.doctor import _cli

    sections = []
    for argv in (["--help"], ["doctor", "--help"], ["scan", "--help"], ["rerun", "--help"], ["evidence", "--help"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            _cli.main(argv)
        title = "torch-jax" if argv == ["--help"] else f"torch-jax {argv[0]}"
        sections += [f"## `{title}`", "", "```text", out.getvalue().rstrip(), "```", ""]
    return "\n".join(sections)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- settings -->" in markdown:
        markdown = markdown.replace("<!-- settings -->", settings_markdown())
    if "<!-- cli -->" in markdown:
        markdown = markdown.replace("<!-- cli -->", cli_markdown())
    return markdown
