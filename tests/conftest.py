"""The suite's fixtures: the migration's defaults, launching and driving runs, the
personas (one user per role, the same names everywhere) and a run waiting for a human.

Heavier fixtures live in plugin modules registered below: Chromium pages
(tests/e2e/browser.py), real Celery workers (tests/workers/cluster.py), the fake model
provider (tests/llm/provider.py); which skips a run allows is tests/skips.py, which tests
start processes tests/processes.py, which need a real commit tests/transactions.py. Helpers
to import are in tests/helpers.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User

from agents.actions.runs import run_launch
from agents.actions.tokens import token_create
from agents.defaults import ensure
from agents.models import AgentProfile, Approval, Run
from agents.runs import driver
from tests.helpers import Api, CsrfClient, member, person, tainted_write

pytest_plugins = [
    "tests.skips", "tests.processes", "tests.transactions", "tests.e2e.browser", "tests.workers.cluster", "tests.llm.provider", "tests.accounts.provider",
]


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    # Real hashing costs ~0.2 s a user; tests create hundreds. Production keeps PBKDF2.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _no_cached_transcripts() -> None:
    """Each test starts with an empty transcript cache (agents/runs/store.py): a flush
    between transactional tests can give a new run an id an earlier test's run had."""
    from agents.runs.store import transcripts

    transcripts.clear()


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
            deps = driver.deps_for(fresh)
            deps.now = lambda: time.time() + clock_offset
            kwargs["deps"] = deps
        return driver.drive(run.pk, **kwargs)

    return _drive


@pytest.fixture
def pending(launch: Callable[..., Run], drive: Callable[..., Run]) -> Callable[..., Approval]:
    """pending(script=None, user=None, **launch_kwargs): launch a scripted run (by
    default a tainted write) and drive it until it waits for a human; its approval."""

    def _pending(script: list[Any] | None = None, **kwargs: Any) -> Approval:
        run = drive(launch(script or tainted_write(), **kwargs))
        assert run.state == "awaiting_approval", (run.state, run.error)
        return Approval.objects.get(run=run, status="pending")

    return _pending


# -- personas: the same names in every folder ------------------------------------------


@pytest.fixture
def lena(defaults: None) -> User:
    return person("lena", "launcher")


@pytest.fixture
def leo(defaults: None) -> User:
    """A second launcher, who owns runs lena may not read."""
    return person("leo", "launcher")


@pytest.fixture
def otto(defaults: None) -> User:
    return person("otto", "operator")


@pytest.fixture
def rita(defaults: None) -> User:
    return person("rita", "reviewer")


@pytest.fixture
def rob(defaults: None) -> User:
    return person("rob", "reviewer")


@pytest.fixture
def nina(defaults: None) -> User:
    """Logged in, in no group."""
    return person("nina")


@pytest.fixture
def root(defaults: None) -> User:
    return person("root", superuser=True)


@pytest.fixture
def people(lena: User, leo: User, otto: User, rita: User, root: User) -> dict[str, User]:
    """One user per role (keyed by role), plus `other`: leo, who owns other runs."""
    return {"launcher": lena, "operator": otto, "reviewer": rita, "superuser": root, "other": leo}


# -- teams: two projects, each with its own profiles and people (memberships only) ------


class Team:
    """One project of the `teams` fixture: its scripted and external profiles and its
    people by role (`admin` included), none of them in a global group."""

    def __init__(self, slug: str, names: dict[str, str]) -> None:
        from agents.defaults import DIAGNOSTIC_TOOLS
        from agents.models import Project

        self.project = Project.objects.create(slug=slug, name=slug.title())
        self.profile = AgentProfile.objects.create(
            name=f"{slug}-bot", provider="scripted", model_name="script", tools=DIAGNOSTIC_TOOLS,
            separate_duties=False, project=self.project,
        )
        self.external = AgentProfile.objects.create(
            name=f"{slug}-ext", provider="external", tools=["echo"], project=self.project
        )
        self.people = {role: member(name, self.project, role, staff=role == "admin") for role, name in names.items()}

    def __getitem__(self, role: str) -> User:
        return self.people[role]


@pytest.fixture
def teams(defaults: None) -> dict[str, Team]:
    """`support` (sue reviews, sol operates, sid launches, sam administers) and
    `finance` (fay, fox, fin, fia), sharing one deployment."""
    return {
        "support": Team("support", {"reviewer": "sue", "operator": "sol", "launcher": "sid", "admin": "sam"}),
        "finance": Team("finance", {"reviewer": "fay", "operator": "fox", "launcher": "fin", "admin": "fia"}),
    }


# -- webhook receivers: a real server on loopback, verifying signatures --
@pytest.fixture
def receiver() -> Any:
    from tests.webhook_receiver import Receiver

    r = Receiver().start()
    yield r
    r.stop()


# -- the API: the personas by name, and a JSON client per persona ---------------------


@pytest.fixture
def users(lena: User, leo: User, otto: User, rita: User, rob: User, nina: User, root: User) -> dict[str, User]:
    """The personas by name, for tables of who may do what."""
    return {u.username: u for u in (lena, leo, otto, rita, rob, nina, root)}


@pytest.fixture
def api(users: dict[str, User]) -> Callable[[str | None], Api]:
    """api("lena") -> a client carrying a fresh token of lena's; api(None) -> anonymous."""

    def _api(name: str | None) -> Api:
        if name is None:
            return Api(None)
        _token, raw = token_create(user=users[name])
        return Api(raw)

    return _api


@pytest.fixture
def as_user() -> Callable[[User], CsrfClient]:
    """as_user(rita) -> a CSRF-enforcing browser stand-in logged in as rita (the review
    queue's tests and tests/actions/test_claims.py)."""

    def _as(user: User) -> CsrfClient:
        client = CsrfClient()
        client.force_login(user)
        return client

    return _as
