"""seed_demo: users with kept passwords, demo runs the first time, idempotent."""

from __future__ import annotations

import io
import stat

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import RequestFactory

from agents.demo import SCENARIOS
from agents.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def users_file(settings, tmp_path):
    path = tmp_path / "var" / "demo-users.txt"
    settings.AIRLOCK_DEMO_USERS_FILE = path
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast, tests only
    return path


def seed(*args: str) -> str:
    out = io.StringIO()
    call_command("seed_demo", *args, stdout=out)
    return out.getvalue()


def can_log_in(username: str, password: str) -> bool:
    # Through the configured backends (django-axes wants the request).
    return authenticate(RequestFactory().post("/login/"), username=username, password=password) is not None


def passwords(path) -> dict[str, str]:
    return dict(line.split() for line in path.read_text().splitlines() if not line.startswith("#"))


def test_first_run_creates_users_password_file_and_demo_runs(defaults, users_file) -> None:
    output = seed()
    saved = passwords(users_file)
    assert sorted(saved) == ["admin", "launcher", "operator", "reviewer"]
    assert stat.S_IMODE(users_file.stat().st_mode) == 0o600
    for name, password in saved.items():
        assert f"{name}" in output and password in output
        assert can_log_in(name, password)
    assert User.objects.get(username="admin").is_superuser
    for group in ("reviewer", "operator", "launcher"):
        assert list(User.objects.get(username=group).groups.values_list("name", flat=True)) == [group]
    runs = Run.objects.order_by("pk")
    assert runs.count() == len(SCENARIOS)
    assert {r.created_by.username for r in runs} == {"launcher"}
    assert [r.state for r in runs] == ["awaiting_approval", "awaiting_approval", "done", "done"]


def test_second_run_reuses_and_reprints_the_passwords_and_launches_nothing(defaults, users_file) -> None:
    first = seed()
    saved = passwords(users_file)
    second = seed()
    assert passwords(users_file) == saved
    assert all(pw in second for pw in saved.values())
    assert User.objects.count() == 4 and Run.objects.count() == len(SCENARIOS)
    assert second.splitlines()[:5] == first.splitlines()[:5]


def test_a_password_changed_elsewhere_is_left_alone(defaults, users_file) -> None:
    seed("--no-runs")
    user = User.objects.get(username="operator")
    user.set_password("changed-by-hand-123")
    user.save()
    output = seed("--no-runs")
    assert can_log_in("operator", "changed-by-hand-123")
    assert "operator" not in passwords(users_file)
    assert "changed outside seed_demo" in output
    assert not Run.objects.exists()
