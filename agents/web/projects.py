"""The project switcher: `?project=<slug>` on any page narrows its lists to that project
and is remembered in the session; `?project=` (empty: "All projects") ends it.

Lists, counts and the badge follow the switch; a run's or a call's own URL keeps working
whatever the switch says (the person may read it), so links shared across teams open.
A slug that names no project of the person's is answered with a 404 page saying so,
the same for a project that does not exist and one they do not belong to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.template.loader import render_to_string

from agents import access
from agents.models import Project

SESSION_KEY = "airlock_project"
# Where no switch applies: the API narrows by its token (ApiToken.project), the rest has no lists.
UNSWITCHED = ("/api/", "/mcp/", "/admin/", "/static/", "/integrations/", "/login/", "/logout/")


def chosen(user: Any, slug: str) -> Project | None:
    """The project `slug` names if `user` belongs to it."""
    ids = access.member_projects(user)
    project = Project.objects.filter(slug=slug[:64]).first()
    if project is None or (ids is not None and project.pk not in ids):
        return None
    return project


def current(request: HttpRequest) -> Project | None:
    """The project the request's pages are switched to (set by the middleware)."""
    return getattr(request, "project", None)


def current_id(request: HttpRequest) -> int | None:
    project = current(request)
    return project.pk if project is not None else None


class ProjectSwitchMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.project = None  # type: ignore[attr-defined]
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or request.path.startswith(UNSWITCHED):
            return self.get_response(request)
        asked = request.GET.get("project")
        if asked is not None:
            if not asked:
                request.session.pop(SESSION_KEY, None)
            else:
                project = chosen(user, asked)
                if project is None:
                    return self._unknown(request, asked)
                request.session[SESSION_KEY] = project.slug
        slug = request.session.get(SESSION_KEY)
        if slug:
            project = chosen(user, slug)
            if project is None:
                # Removed from the project (or it was deleted) since: back to all of theirs.
                request.session.pop(SESSION_KEY, None)
            request.project = project  # type: ignore[attr-defined]
        return self.get_response(request)

    def _unknown(self, request: HttpRequest, slug: str) -> HttpResponse:
        body = render_to_string(
            "agents/no_project.html",
            {"slug": slug, "projects": access.projects_of(request.user), "path": request.path},
            request=request,
        )
        return HttpResponseNotFound(body)
