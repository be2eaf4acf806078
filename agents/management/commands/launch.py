from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder

from agents.actions.base import ActionError
from agents.actions.runs import run_launch
from agents.engine import policy as engine_policy
from agents.lib import jsonsafe
from agents.management.evals import run_settle
from agents.models import Run
from agents.runs import store

EXIT = {"done": 0, "failed": 1, "cancelled": 1, "awaiting_approval": 2}


class Command(BaseCommand):
    help = (
        "Launch a run. With --wait, follow it (driving it in this process when no worker "
        "has it) and exit 0 when done, 1 when failed or cancelled, 2 when it waits for approval, "
        "3 when an external run waits for its client."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--agent", required=True)
        parser.add_argument("--task", required=True)
        parser.add_argument("--approver", choices=engine_policy.APPROVERS, default=engine_policy.HUMAN)
        parser.add_argument("--script", help="a JSON file with the scripted agent's decisions")
        parser.add_argument("--limits", help="JSON object tightening the profile's limits, e.g. '{\"max_steps\": 5}'")
        parser.add_argument("--policy", help="JSON object tightening the profile's policy (docs/policy.md)")
        parser.add_argument("--user", help="launch as this user (default: no user, the system)")
        parser.add_argument("--wait", action="store_true", help="follow the run until it rests")
        parser.add_argument("--timeout", type=float, default=900.0, help="give up waiting after this many seconds")
        parser.add_argument("--json", action="store_true", help="print the run as the API's JSON")

    def handle(self, *args: Any, **o: Any) -> None:
        script = limits = policy = user = None
        if o["script"]:
            try:
                with open(o["script"], encoding="utf-8") as f:
                    # An exported run may be large; NaN or 1e400 in it is refused all the same.
                    script = jsonsafe.parse(f.read(), max_chars=100_000_000)
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot read the script: {exc}") from None
            if isinstance(script, dict) and "script" in script:
                script = script["script"]  # an exported run or eval case works as is
        if o["limits"]:
            try:
                limits = jsonsafe.parse(o["limits"])
            except ValueError as exc:
                raise CommandError(f"--limits is not JSON: {exc}") from None
        if o["policy"]:
            try:
                policy = jsonsafe.parse(o["policy"])
            except ValueError as exc:
                raise CommandError(f"--policy is not JSON: {exc}") from None
        if o["user"]:
            user = get_user_model().objects.filter(username=o["user"]).first()
            if user is None:
                raise CommandError(f"no user named {o['user']!r}")
        try:
            run = run_launch(
                agent=o["agent"], task=o["task"], user=user, approver=o["approver"], limits=limits, script=script,
                policy=policy,
            )
        except ActionError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from None
        if o["wait"]:
            run = run_settle(run.pk, timeout=o["timeout"])
        run = Run.objects.select_related("profile").get(pk=run.pk)
        if o["json"]:
            self.stdout.write(json.dumps(run.to_dict(), cls=DjangoJSONEncoder, indent=2))
        else:
            line = f"run {run.pk}: {run.state}"
            if run.answer:
                line += f": {run.answer}"
            if run.error:
                line += f": {run.error}"
            self.stdout.write(line)
        if o["wait"]:
            raise SystemExit(3 if store.waits_for_client(run) else EXIT.get(run.state, 1))
