from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from agents.actions.forks import retry_candidates, runs_retry
from agents.engine import states
from agents.models import AgentProfile, Run
from agents.ops import metrics


def moment(value: str, flag: str) -> dt.datetime:
    parsed = parse_datetime(value)
    if parsed is None:
        try:
            parsed = dt.datetime.combine(dt.date.fromisoformat(value), dt.time())
        except ValueError:
            raise CommandError(f"{flag} takes an ISO 8601 time (2026-03-01T14:00:00Z), not {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


class Command(BaseCommand):
    help = (
        "Retry an agent's runs that failed in a time window (an outage), each from its last resting point: "
        "calls that already took effect are reused or asked about, never repeated blindly (docs/retry.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--agent", required=True, metavar="NAME", help="the agent profile")
        parser.add_argument("--failed-since", required=True, metavar="ISO", help="runs that failed at or after")
        parser.add_argument("--until", metavar="ISO", help="and before this time (default: now)")
        parser.add_argument(
            "--reason-kind", choices=metrics.REASON_KINDS, metavar="KIND",
            help=f"only failures of this kind, as metrics label them: {', '.join(metrics.REASON_KINDS)}",
        )
        parser.add_argument("--dry-run", action="store_true", help="print what would be retried; change nothing")

    def handle(
        self, *args: Any, agent: str, failed_since: str, until: str | None, reason_kind: str | None, dry_run: bool,
        **options: Any,
    ) -> None:
        if not AgentProfile.objects.filter(name=agent).exists():
            raise CommandError(f"no agent profile {agent!r}")
        since = moment(failed_since, "--failed-since")
        runs = Run.objects.filter(
            profile__name=agent, state=states.FAILED, finished_at__gte=since, purged_at__isnull=True,
            # A run retried before (even if that retry failed too) is retried through its fork.
            forks__isnull=True,
        )
        if until:
            runs = runs.filter(finished_at__lt=moment(until, "--until"))
        picked = [
            run for run in runs.select_related("profile").order_by("finished_at", "pk")
            if reason_kind is None or metrics.reason_kind(run.error) == reason_kind
        ]
        if dry_run:
            for run in picked:
                plan = retry_candidates(run)
                effects = ", ".join(f"{e['plan']} {e['tool']} (step {e['seq']})" for e in plan["effects"]) or "none"
                self.stdout.write(
                    f"run {run.pk} ({metrics.reason_kind(run.error)}): would retry after step {plan['fork_seq']}; "
                    f"effects already made: {effects}"
                )
            self.stdout.write(f"dry run: {len(picked)} run(s) would be retried")
            return
        retried = 0
        for start in range(0, len(picked), 200):
            for r in runs_retry(ids=[run.pk for run in picked[start:start + 200]], user=None):
                retried += r["outcome"] == "retried"
                into = f" as run {r['run']}" if "run" in r else ""
                self.stdout.write(f"run {r['id']}: {r['outcome']}{into}: {r['detail']}")
        self.stdout.write(f"retried {retried} of {len(picked)} run(s)")
