from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.runs.evals import load_cases, run_isolated


class Command(BaseCommand):
    help = (
        "Replay eval cases (files or directories of JSON in the export format) with the scripted "
        "model; print a table; exit 1 if any case fails. Each case runs in a transaction rolled "
        "back at the end: the database is left as it was."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+")
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one case's run")
        parser.add_argument(
            "--keep", action="store_true",
            help="commit the replayed runs (and replay-* profiles) to look at them; not on a deployment's database",
        )  # fmt: skip

    def handle(self, *args: Any, paths: list[str], timeout: float, keep: bool, **options: Any) -> None:
        cases = load_cases(paths)
        if not cases:
            raise CommandError(f"no eval cases in {' '.join(paths)}")
        results = [run_isolated(name, case, timeout=timeout, keep=keep) for name, case in cases]
        width = max(len(r.name) for r in results)
        self.stdout.write(
            f"{'case':<{width}}  {'result':<6}  {'expected':<17}  {'got':<17}  steps  cost_micros  tokens  run"
        )
        for r in results:
            run = r.run
            got = run.state if run else "-"
            nums = (
                f"{run.steps:>5}  {run.cost_micros:>11}  {run.tokens:>6}  {run.pk if keep else '-'}"
                if run
                else f"{'-':>5}  {'-':>11}  {'-':>6}  -"
            )
            self.stdout.write(f"{r.name:<{width}}  {'ok' if r.ok else 'FAIL':<6}  {r.expected:<17}  {got:<17}  {nums}")
            for problem in r.problems:
                self.stdout.write(f"{'':<{width}}    - {problem}")
        failed = sum(not r.ok for r in results)
        self.stdout.write(f"run_evals: {len(results)} case(s), {len(results) - failed} passed, {failed} failed")
        if failed:
            raise SystemExit(1)
