"""Who may read or do what: the design's groups, checked the same way by pages, API and
commands. Every rule about visibility lives here, so the pages and the API cannot drift."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, cast

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django_htmx.http import HttpResponseClientRedirect

from agents.models import AgentProfile, Approval, Run
from agents.runs import rows

REVIEWER, OPERATOR, LAUNCHER = "reviewer", "operator", "launcher"
MAX_ID = 2**63 - 1  # a bigint: a larger id cannot exist, and PostgreSQL would refuse to compare it


def in_group(user: Any, name: str) -> bool:
    if not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    cache = getattr(user, "_airlock_groups", None)
    if cache is None:
        cache = set(user.groups.values_list("name", flat=True))
        user._airlock_groups = cache
    return name in cache


def review_group(profile: AgentProfile) -> str:
    """The group that reviews `profile`'s calls: its own, or the `reviewer` group."""
    return profile.reviewer_group or REVIEWER


def may_review(user: Any, profile: AgentProfile, *, escalated: bool) -> bool:
    """Who may see in the queue and decide `profile`'s calls: THE rule, which every list
    (review_scope) and every decision (may_decide) derives from. Superusers; members of
    the profile's reviewer group (`review_group`); and, once the call is escalated,
    members of its backup group."""
    if not user.is_authenticated or not user.is_active:
        return False
    if in_group(user, review_group(profile)):
        return True
    return escalated and bool(profile.backup_group) and in_group(user, profile.backup_group)


@dataclass(frozen=True)
class ReviewScope:
    """The profiles whose calls a user reviews, by id: `primary` always, `backup` once a
    call is escalated. `everything`: every profile as primary (the common case, where
    no profile names a group of its own), so lists need no filter at all."""

    everything: bool
    primary: frozenset[int]
    backup: frozenset[int]

    def covers(self, profile_id: int, *, escalated: bool) -> bool:
        return self.everything or profile_id in self.primary or (escalated and profile_id in self.backup)

    @property
    def empty(self) -> bool:
        return not (self.everything or self.primary or self.backup)

    def approvals(self) -> Q:
        """The approvals this scope covers, as a filter."""
        if self.everything:
            return Q()
        return Q(run__profile_id__in=self.primary) | Q(run__profile_id__in=self.backup, escalated_at__isnull=False)


def review_scope(user: Any) -> ReviewScope:
    """`may_review` over every profile, read once per user object (profiles are few: one
    small query, then the queue, its counts and the API filter by profile id)."""
    scope = getattr(user, "_airlock_review_scope", None)
    if scope is not None:
        return cast(ReviewScope, scope)
    if not user.is_authenticated or not user.is_active:
        scope = ReviewScope(False, frozenset(), frozenset())
    elif user.is_superuser:
        scope = ReviewScope(True, frozenset(), frozenset())
    else:
        profiles = list(AgentProfile.objects.only("pk", "reviewer_group", "backup_group"))
        primary = frozenset(p.pk for p in profiles if may_review(user, p, escalated=False))
        backup = frozenset(p.pk for p in profiles if may_review(user, p, escalated=True)) - primary
        # With no profile at all, "every profile" is what the reviewer group would review.
        everything = len(primary) == len(profiles) if profiles else in_group(user, REVIEWER)
        scope = ReviewScope(everything, primary, backup)
    user._airlock_review_scope = scope
    return scope


def may_decide(user: Any, approval: Approval) -> bool:
    """`may_review` for one call: its run's profile, escalated or not. Reads the profile
    id only (the review scope), so a queue of cards asks no more queries."""
    if user is None:
        return False
    return review_scope(user).covers(approval.run.profile_id, escalated=approval.escalated_at is not None)


def review_refusal(approval: Approval) -> str:
    """Why a user who may see `approval` may not decide it: who does."""
    profile = approval.run.profile
    backup = f" (and, once it is escalated, {profile.backup_group})" if profile.backup_group else ""
    return f"the {review_group(profile)} group{backup} reviews the calls of agent {profile.name}"


def can_decide(user: Any) -> bool:
    """Whether `user` reviews any profile's calls (the queue's buttons, the reviewer's
    settings); which calls is `may_decide`."""
    return not review_scope(user).empty


def reviewable_approvals(user: Any) -> QuerySet[Approval]:
    """The approvals `user` may decide (their status aside): the digest, the emails,
    the filter behind `visible_approvals` for a reviewer."""
    scope = review_scope(user)
    if scope.empty:
        return Approval.objects.none()
    return Approval.objects.filter(scope.approvals())


def review_groups() -> set[str]:
    """Every group that reviews some profile, as primary or backup."""
    named = AgentProfile.objects.values_list("reviewer_group", "backup_group")
    return {REVIEWER} | {g for pair in named for g in pair if g}


def reviewers(profile: AgentProfile | None = None, *, escalated: bool = False) -> QuerySet[Any]:
    """Active members of the groups that review `profile`'s calls (its backup group too
    once `escalated`), or of any profile's when `profile` is None: who is told about
    pending calls. What each is told is still filtered by `reviewable_approvals`."""
    from django.contrib.auth import get_user_model

    if profile is None:
        groups = review_groups()
    else:
        groups = {review_group(profile)} | ({profile.backup_group} if escalated and profile.backup_group else set())
    return get_user_model().objects.filter(is_active=True, groups__name__in=groups).distinct()


def can_cancel(user: Any) -> bool:
    return in_group(user, OPERATOR)


def can_launch(user: Any) -> bool:
    return in_group(user, LAUNCHER)


def reads_all_runs(user: Any) -> bool:
    """Operators and superusers read every run (and its calls: reading is not deciding),
    and so do reviewers who review every profile."""
    return in_group(user, OPERATOR) or review_scope(user).everything


def reads_runs(user: Any) -> bool:
    """Whether `user` reads any run at all (the lists' gate): operators, launchers, and
    whoever reviews some profile's calls."""
    return reads_all_runs(user) or in_group(user, LAUNCHER) or can_decide(user)


def reads_review_stats(user: Any) -> bool:
    """The review statistics (/reviews/stats/): operators and reviewers (and superusers)."""
    return reads_all_runs(user)


def visible_runs(user: Any) -> QuerySet[Run]:
    """Every run for those who read all; otherwise a launcher's own runs and the runs of
    the profiles the user reviews (those of a backup group's profiles once escalated)."""
    if reads_all_runs(user):
        return Run.objects.all()
    scope = review_scope(user)
    if scope.empty and not in_group(user, LAUNCHER):
        return Run.objects.none()
    mine = Q(created_by=user) if in_group(user, LAUNCHER) else Q(pk__in=[])
    escalated = Exists(Approval.objects.filter(run=OuterRef("pk"), escalated_at__isnull=False))
    return Run.objects.filter(mine | Q(profile_id__in=scope.primary) | (Q(profile_id__in=scope.backup) & escalated))


def can_read_run(user: Any, run: Run) -> bool:
    # Own run first: a launcher driving their run (every decision API call) then
    # needs no read of the review scope.
    if (in_group(user, LAUNCHER) and run.created_by_id == user.pk) or reads_all_runs(user):
        return True
    scope = review_scope(user)
    if scope.covers(run.profile_id, escalated=False):
        return True
    return run.profile_id in scope.backup and run.approvals.filter(escalated_at__isnull=False).exists()


def can_drive(user: Any, run: Run) -> bool:
    """Who may propose an external run's calls, report their results and finish it:
    the launcher who started it (still a launcher), or a superuser. Reading a run is
    not driving it: a reviewer who could approve a call must not also propose one."""
    if not user.is_authenticated:
        return False
    return user.is_superuser or (run.created_by_id == user.pk and in_group(user, LAUNCHER))


class RunHidden(Http404):
    """A run that exists but is not this user's to read. It is answered exactly like a
    run that does not exist (404, the same detail), so ids of others' runs leak nothing;
    only the denial log line (agents.ops.middleware.denied) tells the two apart."""


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


def visible_approvals(user: Any) -> QuerySet[Approval]:
    """The approvals `user` may see: the queue, its counts and badge, an approval's page
    and the API list. Those who read every run see every call (an operator's are
    read-only); otherwise the calls they may decide (`reviewable_approvals`) and, for a
    launcher, those of their own runs."""
    if reads_all_runs(user):
        # No `run IN (every run)` semi-join: with 100,000 runs it cost the queue a scan.
        return Approval.objects.all()
    scope = review_scope(user)
    mine = Q(run__created_by=user) if in_group(user, LAUNCHER) else Q(pk__in=[])
    if scope.empty:
        return Approval.objects.filter(mine)
    return Approval.objects.filter(mine | scope.approvals())


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


def can_claim(user: Any, approval: Approval) -> bool:
    """Who may claim a call ("I'm on it"): whoever may decide it (a reviewer the run's
    separation of duties does not exclude)."""
    return may_decide(user, approval) and not duties_separated(user, approval.run)


def duties_separated(user: Any, run: Run) -> bool:
    """True when `user` launched `run` and its policy separates duties: they may read
    the run's approvals but not vote on them, superusers included."""
    if user is None or run.created_by_id is None or run.created_by_id != user.pk:
        return False
    return bool(run.policy()["separate_duties"])


def can_fork(user: Any, run: Run) -> bool:
    """Who may fork or retry a run (docs/retry.md): operators and superusers any run,
    a launcher (still one) their own."""
    if in_group(user, OPERATOR):
        return True
    return in_group(user, LAUNCHER) and run.created_by_id == user.pk
