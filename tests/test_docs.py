"""The docs cannot rot: the manual (mkdocs.yml, docs/) builds with warnings as errors (a
broken link or reference fails it) and its home page draws in a browser; every Python
snippet of the README and the manual runs, unless marked ``<!-- not run: reason -->`` on
the line before it; every environment variable the package reads is on the settings page;
the README stays a landing page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _browser import needs_chromium, screenshot

ROOT = Path(__file__).resolve().parents[1]
README_LINES = 250
_FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
_NOT_RUN = "<!-- not run: "


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _snippets(page: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(runnable, not run) snippets of a page: (line, code), (line, reason)."""
    text = page.read_text()
    run, skipped = [], []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if before.startswith(_NOT_RUN):
            reason = before[len(_NOT_RUN) :].removesuffix("-->").strip()
            assert reason, f"{page.name}:{line}: a snippet marked not run says why"
            skipped.append((line, reason))
        else:
            run.append((line, m.group(1)))
    return run, skipped


_WITH_SNIPPETS = [p for p in _pages() if _snippets(p)[0]]


@pytest.mark.parametrize("page", _WITH_SNIPPETS, ids=[str(p.relative_to(ROOT)) for p in _WITH_SNIPPETS])
def test_every_snippet_of_the_page_runs(page, tmp_path):
    """A page's snippets run in order in one fresh process (a later one may use what an
    earlier one defined, as a reader would), in an empty folder, the fallback an error."""
    run, _ = _snippets(page)
    program = []
    for line, code in run:
        program += [
            f"print('@snippet {page.name}:{line}', flush=True)",
            f"exec(compile({code!r}, {f'{page.name}:{line}'!r}, 'exec'))",
        ]
    env = dict(os.environ, TORCH_JAX_FALLBACK="error")
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(program)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{page.name}: {done.stdout[-1500:]}\n{done.stderr[-3000:]}"
    assert done.stdout.count("@snippet ") == len(run)


def test_snippets_not_run_are_few_and_say_why():
    skipped = {f"{p.relative_to(ROOT)}:{line}": why for p in _pages() for line, why in _snippets(p)[1]}
    ran = sum(len(_snippets(p)[0]) for p in _pages())
    print(f"{ran} snippets run, {len(skipped)} not: {skipped}")
    assert len(skipped) < ran  # (most run: a page of fragments would say little a test checks)


def _settings() -> dict:
    """The settings page's contents (docs/_hooks.py reads them from _config.py's source)."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import _hooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    return _hooks.settings()


def test_the_readme_is_a_landing_page():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines: the manual (docs/) is the place for the rest"


def test_every_environment_variable_the_package_reads_is_on_the_settings_page():
    settings = _settings()
    documented = {variable for _, variable, _, _ in settings["fields"]} | set(settings["environment"])
    read = set()
    for path in (ROOT / "src" / "torch_jax").rglob("*.py"):
        read |= set(re.findall(r"TORCH_JAX_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    read.discard("TORCH_JAX_")  # (the prefix itself, in _config)
    assert read <= documented, f"read but not on the settings page: {sorted(read - documented)}"
    assert all(text for _, _, _, text in settings["fields"]), (
        "a config field without its paragraph in Config's docstring"
    )


def test_every_variable_the_docs_name_exists():
    """A TORCH_JAX_* variable named in the README or the manual is read by the package (so
    it is on the settings page) or by the test suite (its switches, docs/testing.md)."""
    settings = _settings()
    known = {variable for _, variable, _, _ in settings["fields"]} | set(settings["environment"])
    pattern = r"TORCH_JAX_[A-Z0-9_]*[A-Z0-9]"
    for path in (ROOT / "tests").glob("*.py"):
        known |= set(re.findall(pattern, path.read_text()))
    named = {}
    for page in _pages():
        for variable in re.findall(pattern, page.read_text()):
            named.setdefault(variable, page.relative_to(ROOT))
    unknown = {v: str(page) for v, page in named.items() if v not in known}
    assert not unknown, f"variables the docs name that nothing reads: {unknown}"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the manual's tools (mkdocs-material, mkdocstrings): the `test` extra")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return done, out


def test_the_manual_builds_without_warnings(site):
    done, out = site
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr[-3000:]
    settings = (out / "reference" / "settings" / "index.html").read_text()
    assert "TORCH_JAX_CPU_ATTENTION" in settings and "TORCH_JAX_CACHE_DIR" in settings
    assert "torch-jax doctor" in (out / "reference" / "cli" / "index.html").read_text()
    api = (out / "reference" / "api" / "index.html").read_text()
    assert 'id="torch_jax.jax_op"' in api and 'id="torch_jax.device._module.synchronize"' in api


@needs_chromium
def test_the_home_page_draws_in_a_browser(site, tmp_path):
    """Not blank: the theme's header bar, its navigation and text drawn (a page whose CSS
    or assets went missing draws black text on white only)."""
    done, out = site
    assert done.returncode == 0, done.stderr[-3000:]
    pixels, counts = screenshot(out / "index.html", tmp_path / "home.png", 1200, 900)
    header = pixels.getpixel((600, 20))
    total = 1200 * 900
    assert len(counts) > 50 and total - counts.get((255, 255, 255), 0) > total // 20
    # mkdocs-material's default primary colour (indigo) fills the header bar
    assert header[2] > 150 and header[0] < 100 and counts.get(header, 0) > 1200 * 40, header
