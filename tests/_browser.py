"""Headless Chromium for the tests that check a page as a browser draws it (the doctor's
HTML report, the manual's home page): Debian's `chromium` package, which .ci/run installs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs headless Chromium (Debian's `chromium` package) on PATH"
)


def screenshot(page: Path, png: Path, width: int, height: int):
    """The page drawn at width x height, as an RGB image (Pillow's), and its colours'
    pixel counts; the test fails where no screenshot comes out."""
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={png.parent / 'chromium-profile'}",
        f"--screenshot={png}",
        f"--window-size={width},{height}",
        page.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert png.exists(), f"no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
    Image = pytest.importorskip("PIL.Image")
    with Image.open(png) as im:
        pixels = im.convert("RGB")
        pixels.load()
    assert pixels.size == (width, height)
    return pixels, {rgb: n for n, rgb in pixels.getcolors(maxcolors=1 << 24)}
