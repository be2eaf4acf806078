from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.notifications.slack import link


class Command(BaseCommand):
    help = "Link a Slack member id (U...) to an Airlock user: their Slack clicks decide as them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("slack_member_id")

    def handle(self, *args: Any, username: str, slack_member_id: str, **options: Any) -> None:
        try:
            user = link(username, slack_member_id)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"linked Slack member {slack_member_id.strip()} to {user.get_username()}")
