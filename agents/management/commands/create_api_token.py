from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.actions.teams import TeamError, project_get
from agents.actions.tokens import token_create


class Command(BaseCommand):
    help = "Create an API token for USER and print it once, as the last line (only its sha256 is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="a label to recognise the token by in the admin")
        parser.add_argument("--project", default=None, help="limit the token to this project (slug)")

    def handle(self, *args: Any, username: str, name: str, project: str | None, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive")
        try:
            scope = project_get(project) if project is not None else None
        except TeamError as exc:
            raise CommandError(str(exc)) from None
        token, raw = token_create(user=user, name=name, project=scope)
        limited = f", limited to project {scope.slug}" if scope is not None else ""
        self.stdout.write(
            f"API token {token.pk} for {username}{limited} (revoke: manage.py revoke_api_token {token.pk})."
        )
        self.stdout.write("It is shown only now; send it as 'Authorization: Bearer <token>':")
        self.stdout.write(raw)
