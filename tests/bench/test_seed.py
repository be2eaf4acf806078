"""`make bench`'s seeding and page measuring at a tiny scale, so they do not rot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings

from agents.models import AgentProfile, Approval, Message, Run, ToolCall, Transition
from agents.runs import driver
from bench import pages, seed
from tests.helpers import call, final, requires_postgres

pytestmark = [requires_postgres()]


@pytest.fixture
def reviewer_client(defaults: None) -> Client:
    user = User.objects.create_user("rita")
    user.groups.add(Group.objects.get(name="reviewer"))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def waiting(launch: Callable[..., Run]) -> Run:
    AgentProfile.objects.filter(name="scripted").update(always_ask_tools=["ledger_write"])
    run = launch([call("echo", text="a"), call("ledger_write", entry="x"), final()])
    run = driver.drive(run.pk)
    assert run.state == "awaiting_approval"
    return run


def test_clones_copy_the_run_and_its_rows_with_fresh_keys(waiting: Run) -> None:
    counts = seed.clone_runs(waiting, 3)
    clones = Run.objects.exclude(pk=waiting.pk)
    assert counts["runs"] == 3 and clones.count() == 3
    assert {c.state for c in clones} == {"awaiting_approval"}
    for model in (Transition, Message, ToolCall, Approval):
        assert model.objects.filter(run__in=clones).count() == 3 * model.objects.filter(run=waiting).count()
    assert Approval.objects.filter(status="pending").count() == 4
    keys = list(ToolCall.objects.values_list("idempotency_key", flat=True))
    assert len(keys) == len(set(keys)) and all(len(k) == 64 for k in keys)
    # Distinct creation times, stepping back from the template's.
    assert len(set(clones.values_list("created_at", flat=True))) == 3
    assert len(set(Approval.objects.values_list("created_at", flat=True))) == 4
    assert all(c.created_at < waiting.created_at for c in clones)


def test_clones_may_take_transitions_only(waiting: Run) -> None:
    seed.clone_runs(waiting, 2, parts=("transitions",))
    clones = Run.objects.exclude(pk=waiting.pk)
    assert Transition.objects.filter(run__in=clones).count() == 2 * waiting.transitions.count()
    assert not Message.objects.filter(run__in=clones).exists()


@pytest.mark.django_db(transaction=True)  # VACUUM cannot run inside a transaction
def test_seeded_queue_shows_the_clones_with_the_same_query_count(waiting: Run, reviewer_client: Client) -> None:
    with override_settings(ROOT_URLCONF="bench.urls"):
        before: dict[str, Any] = pages.measure(reviewer_client, {"queue": "/reviews/"})["queue"]
        seed.clone_runs(waiting, 4)
        seed.settle()
        after = pages.measure(reviewer_client, {"queue": "/reviews/", "minimal": "/bench/minimal/"})
    assert after["queue"]["queries"] == before["queries"] > after["minimal"]["queries"] > 0
    # Measured in turns, each page has its own figures.
    assert all(after[name]["p50_ms"] > 0 and after[name]["bytes"] > 0 for name in after)
    assert after["queue"]["bytes"] > after["minimal"]["bytes"]
    page = reviewer_client.get("/reviews/").content.decode()
    assert page.count("data-approval-id=") == 5


@pytest.mark.django_db(transaction=True)
def test_the_metrics_section_scrapes_a_seeded_database(waiting: Run) -> None:
    from bench import metrics

    seed.clone_runs(waiting, 3)
    result = metrics.metrics_bench()
    assert result["rows"] == {"runs": 4, "transitions": 4 * waiting.transitions.count(), "pending_approvals": 4}
    assert result["catch_up"]["scrapes"] == 2  # one fold, then one that finds nothing new
    assert result["steady"]["p50_ms"] > 0 and result["queries"] > 0
    assert set(result["alternatives"]) == {"group_by_runs", "group_by_runs_covering_index"}
    aggregate = result["store_aggregate"]
    assert aggregate["plain_commits_per_second"] > 0 and aggregate["with_shared_total_commits_per_second"] > 0
