from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.actions.teams import TeamError, profile_move, project_get


class Command(BaseCommand):
    help = "Put the agent profile PROFILE, with its runs and calls, in the project SLUG."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("profile")
        parser.add_argument("slug")

    def handle(self, *args: Any, profile: str, slug: str, **options: Any) -> None:
        try:
            moved = profile_move(profile_name=profile, project=project_get(slug))
        except TeamError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"agent profile {moved.name} is in project {slug}")
