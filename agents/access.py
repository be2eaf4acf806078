"""Who may read or do what: the design's roles, per project, checked the same way by
pages, API and commands. Every rule about visibility lives here, so the pages and the
API cannot drift.

Roles are held per project (`Membership`); the global groups `reviewer`, `operator` and
`launcher` mean "this role in every project", and superusers hold every role everywhere.
An API token limited to a project (`ApiToken.project`, set on the user object by
agents.tokens) narrows every answer below to that project, superusers' included."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django_htmx.http import HttpResponseClientRedirect

from agents.models import AgentProfile, Approval, Membership, Project, Run
from agents.models.projects import ROLES
from agents.runs import rows

REVIEWER, OPERATOR, LAUNCHER, ADMIN = ROLES
GLOBAL_ROLES = (REVIEWER, OPERATOR, LAUNCHER)  # a Django group of this name: the role in every project
READERS = (REVIEWER, OPERATOR)  # read every run of their project; launchers read their own
MAX_ID = 2**63 - 1  # a bigint: a larger id cannot exist, and PostgreSQL would refuse to compare it

# A set of project ids, or None for "every project".
Projects = set[int] | None


def in_group(user: Any, name: str) -> bool:
    """Whether `user` is in the Django group `name` (superusers: always)."""
    if not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    cache = getattr(user, "_airlock_groups", None)
    if cache is None:
        cache = set(user.groups.values_list("name", flat=True))
        user._airlock_groups = cache
    return name in cache


def token_project(user: Any) -> int | None:
    """The one project the request's API token is limited to, or None (a session, or a
    token of all the user's projects)."""
    return getattr(user, "_airlock_token_project", None)


def _memberships(user: Any) -> dict[str, set[int]]:
    # Read once per request: the user object lives as long as the request, as in_group's cache.
    cache = getattr(user, "_airlock_roles", None)
    if cache is None:
        cache = {role: set() for role in ROLES}
        for project_id, role in Membership.objects.filter(user_id=user.pk).values_list("project_id", "role"):
            cache.setdefault(role, set()).add(project_id)
        user._airlock_roles = cache
    return cache


def project_ids(user: Any, role: str) -> Projects:
    """The projects where `user` holds `role`: None for every project (a superuser, or
    the global group of that name), else a set (maybe empty). A project-limited token
    narrows either to its project."""
    if not user.is_authenticated or not user.is_active:
        return set()
    limit = token_project(user)
    if user.is_superuser or (role in GLOBAL_ROLES and in_group(user, role)):
        return None if limit is None else {limit}
    held = _memberships(user).get(role, set())
    return set(held) if limit is None else held & {limit}


def has_role(user: Any, project_id: int, role: str) -> bool:
    ids = project_ids(user, role)
    return ids is None or project_id in ids


def _union(*sets: Projects) -> Projects:
    if any(s is None for s in sets):
        return None
    return set().union(*sets)  # type: ignore[arg-type]


def _narrow(ids: Projects, project: int | None) -> Projects:
    """`ids` within the project the page is switched to (None: no switch)."""
    if project is None:
        return ids
    return {project} if ids is None or project in ids else set()


def _holds(user: Any, role: str, project_id: int | None) -> bool:
    """`role` in that project, or (None) in at least one."""
    ids = project_ids(user, role)
    if project_id is None:
        return ids is None or bool(ids)
    return ids is None or project_id in ids


def member_projects(user: Any) -> Projects:
    """The projects where `user` holds any role (None: every project)."""
    return _union(*(project_ids(user, role) for role in ROLES))


def is_member(user: Any, project_id: int) -> bool:
    """Whether `user` holds any role in the project: without one, its objects are
    answered as missing (404), with one, a refused action is a 403."""
    ids = member_projects(user)
    return ids is None or project_id in ids


def projects_of(user: Any) -> list[Project]:
    """The projects `user` belongs to, by slug: the switcher's choices."""
    ids = member_projects(user)
    projects = Project.objects.order_by("slug")
    return list(projects if ids is None else projects.filter(pk__in=ids))


def in_no_project(user: Any) -> bool:
    """Logged in and holding no role anywhere: the dashboard says so instead of erring."""
    ids = member_projects(user)
    return ids is not None and not ids


def profile_projects(user: Any) -> dict[int, int]:
    """Every profile's project, by profile id, read once per request (a small table):
    the scopes below filter runs by `profile_id IN (...)`, which the runs' indexes
    serve, instead of joining the profiles."""
    cache = getattr(user, "_airlock_profiles", None)
    if cache is None:
        cache = dict(AgentProfile.objects.values_list("pk", "project_id"))
        user._airlock_profiles = cache
    return cache


def _profiles_in(user: Any, ids: set[int]) -> list[int]:
    return [pk for pk, project in profile_projects(user).items() if project in ids]


def project_of(run: Run) -> int:
    """The run's project: its profile's."""
    profile = run._state.fields_cache.get("profile")
    if profile is not None:
        return int(profile.project_id)
    return int(AgentProfile.objects.values_list("project_id", flat=True).get(pk=run.profile_id))


# -- roles, per project (None: in at least one project) ------------------------------


def can_decide(user: Any, project_id: int | None = None) -> bool:
    return _holds(user, REVIEWER, project_id)


def can_cancel(user: Any, project_id: int | None = None) -> bool:
    return _holds(user, OPERATOR, project_id)


def can_launch(user: Any, project_id: int | None = None) -> bool:
    return _holds(user, LAUNCHER, project_id)


def can_admin(user: Any, project_id: int | None = None) -> bool:
    """Manages the project's profiles, webhooks and members in the admin."""
    return _holds(user, ADMIN, project_id)


def reads_all_runs(user: Any) -> bool:
    """Reads every run of every project: the fast paths that need no scope."""
    return project_ids(user, REVIEWER) is None or project_ids(user, OPERATOR) is None


def may_read_runs(user: Any) -> bool:
    """Reads some runs somewhere (a reader or a launcher in at least one project)."""
    return any(_holds(user, role, None) for role in GLOBAL_ROLES)


def reviewers(project_id: int | None = None) -> QuerySet[Any]:
    """Active reviewers (of `project_id`, or of any project): who is told about
    pending calls. Each recipient's list is then narrowed by decidable_approvals()."""
    from django.contrib.auth import get_user_model

    members = Q(memberships__role=REVIEWER)
    if project_id is not None:
        members &= Q(memberships__project_id=project_id)
    return get_user_model().objects.filter(Q(groups__name=REVIEWER) | members, is_active=True).distinct()


def launchable_profiles(user: Any) -> QuerySet[AgentProfile]:
    """The profiles `user` may launch (the launch form's choices, and what a launch accepts)."""
    ids = project_ids(user, LAUNCHER)
    profiles = AgentProfile.objects.launchable()
    return profiles if ids is None else profiles.filter(project_id__in=ids)


def visible_profiles(user: Any, *, project: int | None = None) -> QuerySet[AgentProfile]:
    """The profiles of the projects `user` belongs to: the filters' agent choices."""
    ids = _narrow(member_projects(user), project)
    profiles = AgentProfile.objects.all()
    return profiles if ids is None else profiles.filter(project_id__in=ids)


# -- runs and approvals --------------------------------------------------------------


def _run_scope(user: Any, project: int | None, prefix: str = "") -> Q | None:
    """Which runs `user` reads, as a filter on a run (`prefix`: the path to the run from
    the rows filtered); None: every run. Readers read their projects' runs, launchers
    their own runs in theirs."""
    readers = _narrow(_union(*(project_ids(user, role) for role in READERS)), project)
    if readers is None:
        return None
    launchers = _narrow(project_ids(user, LAUNCHER), project)
    scope = Q(**{f"{prefix}profile_id__in": _profiles_in(user, readers)}) if readers else Q(pk__in=[])
    if launchers is None or launchers:
        own = Q(**{f"{prefix}created_by_id": user.pk})
        if launchers is not None:
            own &= Q(**{f"{prefix}profile_id__in": _profiles_in(user, launchers)})
        scope |= own
    return scope


def visible_runs(user: Any, *, project: int | None = None) -> QuerySet[Run]:
    """The runs `user` may read (within `project`, the page's switch, when given)."""
    if not user.is_authenticated:
        return Run.objects.none()
    scope = _run_scope(user, project)
    return Run.objects.all() if scope is None else Run.objects.filter(scope)


def can_read_run(user: Any, run: Run) -> bool:
    project = project_of(run)
    if any(has_role(user, project, role) for role in READERS):
        return True
    return run.created_by_id == user.pk and has_role(user, project, LAUNCHER)


def can_drive(user: Any, run: Run) -> bool:
    """Who may propose an external run's calls, report their results and finish it:
    the launcher who started it (still a launcher in its project), or a superuser.
    Reading a run is not driving it: a reviewer who could approve a call must not also
    propose one."""
    if not user.is_authenticated:
        return False
    if not (user.is_superuser or run.created_by_id == user.pk):
        return False
    return has_role(user, project_of(run), LAUNCHER)


class RunHidden(Http404):
    """A run that exists but is not this user's to read. It is answered exactly like a
    run that does not exist (404, the same detail), so ids of others' runs (and of other
    projects') leak nothing; only the denial log line (agents.ops.middleware.denied)
    tells the two apart."""


# Every timeline request and poll reads this: written out (agents/runs/rows.py), it costs a
# third of the queryset. The script is the scripted client's input, which no reader
# shows; it grows with the run (28 kB for 500 calls) and decoding it was a fifth of
# loading the run.
_READABLE = rows.Joined(Run, ["profile", "created_by"], "a.id = %s", defer=["script"])


def readable_run(user: Any, run_id: int) -> Run:
    """The run if `user` may read it, for pages and API alike; otherwise Http404."""
    run = None
    if 0 < run_id <= MAX_ID:
        found = _READABLE.fetch([run_id])
        run = found[0] if found else None
    if run is None:
        raise Http404(f"no run {run_id}")
    if not can_read_run(user, run):
        raise RunHidden(f"no run {run_id}")
    return run


def visible_approvals(user: Any, *, project: int | None = None) -> QuerySet[Approval]:
    """The approvals of the runs `user` may read: the queue, its counts and badge, and
    the API list. The stats page (/reviews/stats/, #28) counts over this same set, with
    the page's `project` switch, so it shows no other project's calls."""
    if not user.is_authenticated:
        return Approval.objects.none()
    scope = _run_scope(user, project, "run__")
    # No `run IN (every run)` semi-join: with 100,000 runs it cost the queue a scan.
    return Approval.objects.all() if scope is None else Approval.objects.filter(scope)


def decidable_approvals(user: Any, *, project: int | None = None) -> QuerySet[Approval]:
    """The approvals of the projects where `user` reviews (what a digest may list and a
    Slack click may answer); separation of duties and votes are the caller's to apply."""
    ids = _narrow(project_ids(user, REVIEWER), project)
    if ids is None:
        return Approval.objects.all()
    return Approval.objects.filter(run__profile_id__in=_profiles_in(user, ids)) if ids else Approval.objects.none()


def reviews_profile(user: Any, profile_id: int) -> bool:
    """Whether `user` reviews the calls of that profile's project; no query for a
    global reviewer, one a request (the profile map) for the others."""
    ids = project_ids(user, REVIEWER)
    return ids is None or profile_projects(user).get(profile_id) in ids


def may_decide(user: Any, approval: Approval) -> bool:
    """Whether `user` may vote on `approval`: a reviewer in its run's project (duties
    are duties_separated()'s)."""
    return reviews_profile(user, approval.run.profile_id)


def login_required_htmx(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """login_required for a page and every fragment it polls. An htmx request whose
    session ended sends the whole page to the login form (HX-Redirect), coming back to
    the page it was on, instead of swapping the login page into the fragment."""
    protected = login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.htmx and not request.user.is_authenticated:  # type: ignore[attr-defined]
            back = request.htmx.current_url_abs_path or "/"  # type: ignore[attr-defined]
            return HttpResponseClientRedirect(redirect_to_login(back).url)
        return protected(request, *args, **kwargs)

    return wrapper


def duties_separated(user: Any, run: Run) -> bool:
    """True when `user` launched `run` and its policy separates duties: they may read
    the run's approvals but not vote on them, superusers included, whatever roles they
    hold in the run's project (a launcher who also reviews there still may not)."""
    if user is None or run.created_by_id is None or run.created_by_id != user.pk:
        return False
    return bool(run.policy()["separate_duties"])


# -- the Django admin: project admins manage their projects' rows --------------------


def admin_projects(user: Any) -> Projects:
    """The projects whose rows `user` manages in the admin (None: all, a superuser)."""
    return project_ids(user, ADMIN)


def admin_scope(user: Any, rows_: QuerySet[Any], path: str = "project") -> QuerySet[Any]:
    """`rows_` narrowed to the projects `user` administers (`path`: the project's field)."""
    ids = admin_projects(user)
    return rows_ if ids is None else rows_.filter(**{f"{path}__in": ids})
