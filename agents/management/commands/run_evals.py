from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.engine.policy import PolicyError
from agents.lib import jsonsafe
from agents.management.evals import load_cases, load_policy, run_isolated, verdict_changes


class Command(BaseCommand):
    help = (
        "Replay eval cases (files or directories of JSON in the export format) with the scripted "
        "model and the recorded tool results (strict replay; a case with \"tools\": \"live\" runs its "
        "tools); check trajectories and safety invariants; print a table; exit 1 if any case fails. "
        "Each case runs in a transaction rolled back at the end: the database is left as it was. "
        "--policy FILE replays every case again under a proposed policy and lists the cases whose "
        "verdicts change."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+")
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one case's run")
        parser.add_argument(
            "--keep", action="store_true",
            help="commit the replayed runs (and replay-* profiles) to look at them; not on a deployment's database",
        )  # fmt: skip
        parser.add_argument(
            "--policy", metavar="FILE",
            help='a proposed policy ({"rules", "always_ask_tools"?, "denied_tools"?, "irreversible_approvals"?})',
        )  # fmt: skip

    def handle(
        self, *args: Any, paths: list[str], timeout: float, keep: bool, policy: str | None, **options: Any
    ) -> None:
        proposal = None
        if policy is not None:
            if keep:
                raise CommandError("--policy cannot be combined with --keep: the proposed policy is tried, never kept")
            try:
                proposal = load_policy(policy)
            except OSError as exc:
                raise CommandError(f"cannot read {policy}: {exc.strerror}") from None
            except (jsonsafe.JsonError, PolicyError) as exc:
                raise CommandError(f"{policy}: {exc}") from None
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
        if proposal is not None:
            changed = 0
            self.stdout.write(f"under {policy}:")
            for (name, case), before in zip(cases, results, strict=True):
                after = run_isolated(name, case, timeout=timeout, policy=proposal)
                changes = verdict_changes(before, after)
                if not changes:
                    continue
                changed += 1
                self.stdout.write(f"{name}: verdicts change")
                for change in changes:
                    self.stdout.write(f"    - {change}")
                for problem in after.problems:
                    self.stdout.write(f"    ! {problem}")
            self.stdout.write(f"run_evals --policy: {changed} of {len(results)} case(s) change verdicts")
        if failed:
            raise SystemExit(1)
