"""Teams: projects own agent profiles, and people hold roles per project (docs/teams.md).

The global groups `reviewer`, `operator` and `launcher` still mean "this role in every
project"; a `Membership` gives one role in one project. Every question of who may see or
do what is answered in agents/access.py, never here."""

from __future__ import annotations

from django.conf import settings
from django.db import models

DEFAULT_SLUG = "default"
ROLES = ("reviewer", "operator", "launcher", "admin")


class Project(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name or self.slug

    @classmethod
    def default_pk(cls) -> int:
        """The `default` project's id, made on first use: a profile made without a
        project (the demo, the tests, a deployment from before projects) lands there."""
        project, _ = cls.objects.get_or_create(slug=DEFAULT_SLUG, defaults={"name": "Default"})
        return project.pk


class Membership(models.Model):
    """One role of one person in one project."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=[(r, r) for r in ROLES])
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user", "role"], name="membership_unique")]
        indexes = [models.Index(fields=["user", "role"], name="membership_user_role")]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} in {self.project}"


def default_project() -> int:
    return Project.default_pk()
