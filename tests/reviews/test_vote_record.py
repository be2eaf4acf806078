"""Votes that decided nothing stay on the record (issue 25, item 7): a two-person call
with one vote that expired, and votes cast on arguments someone edited afterwards, are
shown on the run's page (its approvals table and its timeline)."""

from __future__ import annotations

import re

import pytest

from agents.actions.approvals import approval_decide, approval_expire
from agents.models import Approval, Run
from tests.helpers import call, final

pytestmark = pytest.mark.django_db(transaction=True)

TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign the ledger"}
SCRIPT = [call("ledger_write", entry="pay ACME 100"), final("paid")]


def approvals_row(page: str, approval: Approval) -> str:
    row = re.search(rf'<tr data-approval-id="{approval.pk}">.*?</tr>', page, re.S)
    assert row, page
    return row.group(0)


def test_a_lone_vote_on_an_expired_two_person_call_stays_on_the_run_page(pending, rita, as_user, drive) -> None:
    approval = pending(SCRIPT, policy={"rules": [TWO_PEOPLE], "approval_timeout_seconds": 60})
    approval_decide(approval_id=approval.pk, user=rita, decision="approve", note="looks right")
    assert approval_expire(approval_id=approval.pk, owner="sweeper:test", now=approval.expires_at.timestamp() + 1)
    run = drive(Run.objects.get(pk=approval.run_id))
    page = as_user(rita).get(f"/runs/{run.pk}/").content.decode()

    row = approvals_row(page, approval)
    assert "nobody (expired)" in row
    assert '<td class="votes"><span class="who">rita</span> approve</td>' in row
    assert 'Votes cast before it expired (2 needed): <strong class="who">rita</strong> approve (“looks right”)' in page


def test_votes_on_arguments_edited_afterwards_stay_on_the_record(pending, rita, rob, as_user, drive) -> None:
    approval = pending(SCRIPT, policy={"rules": [TWO_PEOPLE]})
    approval_decide(approval_id=approval.pk, user=rita, decision="approve")  # for the agent's arguments
    edited = approval_decide(
        approval_id=approval.pk,
        user=rob,
        decision="approve",
        args={"entry": "pay ACME 90"},
        args_hash=approval.args_hash,
    ).approval
    approval_decide(approval_id=approval.pk, user=rita, decision="approve", args_hash=edited.args_hash)
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done", run.error
    page = as_user(rita).get(f"/runs/{run.pk}/").content.decode()

    row = approvals_row(page, approval)
    assert (
        '<span class="who">rita</span> approve <span class="hint">(on arguments edited afterwards)</span>, '
        '<span class="who">rob</span> approve, <span class="who">rita</span> approve'
    ) in row
    assert (
        "Votes on arguments edited afterwards (they did not count for the call as edited): "
        '<strong class="who">rita</strong> approve'
    ) in page
