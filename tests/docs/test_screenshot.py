"""The README's screenshot is what scripts/screenshot.py takes now: the README shows the
file the script writes, and the script (a fresh demo, Chromium, the review queue) still
runs and shows a page of the same structure (headings, buttons, form labels, the cards'
tools), which the script writes into the PNG. Pixels are not compared: fonts differ
between machines; the page's content is checked by the script before it shoots."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from tests.docs.links import BASE, prose
from tests.e2e.browser import output_dir

SCRIPT = BASE / "scripts" / "screenshot.py"
IMAGE = re.compile(r"!\[([^\]]*)\]\(\s*([^)\s]+)")


def _script() -> object:
    spec = importlib.util.spec_from_file_location("airlock_screenshot", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


screenshot = _script()


def readme_images() -> list[tuple[str, str]]:
    return [m.groups() for _, line in prose(BASE / "README.md") for m in IMAGE.finditer(line)]


def test_the_readme_shows_the_file_the_script_writes() -> None:
    images = readme_images()
    assert images, "the README shows a screenshot"
    alt, target = images[0]
    assert target == screenshot.OUT  # type: ignore[attr-defined]
    assert "review queue" in alt.lower() and "planted instruction highlighted" in alt
    width, _ = screenshot.png_size(BASE / target)  # type: ignore[attr-defined]
    assert width == screenshot.VIEWPORT["width"]  # type: ignore[attr-defined]


def committed_structure() -> dict[str, object]:
    text = screenshot.text_chunk(BASE / screenshot.OUT)  # type: ignore[attr-defined]
    assert text is not None, f"{screenshot.OUT} was not written by scripts/screenshot.py"  # type: ignore[attr-defined]
    return json.loads(text)


@pytest.mark.e2e
def test_the_script_takes_the_readme_screenshot_now() -> None:
    out = output_dir().resolve() / "review-queue.png"
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(BASE)}
    # A bound on a stuck browser, not a measurement.
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], cwd=BASE, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["out"] == str(out)
    assert (result["width"], result["height"]) == screenshot.png_size(out)  # type: ignore[attr-defined]
    shape = result["structure"]
    assert json.loads(screenshot.text_chunk(out)) == shape  # type: ignore[attr-defined]
    # What the README's alt text promises, as the script saw it on the page.
    assert shape["cards"] == 2 and shape["tools"] == ["refund", "send_email"]
    assert "Untrusted content that tainted this run" in " ".join(shape["headings"])
    assert shape["buttons"].count("Approve") == 2

    # The committed picture is of today's page: same headings, buttons and labels.
    assert committed_structure() == shape, "the review queue changed: run scripts/screenshot.py and commit it"
    assert result["width"] == screenshot.png_size(BASE / screenshot.OUT)[0]  # type: ignore[attr-defined]
