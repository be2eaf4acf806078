from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from agents import access
from agents.web import projects

# The navigation's sections by path prefix, longest first (/runs/new/ before /runs/).
SECTIONS = (("/runs/new/", "launch"), ("/reviews/stats/", "stats"), ("/reviews/", "reviews"), ("/runs/", "runs"))


def navigation(path: str) -> tuple[str, str]:
    """The section a path belongs to, and its `aria-current` value: "page" on the
    section's own page, "true" on a page inside it (a run's timeline)."""
    if path == "/":
        return "overview", "page"
    for prefix, name in SECTIONS:
        if path.startswith(prefix):
            return name, "page" if path == prefix else "true"
    return "", ""


def roles(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    section, current = navigation(request.path)
    # The switcher shows when a person belongs to more than one project.
    mine = access.projects_of(user) if not request.path.startswith(projects.UNSWITCHED) else []
    return {
        "projects": mine if len(mine) > 1 else [],
        "project": projects.current(request),
        "can_launch": access.can_launch(user),
        "can_decide": access.can_decide(user),
        "can_cancel": access.can_cancel(user),
        "can_read_stats": access.reads_review_stats(user),
        "nav_section": section,
        "nav_current": current,
    }
