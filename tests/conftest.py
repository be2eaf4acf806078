from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection

from agents import store
from agents.actions import run_launch
from agents.defaults import ensure
from agents.models import AgentProfile, Run


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    # Real hashing costs ~0.2 s a user; tests create hundreds. Production keeps PBKDF2.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # CI runs against real PostgreSQL, Redis and Chromium: a skipped test there hides a
    # broken promise, so it fails the run.
    if os.environ.get("AIRLOCK_FORBID_SKIPS") == "1":
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
        if skipped:
            print(f"\nAIRLOCK_FORBID_SKIPS: {skipped} test(s) skipped; failing the run")
            session.exitstatus = 1


PASSWORD = "correct horse battery"


def person(username: str, *groups: str, superuser: bool = False) -> User:
    """A user in the named groups (the groups come from the `defaults` fixture)."""
    user = User.objects.create_user(username, password=PASSWORD, is_superuser=superuser, is_staff=superuser)
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    return user


@pytest.fixture
def defaults(db: None) -> None:
    """The migration's profiles and groups (a transactional test's flush removes them)."""
    ensure(AgentProfile, Group, Permission)


@pytest.fixture
def launch(defaults: None) -> Callable[..., Run]:
    def _launch(script: list[Any], **kwargs: Any) -> Run:
        kwargs.setdefault("agent", "scripted")
        kwargs.setdefault("task", "test task")
        return run_launch(script=script, **kwargs)

    return _launch


@pytest.fixture
def drive() -> Callable[..., Run]:
    """Drive a run synchronously, optionally with a shifted clock."""

    def _drive(run: Run, *, clock_offset: float = 0.0, **kwargs: Any) -> Run:
        if clock_offset:
            fresh = Run.objects.select_related("profile").get(pk=run.pk)
            deps = store.deps_for(fresh)
            deps.now = lambda: time.time() + clock_offset
            kwargs["deps"] = deps
        return store.drive(run.pk, **kwargs)

    return _drive


def call(tool: str, usage: dict[str, int] | None = None, **args: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"call": {"tool": tool, "args": args}}
    if usage:
        item["usage"] = usage
    return item


def final(text: str = "done", usage: dict[str, int] | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"final": text}
    if usage:
        item["usage"] = usage
    return item


def at_once(fn: Callable[[Any], Any], args: Sequence[Any], *, timeout: float = 120) -> list[Any]:
    """fn(arg) for every arg, each in its own thread, all released together by a
    barrier; the results in the order of args. Each thread closes its database
    connection, and an exception in any thread is raised here."""
    barrier = threading.Barrier(len(args))
    results: list[Any] = [None] * len(args)
    errors: list[BaseException] = []

    def run(i: int, arg: Any) -> None:
        try:
            barrier.wait()
            results[i] = fn(arg)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, arg)) for i, arg in enumerate(args)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]
    return results


def requires_postgres() -> pytest.MarkDecorator:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    return pytest.mark.skipif("postgresql" not in engine, reason="needs PostgreSQL (set DATABASE_URL)")


# -- browser tests (tests/e2e, tests/security): one Chromium for the whole session --
@pytest.fixture(scope="session")
def browser() -> Any:
    from tests.e2e.conftest import chromium_session

    yield from chromium_session()


# -- webhook receivers (issue #14): a real server on loopback, verifying signatures --
@pytest.fixture
def receiver() -> Any:
    from tests.webhook_receiver import Receiver

    r = Receiver().start()
    yield r
    r.stop()
