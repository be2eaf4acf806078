"""The external agents' fixtures: an external profile with a client tool, an API client
per persona, and a launched external run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.models import AgentProfile
from agents.tokens import token_create
from tests.helpers import CRM_UPDATE, Api


@pytest.fixture
def users(lena: User, leo: User, otto: User, rita: User, rob: User, root: User) -> dict[str, User]:
    return {u.username: u for u in (lena, leo, otto, rita, rob, root)}


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
def profile(defaults: None) -> AgentProfile:
    """`ext`: an external profile offering the diagnostic tools and one client tool."""
    return AgentProfile.objects.create(
        name="ext", provider="external", client_tools=[CRM_UPDATE],
        tools=["echo", "fail", "sleep", "fetch_fixture", "ledger_write", "ledger_write_unsafe", "crm_update"],
    )


@pytest.fixture
def external_run(api: Callable[[str | None], Api], profile: AgentProfile) -> Callable[..., int]:
    """external_run(who="lena", **launch_body) -> the id of a run of `ext` launched
    through the API by `who`."""

    def _launch(who: str = "lena", **body: Any) -> int:
        response = api(who).post("/api/runs", {"agent": "ext", "task": "tidy the ledger", **body})
        assert response.status_code == 201, response.data
        return int(response.data["id"])

    return _launch
