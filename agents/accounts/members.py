"""Members (docs/teams.md): the roles the identity provider gives a person, set at each
sign-in, and the hook that makes a person saved inactive leave."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Q

from agents import access
from agents.actions import people, teams
from agents.models import Membership

# The global groups single sign-on manages ("this role in every project"); any other
# group an administrator made is left alone.
MANAGED_GROUPS = ("reviewer", "operator", "launcher")


@dataclass(frozen=True)
class Roles:
    """What a person may be: (project id, role) memberships and global groups."""

    memberships: frozenset[tuple[int, str]] = frozenset()
    groups: frozenset[str] = frozenset()


def person_roles_sync(*, user: Any, roles: Roles) -> None:
    """Make `user`'s memberships and managed global groups exactly `roles`: what the
    claim gives is added, what it no longer gives is removed. One transaction, so a
    page never sees half of a sign-in's roles."""
    with transaction.atomic():
        have = set(Membership.objects.filter(user=user).values_list("project_id", "role"))
        was_admin = any(role == "admin" for _p, role in have)
        gone = have - roles.memberships
        if gone:
            q = Q()
            for project_id, role in gone:
                q |= Q(project_id=project_id, role=role)
            Membership.objects.filter(q, user=user).delete()
        Membership.objects.bulk_create(
            [Membership(user=user, project_id=p, role=r) for p, r in roles.memberships - have], ignore_conflicts=True
        )
        for name in MANAGED_GROUPS:
            group, _ = Group.objects.get_or_create(name=name)
            if name in roles.groups:
                user.groups.add(group)
            else:
                user.groups.remove(group)
        # Staff status follows the admin role, exactly as add_member and remove_member set it.
        teams.admin_staff_sync(user, was_admin=was_admin)
    # access caches a user's groups and roles on the object: this one is stale now.
    access.forget_roles(user)


def on_user_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    """post_save of a user (connected in agents/apps.py): a person saved inactive (the
    admin's "Active" box unticked) leaves at once. Each step is idempotent, so saving an
    inactive person again only finds nothing left to take."""
    if not created and not instance.is_active:
        people.person_leave(user=instance, reason="deactivated")
