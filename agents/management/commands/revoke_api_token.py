from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.actions.tokens import token_revoke


class Command(BaseCommand):
    help = "Revoke an API token by id, or every token of a user (--user)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("token_id", nargs="?", type=int)
        parser.add_argument("--user", help="revoke all of this user's tokens")

    def handle(self, *args: Any, token_id: int | None, user: str | None, **options: Any) -> None:
        if token_id is None and not user:
            raise CommandError("give a token id or --user USERNAME")
        owner = None
        if user:
            owner = get_user_model().objects.filter(username=user).first()
            if owner is None:
                raise CommandError(f"no user named {user!r}")
        count = token_revoke(token_id=token_id, user=owner)
        if token_id is not None and count == 0:
            raise CommandError(f"no active token {token_id}" + (f" of {user}" if user else ""))
        self.stdout.write(f"revoked {count} token(s)")
