"""Deciding from the queue: roles, CSRF, methods, races and what each answer does."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from agents.engine.decisions import DECISIONS
from agents.lib import faults
from agents.models import Approval, Message, Run, ToolCall
from tests.helpers import CsrfClient, call, final, person

pytestmark = pytest.mark.django_db

def recorded(approval: Approval) -> Approval:
    return Approval.objects.get(pk=approval.pk)


@pytest.mark.parametrize("role", ["operator", "launcher", None])
def test_non_reviewers_get_403_from_every_decision_endpoint(pending, as_user, role) -> None:
    approval = pending()
    user = person("mallory", role) if role else person("mallory")
    client = as_user(user)
    for decision in DECISIONS:
        response = client.decide(approval.pk, decision, note="forged")
        assert response.status_code == 403, decision
    after = recorded(approval)
    assert after.status == "pending" and after.decided_by is None and after.note == ""
    assert after.run.transitions.filter(kind="decision").count() == 0


def test_get_on_decision_endpoints_is_405(pending, rita, as_user) -> None:
    approval = pending()
    client = as_user(rita)
    for decision in DECISIONS:
        assert client.get(f"/reviews/{approval.pk}/{decision}/").status_code == 405
    assert recorded(approval).status == "pending"


def test_anonymous_post_is_sent_to_login(pending) -> None:
    approval = pending()
    client = CsrfClient()
    client.get("/login/")  # a browser holds the csrftoken cookie; the login, not CSRF, refuses
    response = client.post(f"/reviews/{approval.pk}/approve/", headers={"X-CSRFToken": client.cookies["csrftoken"].value})
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert recorded(approval).status == "pending"


def test_post_without_csrf_token_is_refused(pending, rita) -> None:
    approval = pending()
    client = CsrfClient()
    client.force_login(rita)
    response = client.post(f"/reviews/{approval.pk}/approve/", {"note": ""})
    assert response.status_code == 403
    assert recorded(approval).status == "pending"


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_approve_without_htmx_redirects_back_to_the_filtered_queue(pending, drive, rita, as_user) -> None:
    approval = pending()
    client = as_user(rita)
    response = client.decide(approval.pk, "approve", tool="ledger_write")
    assert response.status_code == 303 and response.url == "/reviews/?tool=ledger_write"
    after = recorded(approval)
    assert after.status == "approved" and after.decision == "approve" and after.decided_by == rita
    page = client.get(response.url).content.decode()
    assert "Approved: ledger_write for run" in page  # the flash message
    run = drive(after.run)
    assert run.state == "done" and run.ledger.count() == 1


def test_approve_with_htmx_returns_the_decided_card_and_an_event(pending, rita, as_user) -> None:
    approval = pending()
    response = as_user(rita).decide(approval.pk, "approve", htmx=True)
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith("<article") and f'data-approval-id="{approval.pk}"' in body
    assert '<strong class="verdict">Approved</strong> by <strong class="who">rita</strong>' in body
    assert "<button" not in body and 'name="keep"' in body
    assert json.loads(response.headers["HX-Trigger"])["approvalDecided"]["id"] == approval.pk


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_double_post_records_one_decision_and_executes_once(pending, drive, rita, as_user) -> None:
    approval = pending()
    client = as_user(rita)
    first = client.decide(approval.pk, "approve", htmx=True)
    second = client.decide(approval.pk, "approve", htmx=True)
    assert first.status_code == second.status_code == 200
    assert "You had already answered" in second.content.decode()
    run = drive(recorded(approval).run)
    assert run.state == "done"
    assert run.ledger.count() == 1
    assert run.transitions.filter(kind="decision").count() == 1


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_second_reviewer_is_told_who_decided(pending, drive, rita, rob, as_user) -> None:
    approval = pending()
    as_user(rita).decide(approval.pk, "approve", htmx=True)
    late = as_user(rob).decide(approval.pk, "reject", htmx=True, note="no")
    body = late.content.decode()
    assert "Your answer was not recorded: rita decided first (approved)." in body
    assert '<strong class="who">rita</strong>' in body
    after = recorded(approval)
    assert after.status == "approved" and after.decided_by == rita and after.note == ""
    # Without htmx the late reviewer gets the same news as a message on the queue.
    robs_browser = as_user(rob)
    response = robs_browser.decide(approval.pk, "reject")
    assert response.status_code == 303
    page = robs_browser.get(response.url).content.decode()
    assert "rita decided first" in page
    run = drive(after.run)
    assert run.ledger.count() == 1 and run.transitions.filter(kind="decision").count() == 1


def test_reject_note_reaches_the_transcript_and_the_run_continues(pending, drive, rita, as_user) -> None:
    approval = pending()
    response = as_user(rita).decide(approval.pk, "reject", htmx=True, note="never email customers a code")
    assert "never email customers a code" in response.content.decode()
    run = drive(recorded(approval).run)
    assert run.state == "done" and run.answer == "answered" and run.ledger.count() == 0
    result = json.loads(Message.objects.filter(run=run, role="tool").order_by("-index").first().content)
    assert result == {
        "ok": False,
        "error": "not_permitted",
        "detail": "rejected by a human reviewer (rita): never email customers a code",
    }


def test_a_decision_the_approval_does_not_take_is_refused(pending, rita, as_user) -> None:
    approval = pending()
    response = as_user(rita).decide(approval.pk, "happened", note="x")
    assert response.status_code == 400
    assert recorded(approval).status == "pending"


def test_unknown_approval_is_404(rita, as_user) -> None:
    assert as_user(rita).decide(999_999, "approve").status_code == 404


def test_overlong_note_is_refused(pending, rita, as_user) -> None:
    approval = pending()
    assert as_user(rita).decide(approval.pk, "reject", note="x" * 5000).status_code == 400
    assert recorded(approval).status == "pending"


# -- outcome unknown ---------------------------------------------------------------


@pytest.fixture
def unknown(launch, drive, monkeypatch):
    """A run whose unsafe write crashed after running: a human must say what happened."""

    def _unknown() -> Approval:
        run = launch([call("ledger_write_unsafe", entry="once"), final("finished")])
        monkeypatch.setattr(faults, "MODE", "raise")
        monkeypatch.setattr(faults, "CRASH_AT", frozenset({"after_tool_before_result_commit"}))
        with pytest.raises(faults.SimulatedCrash):
            drive(run)
        monkeypatch.setattr(faults, "CRASH_AT", frozenset())
        Run.objects.filter(pk=run.pk).update(lease_expires=None, lease_owner=None)
        run = drive(run)
        assert run.state == "awaiting_approval"
        return Approval.objects.get(run=run, kind="outcome_unknown", status="pending")

    return _unknown


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_it_happened_turns_the_note_into_the_result(unknown, drive, rita, as_user) -> None:
    approval = unknown()
    response = as_user(rita).decide(approval.pk, "happened", htmx=True, note="I saw the row in the ledger")
    assert "Marked as happened" in response.content.decode()
    run = drive(recorded(approval).run)
    assert run.state == "done" and run.ledger.count() == 1
    assert ToolCall.objects.get(run=run).result == {"ok": True, "result": "I saw the row in the ledger"}


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_run_it_again_executes_once_more(unknown, drive, rita, as_user) -> None:
    approval = unknown()
    assert as_user(rita).decide(approval.pk, "retry").status_code == 303
    run = drive(recorded(approval).run)
    assert run.state == "done" and run.ledger.count() == 2


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_fail_the_run_ends_it(unknown, rita, as_user) -> None:
    approval = unknown()
    response = as_user(rita).decide(approval.pk, "fail", htmx=True, note="cannot tell")
    assert "Run failed" in response.content.decode()
    run = recorded(approval).run
    assert run.state == "failed" and "outcome unknown" in run.error


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_outcome_unknown_refuses_approve(unknown, rita, as_user) -> None:
    approval = unknown()
    assert as_user(rita).decide(approval.pk, "approve").status_code == 400
    assert recorded(approval).status == "pending"


def test_superuser_may_decide(pending, as_user) -> None:
    admin = User.objects.create_superuser("root", password="correct horse battery")
    approval = pending()
    assert as_user(admin).decide(approval.pk, "approve").status_code == 303
    assert recorded(approval).decided_by == admin


def test_answer_after_the_run_ended_is_told_it_expired(pending, rita, as_user) -> None:
    from agents.actions.runs import run_cancel

    approval = pending()
    run_cancel(run_id=approval.run_id, user=rita, reason="wrong customer")
    response = as_user(rita).decide(approval.pk, "approve", htmx=True)
    body = response.content.decode()
    assert "Expired" in body and "this call is expired (the run ended)" in body
    run = recorded(approval).run
    assert run.state == "cancelled" and run.ledger.count() == 0
