from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.actions.teams import TeamError, member_remove, project_get, user_get


class Command(BaseCommand):
    help = "Take ROLE in the project SLUG from USERNAME; without ROLE, every role they hold there."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("username")
        parser.add_argument("role", nargs="?")

    def handle(self, *args: Any, slug: str, username: str, role: str | None, **options: Any) -> None:
        try:
            removed = member_remove(project=project_get(slug), user=user_get(username), role=role)
        except TeamError as exc:
            raise CommandError(str(exc)) from None
        what = f"the {role} role" if role else "every role"
        self.stdout.write(f"removed {what} of {username} in {slug} ({removed} membership(s))")
