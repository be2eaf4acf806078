from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.models import AgentProfile, Run
from agents.runs import retention
from agents.runs.export import check_archive, write_archive


class Command(BaseCommand):
    help = (
        "Purge the content of finished runs past their retention (AIRLOCK_RETENTION_DAYS, a profile's "
        "retention_days, or --older-than), keeping their decision record; held runs are kept."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=int, metavar="DAYS", help="finished more than DAYS days ago")
        parser.add_argument("--agent", metavar="NAME", help="only runs of this profile")
        parser.add_argument("--dry-run", action="store_true", help="print what would be purged; change nothing")
        parser.add_argument("--export-to", metavar="DIR", help="export exactly what is purged here first")

    def handle(
        self,
        *args: Any,
        older_than: int | None,
        agent: str | None,
        dry_run: bool,
        export_to: str | None,
        **options: Any,
    ) -> None:
        if older_than is not None and older_than < 0:
            raise CommandError("--older-than must be 0 or more days")
        if agent and not AgentProfile.objects.filter(name=agent).exists():
            raise CommandError(f"no agent profile {agent!r}")
        if older_than is None and not retention.retention_set():
            self.stdout.write(
                "no retention is set (AIRLOCK_RETENTION_DAYS, a profile's retention_days): nothing to purge"
            )
            return
        only = None
        if export_to and not dry_run:
            # Export what is due now, then purge only those runs: a run that became due
            # in between waits for the next purge rather than go unexported.
            ids = list(retention.due(older_than_days=older_than, agent=agent))
            try:
                manifest = write_archive(Run.objects.filter(pk__in=ids), Path(export_to), purge=True)
                problems = check_archive(Path(export_to))
            except OSError as exc:
                raise CommandError(f"export to {export_to} failed, nothing purged: {exc}") from None
            if problems:
                raise CommandError(f"export to {export_to} does not match its manifest, nothing purged: {problems[0]}")
            self.stdout.write(f"exported {manifest['counts']['runs']} run(s) to {export_to}")
            only = ids
        report = retention.purge(
            actor="manage.py purge_runs", older_than_days=older_than, agent=agent, only=only, dry_run=dry_run,
            exported_to=export_to or "",
        )  # fmt: skip
        rows = ", ".join(f"{k} {v}" for k, v in sorted(report.rows.items())) or "none"
        verb = "would purge" if dry_run else "purged"
        self.stdout.write(f"{verb} {report.runs} run(s); rows: {rows}; bytes: {report.bytes}")
