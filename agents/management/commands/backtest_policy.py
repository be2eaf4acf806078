from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.engine.policy import PolicyError
from agents.lib import jsonsafe
from agents.models import AgentProfile
from agents.runs.backtest import CLASSES, DEFAULT_DAYS, backtest


class Command(BaseCommand):
    help = (
        "What a proposed policy would have done to the calls proposed under PROFILE in the last "
        'N days: FILE is a JSON object {"rules", "always_ask_tools"?, "denied_tools"?, '
        '"irreversible_approvals"?}. Reads history only; changes nothing.'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("profile")
        parser.add_argument("--rules", required=True, metavar="FILE", help="the proposed policy fields (JSON)")
        parser.add_argument("--days", type=int, default=DEFAULT_DAYS)
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the whole report as JSON")

    def handle(self, *args: Any, profile: str, rules: str, days: int, as_json: bool, **options: Any) -> None:
        found = AgentProfile.objects.filter(name=profile).first()
        if found is None:
            raise CommandError(f"no agent profile {profile!r}")
        try:
            with open(rules, "rb") as f:
                proposal = jsonsafe.parse(f.read())
        except OSError as exc:
            raise CommandError(f"cannot read {rules}: {exc.strerror}") from None
        except jsonsafe.JsonError as exc:
            raise CommandError(f"{rules} is not JSON: {exc}") from None
        try:
            report = backtest(found, proposal, days=days)
        except PolicyError as exc:
            raise CommandError(f"{rules}: {exc}") from None
        if as_json:
            self.stdout.write(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
            return
        changed = sum(len(v) for v in report.changes.values())
        self.stdout.write(
            f"backtest_policy {report.profile}: {report.calls} call(s) in the last {days} day(s), "
            f"{changed} would be decided differently"
        )
        if report.unjudged:
            self.stdout.write(f"not judged: {report.unjudged_text()}")
        for cls in CLASSES:
            if not report.changes.get(cls):
                continue
            self.stdout.write(report.summary(cls))
            for change in report.changes[cls]:
                call = change.call
                where = f" approval #{call.approval.pk} ({call.outcome})" if call.approval else f" ({call.outcome})"
                self.stdout.write(
                    f"  run {call.run.pk} seq {call.seq} {call.tool} {json.dumps(call.args, sort_keys=True)[:200]}"
                    f"{where}: {change.after.reason}"
                )
