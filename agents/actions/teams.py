"""Projects and their members, as the commands and the admin change them (docs/teams.md).

Who may see or do what with a role is agents/access.py's; this module only writes the
rows. Each function raises TeamError with a message naming what it did not find."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import transaction

from agents.models import AgentProfile, Membership, Project
from agents.models.projects import ROLES


class TeamError(ValueError):
    """An unknown project, user, role or profile: the message names it."""


def project_get(slug: str) -> Project:
    project = Project.objects.filter(slug=slug).first()
    if project is None:
        known = ", ".join(Project.objects.order_by("slug").values_list("slug", flat=True))
        raise TeamError(f"no project {slug!r} (known: {known})")
    return project


def user_get(username: str) -> Any:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise TeamError(f"no user named {username!r}")
    return user


def _role(role: str) -> str:
    if role not in ROLES:
        raise TeamError(f"no role {role!r} (roles: {', '.join(ROLES)})")
    return role


def project_create(*, slug: str, name: str = "") -> Project:
    try:
        validate_slug(slug)
    except ValidationError:
        raise TeamError(f"{slug!r} is not a slug: letters, digits, '-' and '_' only") from None
    if Project.objects.filter(slug=slug).exists():
        raise TeamError(f"project {slug!r} exists already")
    return Project.objects.create(slug=slug, name=name[:200])


def admin_staff_sync(user: Any, *, was_admin: bool) -> None:
    """Staff status follows the `admin` role, for every path that changes roles
    (add_member, remove_member, a single sign-on's groups claim): a project admin is
    made staff, so the admin site lets them in (to their projects' rows only); one who
    held the role somewhere (`was_admin`) and holds it nowhere now is staff no more.
    Superusers keep theirs. Call it in the transaction that changed the memberships."""
    staff = True if is_admin_anywhere(user) else (False if was_admin and not user.is_superuser else None)
    if staff is not None and staff != user.is_staff:
        type(user).objects.filter(pk=user.pk).update(is_staff=staff)
        user.is_staff = staff


def is_admin_anywhere(user: Any) -> bool:
    return Membership.objects.filter(user=user, role="admin").exists()


def member_add(*, project: Project, user: Any, role: str) -> bool:
    """Give `user` `role` in `project`; False when they held it already. A project admin
    is made staff (admin_staff_sync)."""
    role = _role(role)
    with transaction.atomic():
        was_admin = is_admin_anywhere(user)
        _membership, created = Membership.objects.get_or_create(project=project, user=user, role=role)
        admin_staff_sync(user, was_admin=was_admin)
    return created


def member_remove(*, project: Project, user: Any, role: str | None = None) -> int:
    """Take `role` (None: every role) in `project` from `user`; how many were removed.
    The last admin role gone, they are staff no more (admin_staff_sync)."""
    memberships = Membership.objects.filter(project=project, user=user)
    if role is not None:
        memberships = memberships.filter(role=_role(role))
    with transaction.atomic():
        was_admin = is_admin_anywhere(user)
        removed, _ = memberships.delete()
        admin_staff_sync(user, was_admin=was_admin)
    return removed


def profile_move(*, profile_name: str, project: Project) -> AgentProfile:
    """Put the profile (and so its runs, past and future) in `project`."""
    profile = AgentProfile.objects.filter(name=profile_name).first()
    if profile is None:
        raise TeamError(f"no agent profile named {profile_name!r}")
    AgentProfile.objects.filter(pk=profile.pk).update(project=project)
    profile.project = project
    return profile
