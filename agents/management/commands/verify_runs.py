from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agents.models import Run
from agents.runs.verify import verify_run


class Command(BaseCommand):
    help = "Replay every run's transitions and report runs whose cached state differs (exit 1 if any)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_ids", nargs="*", type=int, help="only these runs (default: all)")

    def handle(self, *args: Any, run_ids: list[int], **options: Any) -> None:
        runs = Run.objects.order_by("pk")
        if run_ids:
            runs = runs.filter(pk__in=run_ids)
        bad = checked = 0
        for run in runs.iterator():
            checked += 1
            problems = verify_run(run)
            if problems:
                bad += 1
                for problem in problems:
                    self.stdout.write(f"run {run.pk}: {problem}")
        self.stdout.write(f"verify_runs: {checked} run(s) checked, {bad} inconsistent")
        if bad:
            raise SystemExit(1)
