from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.actions.teams import TeamError, project_get
from agents.models import EVENT_TYPES, Webhook
from agents.notifications import delivery as notify
from agents.tools.http import UrlRefused


class Command(BaseCommand):
    help = (
        "Add a webhook for the given events and print its signing secret once, as the last line "
        f"(events: {', '.join(EVENT_TYPES)})."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("url")
        parser.add_argument("--events", required=True, help="comma-separated, e.g. approval.pending,run.failed")
        parser.add_argument("--format", choices=[f for f, _ in Webhook.FORMATS], default="json")
        parser.add_argument(
            "--project", default=None, help="receive only this project's events (default: every project's)"
        )

    def handle(self, *args: Any, url: str, events: str, format: str, project: str | None, **options: Any) -> None:
        names = [e.strip() for e in events.split(",") if e.strip()]
        try:
            scope = project_get(project) if project is not None else None
        except TeamError as exc:
            raise CommandError(str(exc)) from None
        hook = Webhook(url=url, events=names, format=format, secret=notify.new_secret(), project=scope)
        try:
            hook.full_clean()
        except ValidationError as exc:
            problems = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items())
            raise CommandError(problems) from None
        try:
            notify.target(url)
        except UrlRefused as exc:
            # Saved anyway (DNS or the allow-list may change), but said now, not at 3 am.
            self.stderr.write(f"warning: deliveries would be refused now: {exc}")
        hook.save()
        where = f"project {scope.slug}" if scope is not None else "every project"
        self.stdout.write(f"Webhook {hook.pk} for {', '.join(names)} ({format}) of {where}.")
        self.stdout.write("Its signing secret is shown only now; verify deliveries with it (Standard Webhooks):")
        self.stdout.write(hook.secret)
