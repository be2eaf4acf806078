"""Browser fixtures (registered for the whole suite by tests/conftest.py, since
tests/security uses them too): Playwright driving Debian's Chromium against the live
server.

Every page opened through the `page` fixture records Content-Security-Policy violations,
console errors and dialogs; a test that saw any fails at teardown.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

CHROMIUM = os.environ.get("AIRLOCK_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
# between browser actions are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def output_dir() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("AIRLOCK_TEST_OUTPUT", "test-output"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One Chromium for the whole session: Playwright's sync API cannot start a second
    instance while one runs."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield chromium
        chromium.close()


class PageWatch:
    def __init__(self) -> None:
        self.csp_violations: list[str] = []
        self.console_errors: list[str] = []
        self.dialogs: list[str] = []
        self.foreign_requests: list[str] = []


@pytest.fixture
def new_page(browser: Any, live_server: Any) -> Iterator[Callable[[], tuple[Any, PageWatch]]]:
    """A factory of pages in fresh browser contexts (one per user)."""
    contexts = []
    watches: list[PageWatch] = []

    def _new() -> tuple[Any, PageWatch]:
        context = browser.new_context(base_url=live_server.url)
        contexts.append(context)
        page = context.new_page()
        watch = PageWatch()
        watches.append(watch)

        def on_console(msg: Any) -> None:
            if msg.type == "error":
                text = msg.text
                (watch.csp_violations if "Content Security Policy" in text else watch.console_errors).append(text)

        def on_request(request: Any) -> None:
            if not request.url.startswith(live_server.url) and not request.url.startswith("data:"):
                watch.foreign_requests.append(request.url)

        def on_dialog(dialog: Any) -> None:
            watch.dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("console", on_console)
        page.on("request", on_request)
        page.on("dialog", on_dialog)
        return page, watch

    yield _new
    for context in contexts:
        context.close()
    for watch in watches:
        assert not watch.csp_violations, watch.csp_violations
        assert not watch.dialogs, watch.dialogs
        assert not watch.foreign_requests, watch.foreign_requests


@pytest.fixture
def login() -> Callable[[Any, str, str], None]:
    def _login(page: Any, username: str, password: str) -> None:
        page.goto("/login/")
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url("**/")

    return _login


@pytest.fixture
def screenshot() -> Callable[[Any, str], pathlib.Path]:
    def _shot(page: Any, name: str) -> pathlib.Path:
        path = output_dir() / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return _shot
