"""Demo users and data for a fresh install: `make run` calls it after `migrate`.

Idempotent. The first run creates `admin` (superuser), `reviewer`, `operator` and
`launcher` (each in its group) with random passwords, keeps them in
AIRLOCK_DEMO_USERS_FILE (var/demo-users.txt, mode 0600) and prints them; later runs
reuse and re-print them. The first time there are no demo runs, it launches one run per
demo scenario as `launcher` and drives each until it rests, so the dashboard and the
review queue have something to show.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, Permission, User
from django.core.management.base import BaseCommand, CommandParser

from agents.actions.runs import run_launch
from agents.defaults import ensure
from agents.demo import SCENARIOS
from agents.models import AgentProfile, Run
from agents.runs import driver

USERS = [("admin", None), ("reviewer", "reviewer"), ("operator", "operator"), ("launcher", "launcher")]
# Addresses for the digest out of the box: the default email backend writes files under
# var/mail/ (EMAIL_BACKEND), so nothing leaves the machine until someone sets up SMTP.
EMAIL_DOMAIN = "airlock.local"


def demo_email(name: str) -> str:
    return f"{name}@{EMAIL_DOMAIN}"


def read_passwords(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#"):
            found[parts[0]] = parts[1]
    return found


def write_passwords(path: Path, passwords: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "# Airlock demo users (seed_demo): username password\n" + "".join(
        f"{name} {pw}\n" for name, pw in passwords.items()
    )
    # Created 0600 from the start (not chmod after writing), so it is never readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


class Command(BaseCommand):
    help = "Create the demo users (passwords in var/demo-users.txt) and, the first time, one run per demo scenario."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-runs", action="store_true", help="do not launch the demo scenarios")

    def handle(self, *args: Any, no_runs: bool = False, **options: Any) -> None:
        ensure(AgentProfile, Group, Permission)
        path = Path(settings.AIRLOCK_DEMO_USERS_FILE)
        saved = read_passwords(path)
        shown: list[tuple[str, str, str]] = []
        for name, group in USERS:
            password = saved.get(name) or secrets.token_urlsafe(12)
            user = User.objects.filter(username=name).first()
            if user is None:
                if group is None:
                    user = User.objects.create_superuser(name, email=demo_email(name), password=password)
                else:
                    # Staff status lets the operator into the admin's MCP pages (docs/mcp.md).
                    user = User.objects.create_user(
                        name, email=demo_email(name), password=password, is_staff=group == "operator"
                    )
            elif not user.check_password(password):
                # Someone set this password by other means: leave it, do not print a wrong one.
                saved.pop(name, None)
                shown.append((name, group or "superuser", "(changed outside seed_demo; not shown)"))
                continue
            if not user.email:
                # Seeded before the demo users had addresses: give them one, keep any other.
                user.email = demo_email(name)
                user.save(update_fields=["email"])
            if group is not None:
                user.groups.add(Group.objects.get(name=group))
            saved[name] = password
            shown.append((name, group or "superuser", password))
        write_passwords(path, saved)

        self.stdout.write(f"Demo users (kept in {path}):")
        for name, role, password in shown:
            self.stdout.write(f"  {name:<9} {password:<20} {role}")
        if settings.EMAIL_BACKEND.endswith("filebased.EmailBackend"):
            self.stdout.write(f"Their email ({demo_email('NAME')}) is written to {settings.EMAIL_FILE_PATH}/, not sent.")
        if no_runs or Run.objects.filter(profile__name="demo").exists():
            return
        launcher = User.objects.get(username="launcher")
        for scenario in SCENARIOS:
            run = run_launch(agent=scenario["agent"], task=scenario["task"], user=launcher)
            run = driver.drive(run.pk)
            self.stdout.write(f"Demo run {run.pk} ({scenario['name']}): {run.state}")
