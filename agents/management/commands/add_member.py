from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.actions.teams import TeamError, member_add, project_get, user_get
from agents.models.projects import ROLES


class Command(BaseCommand):
    help = f"Give USERNAME the ROLE ({', '.join(ROLES)}) in the project SLUG."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("username")
        parser.add_argument("role")

    def handle(self, *args: Any, slug: str, username: str, role: str, **options: Any) -> None:
        try:
            added = member_add(project=project_get(slug), user=user_get(username), role=role)
        except TeamError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{username} is {role} in {slug}" + ("" if added else " (already was)"))
