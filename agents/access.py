"""Who may read or do what: the design's groups, checked the same way by pages, API and
commands. Every rule about visibility lives here, so the pages and the API cannot drift."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django_htmx.http import HttpResponseClientRedirect

from agents.models import Approval, Run
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


def can_decide(user: Any) -> bool:
    return in_group(user, REVIEWER)


def reviewers() -> QuerySet[Any]:
    """Active members of the reviewer group: who is told about pending calls."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(is_active=True, groups__name=REVIEWER).distinct()


def can_cancel(user: Any) -> bool:
    return in_group(user, OPERATOR)


def can_launch(user: Any) -> bool:
    return in_group(user, LAUNCHER)


def reads_all_runs(user: Any) -> bool:
    return in_group(user, REVIEWER) or in_group(user, OPERATOR)


def reads_review_stats(user: Any) -> bool:
    """The review statistics (/reviews/stats/): operators and reviewers (and superusers)."""
    return reads_all_runs(user)


def visible_runs(user: Any) -> QuerySet[Run]:
    """Reviewers, operators and superusers read every run; launchers their own."""
    if reads_all_runs(user):
        return Run.objects.all()
    if in_group(user, LAUNCHER):
        return Run.objects.filter(created_by=user)
    return Run.objects.none()


def can_read_run(user: Any, run: Run) -> bool:
    return reads_all_runs(user) or (in_group(user, LAUNCHER) and run.created_by_id == user.pk)


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
    """The approvals of the runs `user` may read: the queue and the API list both."""
    if reads_all_runs(user):
        # No `run IN (every run)` semi-join: with 100,000 runs it cost the queue a scan.
        return Approval.objects.all()
    return Approval.objects.filter(run__in=visible_runs(user))


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
    the run's approvals but not vote on them, superusers included."""
    if user is None or run.created_by_id is None or run.created_by_id != user.pk:
        return False
    return bool(run.policy()["separate_duties"])
