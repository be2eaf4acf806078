"""Who may do what: the design's groups, checked the same way by pages, API and commands."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from agents.models import Run

REVIEWER, OPERATOR, LAUNCHER = "reviewer", "operator", "launcher"


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


def visible_runs(user: Any) -> QuerySet[Run]:
    """Reviewers, operators and superusers read every run; launchers their own."""
    if reads_all_runs(user):
        return Run.objects.all()
    if in_group(user, LAUNCHER):
        return Run.objects.filter(created_by=user)
    return Run.objects.none()


def can_read_run(user: Any, run: Run) -> bool:
    return reads_all_runs(user) or (in_group(user, LAUNCHER) and run.created_by_id == user.pk)


def duties_separated(user: Any, run: Run) -> bool:
    """True when `user` launched `run` and its policy separates duties: they may read
    the run's approvals but not vote on them, superusers included."""
    if user is None or run.created_by_id is None or run.created_by_id != user.pk:
        return False
    return bool(run.policy()["separate_duties"])
