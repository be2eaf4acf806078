from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.actions.teams import TeamError, project_create


class Command(BaseCommand):
    help = "Create a project (docs/teams.md): it owns agent profiles, their runs and their calls."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="", help="a readable name (default: none, the slug shows)")

    def handle(self, *args: Any, slug: str, name: str, **options: Any) -> None:
        try:
            project = project_create(slug=slug, name=name)
        except TeamError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"created project {project.slug}" + (f" ({project.name})" if project.name else ""))
