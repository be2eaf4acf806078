"""`manage.py check`: agent profile rows that no longer validate (docs/operations.md).

The admin refuses a broken profile (AgentProfile.clean()), but a row can break anyway:
saved before a rule existed, written by a raw update or a script, or naming a tool or
MCP server since removed. Each such row costs only itself (the launch form shows it
unavailable, a launch of it is refused); this check names them at deploy time.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import DatabaseError

from agents.models import AgentProfile


@checks.register()
def broken_profiles(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        # The launchable ones: with scripted runs off, the scripted profile names the
        # diagnostic tools no longer registered, and cannot launch anyway.
        profiles = list(AgentProfile.objects.launchable())
    except DatabaseError:
        return []  # not migrated yet (`migrate` runs the checks first): nothing to list
    found = []
    for profile in profiles:
        for field, message in profile.problems().items():
            found.append(
                checks.Warning(
                    f"agent profile {profile.name!r}: {field}: {message}",
                    hint="Fix it in the admin (Agent profiles); until then it cannot be launched.",
                    obj=f"AgentProfile {profile.name}",
                    id="airlock.W001",
                )
            )
    return found
