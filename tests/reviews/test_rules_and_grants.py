"""The rule on the card, "Approve and allow for this run", and grants on the timeline."""

from __future__ import annotations

import pytest

from agents.models import AgentProfile, Grant, Run
from tests.helpers import call, final, tainted_write

pytestmark = pytest.mark.django_db

ASK = {"tool": "ledger_write", "when": {"arg": "entry.amount", "op": "gt", "value": 100}, "then": "ask",
       "reason": "entries over 100 need a human"}
GRANT_BUTTON = "Approve and allow for this run"


def writes(*amounts: int) -> list:
    return [*(call("ledger_write", entry={"amount": a}) for a in amounts), final("ok")]


def test_the_card_names_the_rule_that_asked_and_offers_a_grant(pending, rita, as_user) -> None:
    AgentProfile.objects.filter(name="scripted").update(rules=[{"tool": "echo", "then": "deny", "reason": "x"}, ASK])
    pending(writes(150))
    html = as_user(rita).get("/reviews/").content.decode()
    assert '<span class="rule">rule 2 of the profile</span>: entries over 100 need a human' in html
    assert GRANT_BUTTON in html


def test_no_grant_is_offered_for_a_tainted_write(pending, rita, as_user) -> None:
    pending(tainted_write())
    html = as_user(rita).get("/reviews/").content.decode()
    assert ">Approve</button>" in html and GRANT_BUTTON not in html


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_approve_and_allow_records_a_tool_grant_that_lets_the_next_call_through(pending, drive, rita, as_user) -> None:
    AgentProfile.objects.filter(name="scripted").update(rules=[ASK])
    approval = pending(writes(150, 300))
    response = as_user(rita).decide(approval.pk, "approve", remember="tool")
    assert response.status_code == 303
    grant = Grant.objects.get(run=approval.run)
    assert (grant.number, grant.tool, grant.args, grant.by, grant.revoked_at) == (1, "ledger_write", None, rita, None)
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done" and run.ledger.count() == 2


def test_a_refused_grant_is_told_and_decides_nothing(pending, rita, as_user) -> None:
    approval = pending(tainted_write())
    response = as_user(rita).decide(approval.pk, "approve", remember="tool", htmx=True)
    assert response.status_code == 400
    assert response.content.decode() == "the run has read external content, so every write asks"
    # Without htmx, the same words on the error page, in the site's layout.
    response = as_user(rita).decide(approval.pk, "approve", remember="tool")
    assert response.status_code == 400 and 'class="topnav"' in response.content.decode()
    assert "the run has read external content, so every write asks" in response.content.decode()
    assert approval.run.approvals.get().status == "pending"


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_the_timeline_shows_the_rule_the_grant_and_a_revoke_button(pending, drive, rita, otto, as_user) -> None:
    AgentProfile.objects.filter(name="scripted").update(rules=[ASK], limits={"max_identical_calls": 3})
    approval = pending(writes(150, 150, 150))
    as_user(rita).decide(approval.pk, "approve", remember="call")
    drive(Run.objects.get(pk=approval.run_id), max_transitions=3)
    grant = Grant.objects.get(run=approval.run)
    html = as_user(rita).get(f"/runs/{approval.run_id}/").content.decode()
    assert '<span class="rule">rule 1 of the profile</span>: entries over 100 need a human' in html
    assert "Grant 1: this exact <code>ledger_write</code> call is allowed for the rest of the run." in html
    assert "grant 1 by rita allows this exact call for this run" in html
    assert f'action="/runs/{approval.run_id}/grants/{grant.pk}/revoke/"' in html
    # Operators read the timeline but only reviewers revoke.
    assert "Revoke grant 1" not in as_user(otto).get(f"/runs/{approval.run_id}/").content.decode()
    client = as_user(otto)
    forbidden = client.post(f"/runs/{approval.run_id}/grants/{grant.pk}/revoke/", headers={"X-CSRFToken": client.token()})
    assert forbidden.status_code == 403
    client = as_user(rita)
    response = client.post(f"/runs/{approval.run_id}/grants/{grant.pk}/revoke/", headers={"X-CSRFToken": client.token()})
    assert response.status_code == 302
    grant.refresh_from_db()
    assert grant.revoked_at is not None and grant.revoked_by == rita
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "awaiting_approval" and run.ledger.count() == 2
    html = as_user(rita).get(f"/runs/{approval.run_id}/").content.decode()
    assert "Grant 1 (<code>ledger_write</code>) revoked by <strong class=\"who\">rita</strong>" in html
    assert "Revoke grant 1" not in html
