"""Who may read or do what: the design's roles, per project, checked the same way by
pages, API and commands. Every rule about visibility lives here, so the pages and the
API cannot drift.

Roles are held per project (`Membership`); the global groups `reviewer`, `operator` and
`launcher` mean "this role in every project", and superusers hold every role everywhere.
An API token limited to a project (`ApiToken.project`, set on the user object by
agents.actions.tokens) narrows every answer below to that project, superusers' included."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import wraps
from typing import Any, cast

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group
from django.contrib.auth.views import redirect_to_login
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django_htmx.http import HttpResponseClientRedirect

from agents.lib import rows
from agents.models import AgentProfile, Approval, Grant, Membership, Project, Run
from agents.models.projects import ROLES

REVIEWER, OPERATOR, LAUNCHER, ADMIN = ROLES
GLOBAL_ROLES = (REVIEWER, OPERATOR, LAUNCHER)  # a Django group of this name: the role in every project
READERS = (REVIEWER, OPERATOR)  # read every run of their project; launchers read their own
User = get_user_model()
MAX_ID = 2**63 - 1  # a bigint: a larger id cannot exist, and PostgreSQL would refuse to compare it

# A set of project ids, or None for "every project".
Projects = set[int] | None


def in_group(user: Any, name: str) -> bool:
    """Whether `user` is in the Django group `name` (superusers: always)."""
    if not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    return name in _roles_of(user)[0]


def token_project(user: Any) -> int | None:
    """The one project the request's API token is limited to, or None (a session, or a
    token of all the user's projects)."""
    return getattr(user, "_airlock_token_project", None)


def _memberships(user: Any) -> dict[str, set[int]]:
    return _roles_of(user)[1]


def _roles_of(user: Any) -> tuple[set[str], dict[str, set[int]]]:
    """The user's Django groups and per-project roles, read together once per request
    (one query: every API call and page asks both; an API token's read brings them
    along, `agents.actions.tokens`): cached on the user object, which lives as long as the
    request. `forget_roles` drops the cache after a change."""
    groups = getattr(user, "_airlock_groups", None)
    roles = getattr(user, "_airlock_roles", None)
    if groups is None or roles is None:
        groups, roles = remember_roles(user, rows.fetch(_roles_sql(), [user.pk]))
    return groups, roles


def remember_roles(user: Any, found: Iterable[Sequence[Any]]) -> tuple[set[str], dict[str, set[int]]]:
    """Cache on `user` the roles of `found`, rows (kind, name, project id) as
    `roles_union()` gives them ('g' for a Django group, 'm' for a project role; a row of
    NULLs, from an outer join that found none, is skipped)."""
    groups: set[str] = set()
    roles: dict[str, set[int]] = {role: set() for role in ROLES}
    for kind, name, project_id in found:
        if kind == "g":
            groups.add(name)
        elif kind == "m":
            roles.setdefault(name, set()).add(project_id)
    user._airlock_groups, user._airlock_roles = groups, roles
    return groups, roles


def forget_roles(user: Any) -> None:
    for name in ("_airlock_groups", "_airlock_roles"):
        if hasattr(user, name):
            delattr(user, name)


@functools.cache
def roles_union() -> str:
    """Every user's groups and project roles as rows (user_id, kind, name, project_id),
    for a query to filter or join on user_id (PostgreSQL pushes that into both halves)."""
    groups, links = Group._meta.db_table, cast(Any, User).groups.through._meta.db_table
    return (
        # The group's name in a subquery, not a join: a one-table branch takes the
        # caller's user_id into its index scan (a join's branch would hash every link).
        f"SELECT ug.user_id AS user_id, 'g' AS kind, (SELECT g.name FROM {groups} g WHERE g.id = ug.group_id)"  # noqa: S608
        f" AS name, NULL AS project_id FROM {links} ug"
        f" UNION ALL SELECT m.user_id, 'm', m.role, m.project_id FROM {Membership._meta.db_table} m"
    )


@functools.cache
def _roles_sql() -> str:
    return f"SELECT r.kind, r.name, r.project_id FROM ({roles_union()}) r WHERE r.user_id = %s"  # noqa: S608


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


def _profiles(user: Any) -> list[AgentProfile]:
    """Every profile (a small table) by name, with what the scopes ask of it, read once
    per user object: a request's scopes, review scope and agent choices share it."""
    cache = getattr(user, "_airlock_profiles", None)
    if cache is None:
        fields = ("pk", "project_id", "name", "reviewer_group", "backup_group")
        cache = list(AgentProfile.objects.only(*fields).order_by("name"))
        user._airlock_profiles = cache
    return cast(list[AgentProfile], cache)


def _profiles_in(user: Any, ids: set[int]) -> list[int]:
    """The ids of the profiles of projects `ids`: the scopes below filter runs by
    `profile_id IN (...)`, which the runs' indexes serve, instead of joining the
    profiles."""
    return [p.pk for p in _profiles(user) if p.project_id in ids]


def project_of(run: Run) -> int:
    """The run's project: its profile's."""
    profile = run._state.fields_cache.get("profile")
    if profile is not None:
        return int(profile.project_id)
    return int(AgentProfile.objects.values_list("project_id", flat=True).get(pk=run.profile_id))


# -- who reviews: a profile's reviewer group, else its project's reviewers ----------


def review_group(profile: AgentProfile) -> str:
    """The group that reviews `profile`'s calls: its own, or (empty) the project's
    reviewers (the `reviewer` group, which means every project, and the project's
    `reviewer` members)."""
    return profile.reviewer_group or REVIEWER


def may_review(user: Any, profile: AgentProfile, *, escalated: bool) -> bool:
    """Who may see in the queue and decide `profile`'s calls: THE rule, which every list
    (review_scope) and every decision (may_decide) derives from. Superusers; members of
    the profile's own reviewer group, or, when it names none, the reviewers of its
    project (`has_role`); and, once the call is escalated, members of its backup group.
    A project-limited API token reaches no other project's profile."""
    if not user.is_authenticated or not user.is_active:
        return False
    limit = token_project(user)
    if limit is not None and profile.project_id != limit:
        return False
    if profile.reviewer_group:
        if in_group(user, profile.reviewer_group):
            return True
    elif has_role(user, profile.project_id, REVIEWER):
        return True
    return escalated and bool(profile.backup_group) and in_group(user, profile.backup_group)


@dataclass(frozen=True)
class ReviewScope:
    """The profiles whose calls a user reviews, by id: `primary` always, `backup` once a
    call is escalated. `everything`: every profile as primary (the common case, where
    no profile names a group of its own and the user reviews every project), so lists
    need no filter at all."""

    everything: bool
    primary: frozenset[int]
    backup: frozenset[int]

    def covers(self, profile_id: int, *, escalated: bool) -> bool:
        return self.everything or profile_id in self.primary or (escalated and profile_id in self.backup)

    @property
    def empty(self) -> bool:
        return not (self.everything or self.primary or self.backup)

    def approvals(self, profiles: Any = None) -> Q:
        """The approvals this scope covers, as a filter (within `profiles`, a project's
        switch, when given)."""
        if self.everything and profiles is None:
            return Q()
        primary, backup = self.primary, self.backup
        if profiles is not None:
            primary = (frozenset(profiles) if self.everything else primary & profiles)
            backup = backup & profiles
        return Q(run__profile_id__in=primary) | Q(run__profile_id__in=backup, escalated_at__isnull=False)


def review_scope(user: Any) -> ReviewScope:
    """`may_review` over every profile, read once per user object (profiles are few: one
    small query, then the queue, its counts and the API filter by profile id)."""
    scope = getattr(user, "_airlock_review_scope", None)
    if scope is not None:
        return cast(ReviewScope, scope)
    if not user.is_authenticated or not user.is_active:
        scope = ReviewScope(False, frozenset(), frozenset())
    elif user.is_superuser and token_project(user) is None:
        scope = ReviewScope(True, frozenset(), frozenset())
    elif not _may_review_anything(user):
        scope = ReviewScope(False, frozenset(), frozenset())
    else:
        profiles = _profiles(user)
        primary = frozenset(p.pk for p in profiles if may_review(user, p, escalated=False))
        backup = frozenset(p.pk for p in profiles if may_review(user, p, escalated=True)) - primary
        # With no profile at all, "every profile" is what a reviewer of every project reviews.
        everything = len(primary) == len(profiles) if profiles else project_ids(user, REVIEWER) is None
        scope = ReviewScope(everything, primary, backup)
    user._airlock_review_scope = scope
    return scope


def _may_review_anything(user: Any) -> bool:
    """False when no profile can name a group that makes `user` a reviewer: no reviewer
    role anywhere, and no Django group but the role groups. Operators and launchers are
    answered without reading the profiles (every page asks, for the navigation)."""
    if project_ids(user, REVIEWER) != set():
        return True
    return bool(_roles_of(user)[0] - set(GLOBAL_ROLES))


def may_decide(user: Any, approval: Approval) -> bool:
    """`may_review` for one call: its run's profile, escalated or not (duties are
    duties_separated()'s). Reads the profile id only (the review scope), so a queue of
    cards asks no more queries."""
    if user is None:
        return False
    return review_scope(user).covers(approval.run.profile_id, escalated=approval.escalated_at is not None)


def reviews_profile(user: Any, profile_id: int) -> bool:
    """Whether `user` reviews that profile's calls (before any escalation)."""
    return review_scope(user).covers(profile_id, escalated=False)


def review_refusal(approval: Approval) -> str:
    """Why a user who may see `approval` may not decide it: who does."""
    profile = approval.run.profile
    backup = f" (and, once it is escalated, {profile.backup_group})" if profile.backup_group else ""
    who = f"the {profile.reviewer_group} group" if profile.reviewer_group else "the reviewers of its project"
    return f"{who}{backup} reviews the calls of agent {profile.name}"


def reviewable_approvals(user: Any, *, project: int | None = None) -> QuerySet[Approval]:
    """The approvals `user` may decide (their status aside; within `project`, the page's
    switch, when given): the digest, the emails, a Slack click, the reviewer's part of
    `visible_approvals`. Separation of duties and votes are the caller's to apply."""
    scope = review_scope(user)
    if scope.empty:
        return Approval.objects.none()
    return Approval.objects.filter(scope.approvals(_switched_profiles(user, project)))


def _switched_profiles(user: Any, project: int | None) -> frozenset[int] | None:
    return None if project is None else frozenset(_profiles_in(user, {project}))


def review_groups() -> set[str]:
    """Every group that reviews some profile, as primary or backup."""
    named = AgentProfile.objects.values_list("reviewer_group", "backup_group")
    return {REVIEWER} | {g for pair in named for g in pair if g}


def reviewers(profile: AgentProfile | None = None, *, escalated: bool = False) -> QuerySet[Any]:
    """Active people who review `profile`'s calls (its backup group too once
    `escalated`), or any profile's when `profile` is None: who is told about pending
    calls. What each is told is still filtered by `reviewable_approvals`."""
    if profile is None:
        who = Q(groups__name__in=review_groups()) | Q(memberships__role=REVIEWER)
    else:
        if profile.reviewer_group:
            who = Q(groups__name=profile.reviewer_group)
        else:
            who = Q(groups__name=REVIEWER) | Q(memberships__role=REVIEWER, memberships__project_id=profile.project_id)
        if escalated and profile.backup_group:
            who |= Q(groups__name=profile.backup_group)
    return get_user_model().objects.filter(who, is_active=True).distinct()


# -- roles, per project (None: in at least one project) ------------------------------


def can_decide(user: Any, project_id: int | None = None) -> bool:
    """Whether `user` reviews some profile's calls (in `project_id`, when given): the
    queue's buttons, the reviewer's settings. Which calls: `may_decide`."""
    scope = review_scope(user)
    if project_id is None or scope.everything:
        return not scope.empty
    in_project = set(_profiles_in(user, {project_id}))
    return bool(in_project & (scope.primary | scope.backup))


def can_cancel(user: Any, project_id: int | None = None) -> bool:
    return _holds(user, OPERATOR, project_id)


def can_launch(user: Any, project_id: int | None = None) -> bool:
    return _holds(user, LAUNCHER, project_id)


def can_admin(user: Any, project_id: int | None = None) -> bool:
    """Manages the project's profiles, webhooks and members in the admin."""
    return _holds(user, ADMIN, project_id)


def reads_all_runs(user: Any) -> bool:
    """Reads every run of every project (and its calls: reading is not deciding), the
    fast paths that need no scope: operators of every project, and reviewers of every
    profile."""
    return project_ids(user, OPERATOR) is None or review_scope(user).everything


def may_read_runs(user: Any) -> bool:
    """Reads some runs somewhere (an operator or launcher in at least one project, or
    whoever reviews some profile's calls): the lists' gate."""
    return _holds(user, OPERATOR, None) or _holds(user, LAUNCHER, None) or can_decide(user)


def reads_review_stats(user: Any) -> bool:
    """The review statistics (/reviews/stats/): operators and reviewers (and superusers)."""
    return _holds(user, OPERATOR, None) or can_decide(user)


def launchable_profiles(user: Any) -> QuerySet[AgentProfile]:
    """The profiles `user` may launch (the launch form's choices, and what a launch accepts)."""
    ids = project_ids(user, LAUNCHER)
    profiles = AgentProfile.objects.launchable()
    return profiles if ids is None else profiles.filter(project_id__in=ids)


def visible_profile_names(user: Any, *, project: int | None = None) -> list[str]:
    """The names of the profiles of the projects `user` belongs to (of `project`), in
    order: the filters' agent choices, from the profiles the scopes read anyway."""
    ids = _narrow(member_projects(user), project)
    return [p.name for p in _profiles(user) if ids is None or p.project_id in ids]


# -- runs and approvals --------------------------------------------------------------


def _run_scope(user: Any, project: int | None, *, approvals: bool = False) -> Q | None:
    """Which runs (or, `approvals`, which runs' calls) `user` reads, as a filter; None:
    all. Operators read their projects' runs, reviewers the runs of the profiles they
    review (a backup group's once a call was escalated), launchers their own runs in
    their projects."""
    prefix = "run__" if approvals else ""
    operators = _narrow(project_ids(user, OPERATOR), project)
    if operators is None:
        return None
    scope = review_scope(user)
    if scope.everything and project is None:
        return None
    q = Q(**{f"{prefix}profile_id__in": _profiles_in(user, operators)}) if operators else Q(pk__in=[])
    if approvals:
        q |= scope.approvals(_switched_profiles(user, project)) if not scope.empty else Q(pk__in=[])
    elif not scope.empty:
        switched = _switched_profiles(user, project)
        primary = (switched if scope.everything else (scope.primary if switched is None else scope.primary & switched))
        backup = scope.backup if switched is None else scope.backup & switched
        q |= Q(profile_id__in=primary or [])
        if backup:
            escalated = Exists(Approval.objects.filter(run=OuterRef("pk"), escalated_at__isnull=False))
            q |= Q(profile_id__in=backup) & escalated
    launchers = _narrow(project_ids(user, LAUNCHER), project)
    if launchers is None or launchers:
        own = Q(**{f"{prefix}created_by_id": user.pk})
        if launchers is not None:
            own &= Q(**{f"{prefix}profile_id__in": _profiles_in(user, launchers)})
        q |= own
    return q


def visible_runs(user: Any, *, project: int | None = None) -> QuerySet[Run]:
    """The runs `user` may read (within `project`, the page's switch, when given)."""
    if not user.is_authenticated:
        return Run.objects.none()
    scope = _run_scope(user, project)
    return Run.objects.all() if scope is None else Run.objects.filter(scope)


def can_read_run(user: Any, run: Run) -> bool:
    project = project_of(run)
    if has_role(user, project, OPERATOR):
        return True
    if run.created_by_id == user.pk and has_role(user, project, LAUNCHER):
        return True
    scope = review_scope(user)
    if scope.covers(run.profile_id, escalated=False):
        return True
    return run.profile_id in scope.backup and run.approvals.filter(escalated_at__isnull=False).exists()


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


def can_fork(user: Any, run: Run) -> bool:
    """Who may fork or retry a run (docs/retry.md): operators of its project (and
    superusers) any run, a launcher (still one there) their own."""
    project = project_of(run)
    if has_role(user, project, OPERATOR):
        return True
    return run.created_by_id == user.pk and has_role(user, project, LAUNCHER)


class RunHidden(Http404):
    """A run that exists but is not this user's to read. It is answered exactly like a
    run that does not exist (404, the same detail), so ids of others' runs (and of other
    projects') leak nothing; only the denial log line (agents.ops.middleware.denied)
    tells the two apart."""


# Every timeline request and poll reads this: written out (agents/lib/rows.py), it costs a
# third of the queryset. The script is the scripted client's input, which no reader
# shows; it grows with the run (28 kB for 500 calls) and decoding it was a fifth of
# loading the run.
_READABLE = rows.Joined(Run, ["profile", "created_by"], "a.id = %s", defer=["script"])
# The same read with what `Run.to_dict()` asks besides, in the one statement, prepared
# (the API's GET /api/runs/<id>, issue #48): the pending approval it waits on (the
# lowest id, as `.pending().first()` takes) and how many grants it has, so a run with
# none (most) costs no grants query. Approval and grant rows themselves stay the ORM's.
_PENDING = "c0"
_READABLE_FOR_DICT = rows.Joined(
    Run, ["profile", "created_by"], "a.id = %s", defer=["script"], prepared=True,
    beside=[
        ("_pending_approval", Approval,
         f"{_PENDING}.id = (SELECT min(p.id) FROM {Approval._meta.db_table} p WHERE p.run_id = a.id"
         f" AND p.status = '{Approval.Status.PENDING}')"),
        # Who edited and who claims the waiting call, each named in its `to_dict()`.
        ("_pending_edited_by", get_user_model(), f"c1.id = {_PENDING}.edited_by_id"),
        ("_pending_claimed_by", get_user_model(), f"c2.id = {_PENDING}.claimed_by_id"),
    ],
    annotate=[
        ("_grant_count", f"(SELECT count(*) FROM {Grant._meta.db_table} g WHERE g.run_id = a.id)"),
        # The votes `current_votes()` returns: with none, as while most calls wait, the
        # answer needs no votes query.
        ("_pending_votes", Approval.counted_votes_sql(_PENDING)),
    ],
)


def readable_run(user: Any, run_id: int, *, for_dict: bool = False, read: list[Any] | None = None) -> Run:
    """The run if `user` may read it, for pages and API alike; otherwise Http404.
    `for_dict`: read what its `to_dict()` needs in the same statement. `read`: the rows
    `run_read_for_dict`'s statement already read (beside the token), instead of reading."""
    run = None
    if 0 < run_id <= MAX_ID:
        if read is not None:
            found = _READABLE_FOR_DICT.instances(read)
        else:
            found = (_READABLE_FOR_DICT if for_dict else _READABLE).fetch([run_id])
        run = found[0] if found else None
    if run is None:
        raise Http404(f"no run {run_id}")
    if not can_read_run(user, run):
        raise RunHidden(f"no run {run_id}")
    if for_dict or read is not None:
        _attach_pending(run)
    return run


def _attach_pending(run: Run) -> None:
    """Hand the waiting call what the statement read beside it: who edited and who
    claims it (as `select_related` attaches them) and, when it has no counted votes,
    its votes (none, as a prefetch leaves them)."""
    approval: Approval | None = getattr(run, "_pending_approval", None)
    if approval is not None:
        approval.attach(
            {"edited_by": getattr(run, "_pending_edited_by", None), "claimed_by": getattr(run, "_pending_claimed_by", None)},
            counted_votes=getattr(run, "_pending_votes", None),
        )


def run_read_for_dict(run_id: int) -> tuple[str, list[Any]] | None:
    """The statement `readable_run(..., for_dict=True)` reads the run with, to send in
    another read's round trip (the token's: agents/api/runs.py); None for an id no run
    can have. The rows it reads are whoever asks: `readable_run` decides who sees them."""
    return (_READABLE_FOR_DICT.sql, [run_id]) if 0 < run_id <= MAX_ID else None


def visible_approvals(user: Any, *, project: int | None = None) -> QuerySet[Approval]:
    """The approvals `user` may see: the queue, its counts and badge, an approval's page,
    the stats and the API list (within `project`, the page's switch, when given).
    Operators see their projects' calls (read-only unless they also review), reviewers
    the calls they may decide (`reviewable_approvals`), launchers those of their own runs."""
    if not user.is_authenticated:
        return Approval.objects.none()
    scope = _run_scope(user, project, approvals=True)
    # No `run IN (every run)` semi-join: with 100,000 runs it cost the queue a scan.
    return Approval.objects.all() if scope is None else Approval.objects.filter(scope)


def can_claim(user: Any, approval: Approval) -> bool:
    """Who may claim a call ("I'm on it"): whoever may decide it (a reviewer the run's
    separation of duties does not exclude)."""
    return may_decide(user, approval) and not duties_separated(user, approval.run)


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
