from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.models import Run
from agents.runs.export import export_run


class Command(BaseCommand):
    help = "Print a run as JSON (the timeline's download; also an eval case for run_evals)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id", type=int)
        parser.add_argument("--output", "-o", help="write to this file instead of stdout")

    def handle(self, *args: Any, run_id: int, output: str | None, **options: Any) -> None:
        run = Run.objects.select_related("profile").filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"no run {run_id}")
        text = json.dumps(export_run(run), indent=2, ensure_ascii=False, sort_keys=False)
        if output:
            with open(output, "w", encoding="utf-8") as f:
                f.write(text + "\n")
            self.stderr.write(f"run {run_id} written to {output}")
        else:
            self.stdout.write(text)
