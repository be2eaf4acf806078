from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from agents.models import AgentProfile, Run
from agents.runs.export import ARCHIVE_FILE, write_archive

ARCHIVE_NAMES = (ARCHIVE_FILE, "manifest.json")


def _when(value: str, flag: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(f"{flag} must be an ISO date or time, like 2026-01-31 or 2026-01-31T12:00:00Z") from None
    return when if timezone.is_aware(when) else timezone.make_aware(when, dt.UTC)


class Command(BaseCommand):
    help = "Write the runs created in [--since, --until) to DIR as JSON Lines with a manifest of counts and sha256s."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", required=True, metavar="ISO")
        parser.add_argument("--until", required=True, metavar="ISO")
        parser.add_argument("--out", required=True, metavar="DIR")
        parser.add_argument("--agent", metavar="NAME", help="only runs of this profile")
        parser.add_argument("--force", action="store_true", help="replace an archive already in DIR")

    def handle(
        self, *args: Any, since: str, until: str, out: str, agent: str | None, force: bool = False, **options: Any
    ) -> None:
        start, end = _when(since, "--since"), _when(until, "--until")
        if end <= start:
            raise CommandError("--until must be after --since")
        # An archive is often the only copy left after a purge: never replace one unasked.
        existing = [name for name in ARCHIVE_NAMES if (Path(out) / name).exists()]
        if existing and not force:
            raise CommandError(
                f"{out} already holds an archive ({', '.join(existing)}); choose another --out, or add --force to replace it"
            )
        runs = Run.objects.filter(created_at__gte=start, created_at__lt=end)
        if agent:
            if not AgentProfile.objects.filter(name=agent).exists():
                raise CommandError(f"no agent profile {agent!r}")
            runs = runs.filter(profile__name=agent)
        try:
            manifest = write_archive(runs, Path(out), since=start, until=end, agent=agent)
        except OSError as exc:
            raise CommandError(f"cannot write to {out}: {exc}") from None
        counts = ", ".join(f"{k} {v}" for k, v in manifest["counts"].items())
        self.stdout.write(f"exported to {out}: {counts}")
