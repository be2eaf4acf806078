"""The fault tools reach a worker only through AIRLOCK_EXTRA_TOOLS, and only where
scripted runs and the diagnostic tools are allowed."""

from __future__ import annotations

import pytest

from agents import tools
from tests.reliability import fault_tools

# The registry also offers the MCP tools an operator synced: it reads the database.
pytestmark = pytest.mark.django_db


def test_extra_tool_modules_join_the_diagnostic_tools(settings) -> None:
    settings.AIRLOCK_EXTRA_TOOLS = [fault_tools.__name__]
    assert {"crash", "hostile"} <= set(tools.registry().names())
    settings.AIRLOCK_ALLOW_SCRIPTED = False
    assert not {"crash", "hostile", "echo"} & set(tools.registry().names())


def test_no_fault_tool_by_default() -> None:
    assert not {"crash", "hostile"} & set(tools.registry().names())
