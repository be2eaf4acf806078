"""Votes, edits, separated duties and expiry through `approval_decide`,
`approval_expire` and the store: rows, transitions and side effects."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from agents import access
from agents.actions.approvals import approval_decide, approval_expire
from agents.actions.base import ActionError
from agents.defaults import DIAGNOSTIC_TOOLS
from agents.engine.fingerprints import fingerprint, idempotency_key
from agents.models import AgentProfile, Approval, ApprovalVote, Grant, LedgerEntry, Run, ToolCall, Transition
from agents.runs import store
from tests.helpers import CsrfClient, at_once, call, final, person, requires_postgres

pytestmark = pytest.mark.django_db

TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign the ledger"}
SCRIPT = [call("ledger_write", entry="pay ACME 100"), final("paid")]


@pytest.fixture
def people(defaults: None) -> dict[str, User]:
    return {name: person(name, "reviewer") for name in ("rita", "rob", "ruth")}


@pytest.fixture
def waiting(launch: Callable[..., Run], drive: Callable[..., Run]) -> Callable[..., Approval]:
    def _waiting(script: list[Any] | None = None, **kwargs: Any) -> Approval:
        kwargs.setdefault("policy", {"rules": [TWO_PEOPLE]})
        run = drive(launch(script or SCRIPT, **kwargs))
        assert run.state == "awaiting_approval", (run.state, run.error)
        return Approval.objects.pending().get(run=run)

    return _waiting


def decide(approval: Approval, user: User | None, decision: str = "approve", **kw: Any) -> Any:
    return approval_decide(approval_id=approval.pk, user=user, decision=decision, **kw)


def exits_from_waiting(run_id: int) -> int:
    return Transition.objects.filter(run_id=run_id, from_state="awaiting_approval").count()


# -- quorum ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_two_person_rule_runs_the_call_on_the_second_distinct_vote(waiting, people, drive) -> None:
    approval = waiting()
    assert approval.required == 2 and approval.rule["reason"] == "two people sign the ledger"

    first = decide(approval, people["rita"], note="looks right")
    assert first.outcome == "voted" and first.approval.status == "pending"
    assert [v.to_dict()["by"] for v in first.approval.current_votes()] == ["rita"]
    assert exits_from_waiting(approval.run_id) == 0

    second = decide(approval, people["rob"])
    assert second.outcome == "decided" and second.approval.status == "approved"
    assert second.approval.decided_by == people["rob"]
    decision = Transition.objects.get(run_id=approval.run_id, kind="decision")
    assert [(v["by"], v["decision"], v["note"]) for v in decision.payload["votes"]] == [
        ("rita", "approve", "looks right"), ("rob", "approve", "")]
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done" and LedgerEntry.objects.filter(run=run).count() == 1


def test_the_same_reviewer_voting_twice_changes_nothing(waiting, people) -> None:
    approval = waiting()
    decide(approval, people["rita"])
    again = decide(approval, people["rita"])
    other_answer = decide(approval, people["rita"], "reject")
    assert again.outcome == other_answer.outcome == "already_voted"
    assert other_answer.approval.status == "pending"
    assert ApprovalVote.objects.filter(approval=approval).count() == 1
    assert exits_from_waiting(approval.run_id) == 0


def test_a_reject_after_one_approve_rejects(waiting, people, drive) -> None:
    approval = waiting()
    decide(approval, people["rita"])
    result = decide(approval, people["rob"], "reject", note="wrong amount")
    assert result.outcome == "decided" and result.approval.status == "rejected"
    assert decide(approval, people["ruth"]).outcome == "late"
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done" and not LedgerEntry.objects.filter(run=run).exists()
    tool_reply = run.messages.get(role="tool")
    assert "rejected by a human reviewer (rob): wrong amount" in tool_reply.content


# -- edit, then approve ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_an_edit_resets_the_votes_and_the_editors_vote_counts_first(waiting, people, drive) -> None:
    approval = waiting()
    decide(approval, people["rita"])  # a vote for the model's arguments
    edited = decide(approval, people["rob"], args={"entry": "pay ACME 90"}, note="the invoice says 90")
    assert edited.outcome == "voted"
    a = edited.approval
    assert a.edited_args == {"entry": "pay ACME 90"} and a.edited_by == people["rob"] and a.round == 1
    assert [v.by_name for v in a.current_votes()] == ["rob"]  # rita's vote was for other arguments
    state = store.load(Run.objects.get(pk=approval.run_id))
    assert a.idempotency_key == idempotency_key(str(approval.run_id), state.steps, "ledger_write", a.edited_args)

    # Rita votes again, naming the edited call she now sees (docs/reviewing.md#bound-votes).
    assert decide(approval, people["rita"], args_hash=a.args_hash).outcome == "decided"
    # Every vote keeps the arguments it was about: the model's (null) or the edit.
    assert [(v.round, v.by_name, v.args) for v in ApprovalVote.objects.order_by("pk")] == [
        (0, "rita", None), (1, "rob", {"entry": "pay ACME 90"}), (1, "rita", {"entry": "pay ACME 90"})]
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done", run.error
    [entry] = LedgerEntry.objects.filter(run=run)
    assert entry.entry == "pay ACME 90" and entry.idempotency_key == a.idempotency_key
    assert ToolCall.objects.get(run=run).args == {"entry": "pay ACME 90"}
    decision = Transition.objects.get(run=run, kind="decision")
    assert decision.payload["edit"]["from"] == {"entry": "pay ACME 100"}
    assert decision.payload["edit"]["to"] == {"entry": "pay ACME 90"}
    assert decision.payload["edit"]["by"] == "rob" and decision.payload["edit"]["note"] == "the invoice says 90"
    reply = run.messages.get(role="tool").content
    assert "a human reviewer (rob) changed the arguments" in reply
    assert '{"entry": "pay ACME 100"}' in reply and '{"entry": "pay ACME 90"}' in reply


def test_an_edit_that_is_invalid_or_denied_changes_nothing(waiting, people) -> None:
    deny_big = {"tool": "ledger_write", "when": {"arg": "entry", "op": "matches", "value": "1000"}, "then": "deny",
                "reason": "no four-figure entries"}
    approval = waiting(policy={"rules": [deny_big, TWO_PEOPLE]})
    with pytest.raises(ActionError) as invalid:
        decide(approval, people["rita"], args={"entry": "x", "surprise": 1})
    assert invalid.value.code == "invalid_arguments" and invalid.value.status == 400
    with pytest.raises(ActionError) as denied:
        decide(approval, people["rita"], args={"entry": "pay ACME 1000"})
    assert denied.value.code == "denied_by_policy" and denied.value.status == 409
    assert denied.value.detail["rule"]["reason"] == "no four-figure entries"
    approval.refresh_from_db()
    assert approval.edited_args is None and approval.round == 0 and approval.status == "pending"
    assert not ApprovalVote.objects.exists()


def test_an_edit_that_needs_more_votes_keeps_waiting(waiting, people) -> None:
    three = {"tool": "ledger_write", "when": {"arg": "entry", "op": "matches", "value": "urgent"}, "then": "ask",
             "approvals": 3, "reason": "urgent entries need three people"}
    one = {"tool": "ledger_write", "then": "ask", "reason": "a human signs the ledger"}
    approval = waiting(policy={"rules": [three, one]})
    assert approval.required == 1
    result = decide(approval, people["rita"], args={"entry": "urgent: pay ACME"})
    assert result.outcome == "voted" and result.approval.required == 3 and result.approval.status == "pending"
    seen = result.approval.args_hash  # the edited call, as the next voters see it
    assert decide(approval, people["rob"], args_hash=seen).outcome == "voted"
    assert decide(approval, people["ruth"], args_hash=seen).outcome == "decided"


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_grant_with_an_edit_covers_the_edited_call(waiting, people, drive) -> None:
    approval = waiting(policy={"rules": [{**TWO_PEOPLE, "approvals": 1}]})
    result = decide(approval, people["rita"], args={"entry": "pay ACME 90"}, remember="call")
    assert result.outcome == "decided"
    run = Run.objects.get(pk=approval.run_id)
    [grant] = store.load(run).grants
    assert grant["fp"] == fingerprint("ledger_write", {"entry": "pay ACME 90"})
    assert Grant.objects.get(run=run).args == {"entry": "pay ACME 90"}
    run = drive(run)
    assert [e.entry for e in LedgerEntry.objects.filter(run=run)] == ["pay ACME 90"]


# -- separation of duties -------------------------------------------------------------


def test_the_launcher_cannot_vote_when_duties_are_separated(waiting, people, defaults) -> None:
    boss = person("boss", "reviewer", "launcher", superuser=True)
    approval = waiting(user=boss, policy={"rules": [TWO_PEOPLE], "separate_duties": True})
    assert access.duties_separated(boss, approval.run) and not access.duties_separated(people["rita"], approval.run)
    with pytest.raises(ActionError) as refused:
        decide(approval, boss)
    assert refused.value.code == "separation_of_duties" and refused.value.status == 403
    assert not ApprovalVote.objects.exists()


def test_the_scripted_profile_lets_its_launcher_vote(waiting, people) -> None:
    approval = waiting(user=people["rita"], policy={"rules": [{**TWO_PEOPLE, "approvals": 1}]})
    assert decide(approval, people["rita"]).outcome == "decided"


# -- expiry ------------------------------------------------------------------------------


def test_expiry_with_reject_tells_the_model_and_the_run_continues(waiting, people, drive) -> None:
    approval = waiting(policy={"rules": [TWO_PEOPLE], "approval_timeout_seconds": 30})
    assert 29 <= (approval.expires_at - approval.created_at).total_seconds() <= 31
    assert not approval_expire(approval_id=approval.pk, owner="sweeper:test")  # not due yet
    assert approval_expire(approval_id=approval.pk, owner="sweeper:test", now=time.time() + 31)
    approval.refresh_from_db()
    assert approval.status == "expired" and approval.decided_by is None and approval.decision == ""
    assert decide(approval, people["rita"]).outcome == "late"
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done" and not LedgerEntry.objects.filter(run=run).exists()
    assert '"detail": "no reviewer answered within 30 s"' in run.messages.get(role="tool").content
    assert run.transitions.filter(kind="expiry", to_state="planning").count() == 1
    assert Approval.objects.filter(status="rejected").count() == 0


def test_expiry_with_fail_fails_the_run(defaults, launch, drive) -> None:
    AgentProfile.objects.create(
        name="strict", provider="scripted", model_name="script", tools=DIAGNOSTIC_TOOLS, separate_duties=False,
        on_expiry="fail", approval_timeout_seconds=30,
    )
    run = drive(launch(SCRIPT, agent="strict", policy={"rules": [TWO_PEOPLE]}))
    approval = Approval.objects.pending().get(run=run)
    assert approval_expire(approval_id=approval.pk, owner="sweeper:test", now=time.time() + 31)
    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.state == "failed" and run.error == "no reviewer answered within 30 s"
    assert approval.status == "expired"
    assert run.transitions.get(kind="expiry").payload["on_expiry"] == "fail"


# -- races -------------------------------------------------------------------------------


@contextlib.contextmanager
def twin_vote_after_the_check(approval: Approval, user: User) -> Iterator[None]:
    """The reviewer's other request (a double click) inserts the same vote just after
    this one looked for it and found none: the race a database without row locks
    (SQLite) leaves open to the unique key, made to happen every time."""
    inserted: list[bool] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not inserted and sql.lstrip().upper().startswith("SELECT") and '"agents_approvalvote"' in sql:
            inserted.append(True)
            ApprovalVote.objects.create(
                approval=approval, round=approval.round, by=user, by_name=user.get_username(), decision="approve",
                at=timezone.now(),
            )
        return result

    with connection.execute_wrapper(wrapper):
        yield
    assert inserted, "the vote was never looked for"


def test_a_vote_that_loses_the_unique_key_race_reads_as_the_double_click_it_is(waiting, people) -> None:
    approval = waiting(policy={"rules": [{**TWO_PEOPLE, "approvals": 1}]})
    with twin_vote_after_the_check(approval, people["rita"]):
        result = decide(approval, people["rita"], args_hash=approval.args_hash)
    assert result.outcome == "already_voted"
    assert ApprovalVote.objects.filter(approval=approval).count() == 1


def test_the_page_answers_a_lost_vote_race_with_200(waiting, people) -> None:
    approval = waiting(policy={"rules": [{**TWO_PEOPLE, "approvals": 1}]})
    page = CsrfClient()
    page.force_login(people["rita"])
    page.token()
    with twin_vote_after_the_check(approval, people["rita"]):
        response = page.decide(approval.pk, "approve", htmx=True, args_hash=approval.args_hash)
    assert response.status_code == 200
    assert ApprovalVote.objects.filter(approval=approval).count() == 1


@pytest.mark.django_db(transaction=True)  # threads racing see only committed rows
@requires_postgres()
def test_fifty_concurrent_votes_by_two_people_record_two_votes_and_one_execution(waiting, people, drive) -> None:
    approval = waiting()
    voters = [people["rita"], people["rob"]] * 25
    results = at_once(lambda user: decide(approval, user), voters)
    outcomes = sorted(r.outcome for r in results)
    assert outcomes.count("decided") == 1 and outcomes.count("voted") == 1, outcomes
    assert set(outcomes) <= {"decided", "voted", "already_voted", "late"}
    assert ApprovalVote.objects.filter(approval=approval).count() == 2
    assert exits_from_waiting(approval.run_id) == 1
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done" and LedgerEntry.objects.filter(run=run).count() == 1


@pytest.mark.django_db(transaction=True)  # threads racing see only committed rows
@requires_postgres()
def test_three_reviewers_racing_for_a_quorum_of_two_record_two_votes(waiting, people, drive) -> None:
    approval = waiting()
    voters = [people["rita"], people["rob"], people["ruth"]] * 10
    results = at_once(lambda user: decide(approval, user), voters)
    assert sorted(r.outcome for r in results).count("decided") == 1
    assert ApprovalVote.objects.filter(approval=approval).count() == 2
    run = drive(Run.objects.get(pk=approval.run_id))
    assert run.state == "done" and LedgerEntry.objects.filter(run=run).count() == 1
