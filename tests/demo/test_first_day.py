"""A newcomer's first day with the demo (#47, item 5): its calls wait longer than the
15 minutes a newcomer spends reading, the card says how long the run has left, the
seeded users get the digest out of the box, and the digest's promise matches the call's
real expiry."""

from __future__ import annotations

import datetime as dt
import io
import re

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.models import F
from django.utils import timezone

from agents.models import AgentProfile, Approval, DecisionLink, Run
from agents.notifications import delivery as notify
from agents.runs import sweeper
from tests.helpers import client_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def seeded(defaults, settings, tmp_path) -> list[Approval]:
    settings.AIRLOCK_DEMO_USERS_FILE = tmp_path / "demo-users.txt"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast, tests only
    settings.AIRLOCK_BASE_URL = "https://airlock.example.org"
    call_command("seed_demo", stdout=io.StringIO())
    pending = list(Approval.objects.pending().select_related("run").order_by("pk"))
    assert len(pending) == 2
    return pending


def age(minutes: float) -> None:
    """Everything the demo made happened `minutes` earlier."""
    delta = dt.timedelta(minutes=minutes)
    Run.objects.update(created_at=F("created_at") - delta, deadline=F("deadline") - delta)
    Approval.objects.update(created_at=F("created_at") - delta)


def test_the_demos_calls_still_wait_after_an_hour_of_reading(seeded) -> None:
    age(60)
    sweeper.sweep()
    assert Approval.objects.pending().count() == 2
    assert set(Run.objects.filter(profile__name="demo").values_list("state", flat=True)) == {"awaiting_approval", "done"}
    run = seeded[0].run
    assert abs(run.deadline - run.created_at - dt.timedelta(hours=24)) < dt.timedelta(seconds=5)


def test_a_card_shows_its_runs_remaining_deadline(seeded) -> None:
    age(60)
    html = client_for(User.objects.get(username="reviewer")).get("/reviews/").content.decode()
    shown = re.findall(r'run deadline in <time datetime="[^"]+">([^<]+)</time>', html)
    assert len(shown) == 2 and all(re.fullmatch(r"22 h 59 min|23 h", t) for t in shown), shown


def test_the_seeded_reviewer_gets_a_digest_whose_links_end_with_the_call(seeded, mailoutbox) -> None:
    reviewer = User.objects.get(username="reviewer")
    assert reviewer.email == "reviewer@airlock.local"
    assert all(u.email for u in User.objects.filter(username__in=["admin", "operator", "launcher"]))

    assert notify.send_digest(now=timezone.now() + dt.timedelta(seconds=61)) == 1
    [message] = mailoutbox
    assert message.to == ["reviewer@airlock.local"]
    for a in seeded:
        deadline = a.run.deadline.astimezone(dt.UTC)
        assert f"Decide by {deadline:%Y-%m-%d %H:%M} UTC (its run's deadline)." in message.body
    # The links live as long as the calls can be decided: 24 hours, not the 72 of the setting.
    links = DecisionLink.objects.filter(user=reviewer).select_related("approval__run")
    assert len(links) == 2 and all(link.expires_at == link.approval.run.deadline for link in links)
    assert "until its call's decide-by time and at most 72 hours" in message.body


def test_the_navigation_links_the_notification_settings(seeded) -> None:
    for name in ("reviewer", "operator", "launcher"):
        html = client_for(User.objects.get(username=name)).get("/").content.decode()
        nav = html[html.index('<nav class="topnav"') : html.index("</nav>")]
        assert '<a href="/account/notifications/">Notifications</a>' in nav
    page = client_for(User.objects.get(username="reviewer")).get("/account/notifications/").content.decode()
    assert '<a href="/account/notifications/" aria-current="page">Notifications</a>' in page


def _migrate(target: str) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("agents", target)])


def test_0037_gives_an_existing_demo_profile_a_first_days_deadline_and_keeps_an_admins(defaults) -> None:
    try:
        _migrate("0036_gateway_tasks")
        AgentProfile.objects.filter(name="demo").update(limits={"max_steps": 30})
        AgentProfile.objects.filter(name="scripted").update(limits={})
        _migrate("0037_demo_first_day")
        demo, scripted = (AgentProfile.objects.get(name=n).limits for n in ("demo", "scripted"))
        _migrate("0036_gateway_tasks")
        AgentProfile.objects.filter(name="demo").update(limits={"deadline_seconds": 600})
        _migrate("0037_demo_first_day")
        chosen = AgentProfile.objects.get(name="demo").limits
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes("agents")[0][1])
    assert demo == {"max_steps": 30, "deadline_seconds": 86400}
    assert scripted == {}
    assert chosen == {"deadline_seconds": 600}
