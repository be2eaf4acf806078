"""The queue's pending total and tool choices, read in one statement (reviews.cards)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Count

from agents import access
from agents.models import Approval
from reviews import cards
from tests.helpers import requires_postgres

pytestmark = pytest.mark.django_db


def grouped(user) -> tuple[int, list[str]]:
    """The same answer through the ORM: what pending_summary must agree with."""
    rows = dict(access.visible_approvals(user).pending().values_list("tool").annotate(n=Count("pk")).order_by("tool"))
    return sum(rows.values()), list(rows)


@pytest.fixture
def three_tools(pending, lena, leo) -> list[Approval]:
    """Five approvals: four pending over two tools (one of them leo's), one decided with a third tool."""
    made = [pending(user=lena), pending(user=lena), pending(user=leo), pending(user=lena), pending(user=lena)]
    for approval, tool in zip(made, ["send_email", "ledger_write", "send_email", "ledger_write", "refund"], strict=True):
        Approval.objects.filter(pk=approval.pk).update(tool=tool)
    Approval.objects.filter(pk=made[4].pk).update(status=Approval.Status.APPROVED)
    return made


def test_a_reviewer_gets_every_pending_call_and_its_tools_once(three_tools, rita) -> None:
    assert cards.pending_summary(rita) == (4, ["ledger_write", "send_email"]) == grouped(rita)


def test_a_launcher_counts_only_the_calls_of_their_own_runs(three_tools, lena, leo) -> None:
    assert cards.pending_summary(lena) == (3, ["ledger_write", "send_email"]) == grouped(lena)
    assert cards.pending_summary(leo) == (1, ["send_email"]) == grouped(leo)


def test_nothing_pending_counts_zero_and_offers_no_tool(pending, rita) -> None:
    Approval.objects.filter(pk=pending().pk).update(status=Approval.Status.REJECTED)
    assert cards.pending_summary(rita) == (0, [])


def test_the_queue_page_offers_the_pending_tools_and_counts_them(three_tools, rita, as_user) -> None:
    page = as_user(rita).get("/reviews/").content.decode()
    tools = page.split('<select name="tool">')[1].split("</select>")[0]
    options = ["", "ledger_write", "send_email"]
    assert tools == "".join(f'<option value="{o}">{o or "all"}</option>' for o in options)
    assert "4 calls waiting" in page


@requires_postgres()
def test_the_tool_choices_can_skip_through_the_partial_index(three_tools) -> None:
    # On a table this small the planner reads the heap; with scans off it shows that the
    # partial index matches the statement (on 10,000 pending calls it picks it itself).
    pending = Approval.Status.PENDING
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + cards._SUMMARY_SQL, [pending, pending, pending])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "approval_pending_tool" in plan
