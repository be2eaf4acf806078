"""The external agents' fixtures: an external profile with a client tool and a launched
external run (the API client per persona, `api`, is the suite's: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agents.models import AgentProfile
from tests.helpers import CRM_UPDATE, Api


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
