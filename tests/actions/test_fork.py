"""Forks (agents/actions/forks.py, docs/retry.md): a new run from a parent's state at a resting
point; calls the parent already made are reused or asked about, never repeated blindly."""

from __future__ import annotations

import pytest

from agents.actions.approvals import approval_decide
from agents.actions.base import ActionError
from agents.actions.forks import fork_point, run_fork, run_retry
from agents.actions.runs import run_cancel
from agents.models import AgentProfile, Approval, LedgerEntry, Message, Run, ToolCall, Transition
from agents.runs.verify import verify_run
from tests.helpers import PLANTED, call, client_for, final, lose_an_unsafe_writes_outcome

pytestmark = pytest.mark.django_db

USAGE = {"input_tokens": 100, "output_tokens": 10}


def kinds(run: Run) -> list[str]:
    return list(run.transitions.order_by("seq").values_list("kind", flat=True))


def seq_of(run: Run, kind: str, n: int = 1) -> int:
    """The seq of the run's n-th transition of `kind`."""
    return list(run.transitions.filter(kind=kind).order_by("seq").values_list("seq", flat=True))[n - 1]


def fork(run: Run, user=None, **kwargs) -> Run:
    kwargs.setdefault("from_seq", seq_of(run, "pickup"))
    new, _point = run_fork(run_id=run.pk, user=user, **kwargs)
    return new


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_fork_before_a_safe_write_reuses_its_recorded_result(launch, drive) -> None:
    parent = drive(launch([call("ledger_write", entry="paid"), final("done")]))
    assert parent.state == "done" and LedgerEntry.objects.count() == 1
    child = drive(fork(parent))
    assert child.state == "done", child.error
    assert LedgerEntry.objects.count() == 1  # the write did not run again
    tool = child.transitions.get(kind="tool")
    assert tool.payload["reused"] == {"run": parent.pk, "seq": seq_of(parent, "tool")}
    assert ToolCall.objects.get(run=child).status == "succeeded"
    assert verify_run(child) == [] and verify_run(parent) == []


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_reuse_none_runs_a_safe_call_again(launch, drive) -> None:
    parent = drive(launch([call("ledger_write", entry="paid"), final("done")]))
    child = drive(fork(parent, reuse="none"))
    assert child.state == "done"
    assert LedgerEntry.objects.count() == 2  # asked for: a fresh key, a fresh row
    propose = child.transitions.filter(kind="model").first()
    assert propose.payload["prior"]["run"] == parent.pk  # still flagged on the record
    assert "reused" not in child.transitions.get(kind="tool").payload


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_an_unsafe_call_that_already_ran_waits_for_a_human_and_reuse_runs_nothing(launch, drive, rita) -> None:
    parent = drive(launch([call("ledger_write_unsafe", entry="wire $100"), final("done")]))
    assert LedgerEntry.objects.count() == 1
    child = drive(fork(parent))
    assert child.state == "awaiting_approval"
    approval = Approval.objects.get(run=child)
    step = seq_of(parent, "tool")
    assert approval.kind == "already_ran"
    assert approval.reason == f"this exact call already ran in run #{parent.pk} at step {step}"
    assert approval.prior["run"] == parent.pk and approval.prior["status"] == "succeeded"
    assert approval.choices == ("reuse", "approve", "reject")
    result = approval_decide(approval_id=approval.pk, user=rita, decision="reuse")
    assert result.won and result.approval.status == "approved" and result.approval.decision == "reuse"
    child = drive(child)
    assert child.state == "done", child.error
    assert LedgerEntry.objects.count() == 1  # nothing ran
    tool = child.transitions.get(kind="tool")
    assert tool.payload["reused"]["run"] == parent.pk
    assert Message.objects.filter(run=child, role="tool").last().content == "recorded"
    assert verify_run(child) == []


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_run_it_again_on_an_already_ran_call_runs_it_once_more(launch, drive, rita) -> None:
    parent = drive(launch([call("ledger_write_unsafe", entry="wire $100"), final("done")]))
    child = drive(fork(parent))
    approval = Approval.objects.get(run=child)
    approval_decide(approval_id=approval.pk, user=rita, decision="approve")
    assert drive(child).state == "done"
    assert LedgerEntry.objects.count() == 2


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_reject_on_an_already_ran_call_tells_the_model(launch, drive, rita) -> None:
    parent = drive(launch([call("ledger_write_unsafe", entry="wire $100"), final("done")]))
    child = drive(fork(parent))
    approval = Approval.objects.get(run=child)
    approval_decide(approval_id=approval.pk, user=rita, decision="reject", note="already paid")
    assert drive(child).state == "done"
    assert LedgerEntry.objects.count() == 1
    assert "not_permitted" in Message.objects.filter(run=child, role="tool").last().content


def test_reuse_is_refused_on_a_policy_approval(pending, rita) -> None:
    approval = pending()
    with pytest.raises(ActionError) as exc:
        approval_decide(approval_id=approval.pk, user=rita, decision="reuse")
    assert exc.value.code == "invalid_decision" and exc.value.status == 400
    assert Approval.objects.get(pk=approval.pk).status == "pending"


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_call_whose_outcome_is_unknown_in_the_parent_is_shown_so_and_cannot_be_reused(
    launch, drive, monkeypatch, rita
) -> None:
    parent = lose_an_unsafe_writes_outcome(launch, drive, monkeypatch, "wire $100")
    unknown = Approval.objects.get(run=parent, kind="outcome_unknown")
    approval_decide(approval_id=unknown.pk, user=rita, decision="fail", note="cannot tell")
    parent.refresh_from_db()
    assert parent.state == "failed" and ToolCall.objects.get(run=parent).status == "started"

    child, point = run_retry(run_id=parent.pk, user=None)
    child = drive(child)
    approval = Approval.objects.get(run=child)
    assert approval.kind == "already_ran" and approval.prior["status"] == "started"
    assert approval.reason.endswith("outcome unknown: it may or may not have taken effect")
    assert approval.choices == ("approve", "reject")
    with pytest.raises(ActionError) as exc:
        approval_decide(approval_id=approval.pk, user=rita, decision="reuse")
    assert exc.value.code == "invalid_decision"
    assert LedgerEntry.objects.count() == 1


def test_a_fork_starts_from_the_parents_transcript_and_counters_without_rebilling(launch, drive) -> None:
    parent = drive(launch([call("echo", usage=USAGE, text="a"), call("echo", usage=USAGE, text="b"), final("done", USAGE)]))
    at = seq_of(parent, "tool", 1)
    child = fork(parent, from_seq=at)
    first = child.transitions.get(seq=1)
    assert first.kind == "fork" and first.cost_micros == 0 and first.tokens == 0
    assert first.payload["fork"]["run"] == parent.pk and first.payload["fork"]["seq"] == at
    assert child.forked_from_id == parent.pk and child.fork_seq == at
    assert child.to_dict()["forked_from"] == {"run": parent.pk, "seq": at}
    assert child.steps == 2 and child.tokens == 110  # one model call and one tool call carried
    copied = list(Message.objects.filter(run=child).order_by("index").values_list("role", "content"))
    original = list(Message.objects.filter(run=parent, seq__lte=at).order_by("index").values_list("role", "content"))
    assert copied == original
    child = drive(child)
    assert child.state == "done" and child.tokens == 330
    assert list(parent.forks.all()) == [child]
    assert verify_run(child) == []


def test_a_seq_that_is_not_a_resting_point_forks_from_the_nearest_earlier_one(launch, drive) -> None:
    parent = drive(launch([call("echo", text="a"), final("done")]))
    inside = seq_of(parent, "model")  # planning -> acting: a call under way
    point = fork_point(parent, inside)
    assert point.used == inside - 1 and point.requested == inside
    assert "not a resting point" in point.why and f"after seq {inside - 1}" in point.why


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"from_seq": 0}, "invalid_fork_point"),
        ({"from_seq": 999}, "invalid_fork_point"),
        ({"from_seq": "2"}, "invalid_fork_point"),
        ({"reuse": "maybe"}, "invalid_reuse"),
        ({"limits": {"max_steps": 21}}, "invalid_limits"),
        ({"task": "   "}, "invalid_task"),
    ],
)
def test_bad_fork_requests_are_refused_and_create_nothing(launch, drive, kwargs, code) -> None:
    parent = drive(launch([final("done")]))
    before = Run.objects.count()
    with pytest.raises(ActionError) as exc:
        fork(parent, **kwargs)
    assert exc.value.code == code and exc.value.status == 400
    assert Run.objects.count() == before


def test_a_purged_parent_cannot_be_forked(launch, drive) -> None:
    from agents.runs.retention import purge

    parent = drive(launch([final("done")]))
    purge(actor="test", only=[parent.pk], older_than_days=0)
    assert Run.objects.get(pk=parent.pk).purged_at is not None
    with pytest.raises(ActionError) as exc:
        fork(Run.objects.get(pk=parent.pk), from_seq=2)
    assert exc.value.code == "purged"


def test_a_fork_of_a_tainted_run_is_tainted(launch, drive) -> None:
    parent = drive(launch([call("fetch_fixture", text=PLANTED), final("done")]))
    assert parent.tainted
    child = drive(fork(parent, from_seq=seq_of(parent, "tool")))
    assert child.tainted and child.engine["taint_source"] == parent.engine["taint_source"]


def test_approvals_and_grants_are_not_copied(launch, drive, rita) -> None:
    asks = {"rules": [{"tool": "echo", "then": "ask", "reason": "echo is watched"}]}
    parent = drive(launch([call("echo", text="a"), call("echo", text="b"), final("done")], policy=asks))
    approval = Approval.objects.get(run=parent)
    approval_decide(approval_id=approval.pk, user=rita, decision="approve", remember="tool")
    parent = drive(parent)
    assert parent.state == "done" and parent.engine["grants"]
    child = drive(fork(parent, from_seq=seq_of(parent, "tool"), reuse="none"))
    # The second echo asks again: the launch rule came along, the grant and the approval did not.
    assert child.state == "awaiting_approval"
    assert Approval.objects.get(run=child).kind == "policy"
    assert not child.engine.get("grants")


def test_a_run_failed_on_its_step_budget_finishes_when_the_retry_raises_it(launch, drive) -> None:
    script = [call("echo", text="a"), call("echo", text="b"), final("done")]
    parent = drive(launch(script, limits={"max_steps": 3}))
    assert parent.state == "failed" and parent.error.startswith("step budget exhausted")
    same, _ = run_retry(run_id=parent.pk, user=None)
    same = drive(same)
    assert same.state == "failed" and same.error.startswith("step budget exhausted")  # counters carried
    raised, _ = run_retry(run_id=parent.pk, user=None, limits={"max_steps": 10})
    raised = drive(raised)
    assert raised.state == "done", raised.error
    assert raised.engine["limits"]["max_steps"] == 10
    with pytest.raises(ActionError) as exc:
        run_retry(run_id=parent.pk, user=None)
    assert exc.value.code == "already_retried"


def test_verify_catches_a_tampered_fork(launch, drive) -> None:
    parent = drive(launch([call("echo", usage=USAGE, text="a"), final("done", USAGE)]))
    child = drive(fork(parent, from_seq=seq_of(parent, "tool")))
    assert verify_run(child) == []
    # The copied transcript no longer matches the parent's.
    Message.objects.filter(run=child, role="tool").update(content="forged")
    assert any("copied transcript" in p for p in verify_run(child))
    Message.objects.filter(run=child, role="tool").update(content="a")
    assert verify_run(child) == []
    # The inherited counters claim less than the parent had spent.
    first = Transition.objects.get(run=child, seq=1)
    payload = {**first.payload, "patch": {**first.payload["patch"], "tokens": 0}, "inherited_tokens": 0}
    Transition.objects.filter(pk=first.pk).update(payload=payload)
    assert any("fork start: tokens 0, the parent had 110" in p for p in verify_run(child))
    # Or the first transition's own two accounts disagree.
    Transition.objects.filter(pk=first.pk).update(payload={**first.payload, "inherited_tokens": 0})
    assert any(p.startswith("seq 1 inherits (") and "(cost, tokens)" in p for p in verify_run(child))


def test_a_purged_fork_still_verifies_from_its_inherited_counters(launch, drive) -> None:
    from agents.runs.retention import purge

    parent = drive(launch([call("echo", usage=USAGE, text="a"), final("done", USAGE)]))
    child = drive(fork(parent, from_seq=seq_of(parent, "tool")))
    assert child.tokens == 220
    purge(actor="test", only=[parent.pk, child.pk], older_than_days=0)
    child = Run.objects.get(pk=child.pk)
    assert child.purged_at is not None and verify_run(child) == []
    Run.objects.filter(pk=child.pk).update(tokens=child.tokens + 1)
    assert verify_run(Run.objects.get(pk=child.pk)) == ["transition tokens sum to 220, cached 221"]


# -- a live parent (issue 46, item 3) ---------------------------------------------------

PAY = "PAY 100 EUR to supplier 77"


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_fork_of_a_run_about_to_make_an_unsafe_write_is_refused_and_the_write_happens_once(launch, drive) -> None:
    """The probe: a fork of a parent in `acting`, before its unsafe write, ran the same
    write without asking (two ledger rows). A live parent is not forked: 409."""
    parent = drive(launch([call("ledger_write_unsafe", entry=PAY), final("paid")]), max_transitions=2)
    assert parent.state == "acting"
    before = Run.objects.count()
    with pytest.raises(ActionError) as refused:
        run_fork(run_id=parent.pk, user=None, from_seq=parent.version)
    assert (refused.value.code, refused.value.status) == ("parent_live", 409)
    assert "cancel it, or wait for it to end" in refused.value.detail
    assert Run.objects.count() == before
    acting_seq = parent.version
    assert drive(parent).state == "done"
    assert LedgerEntry.objects.filter(entry=PAY).count() == 1
    # Once it has ended, the same fork waits for a human before writing again.
    child = drive(fork(parent, from_seq=acting_seq))
    assert child.state == "awaiting_approval"
    assert Approval.objects.get(run=child).kind == "already_ran"
    assert LedgerEntry.objects.filter(entry=PAY).count() == 1


@pytest.mark.parametrize("state", ["queued", "planning", "awaiting_approval"])
def test_no_live_run_is_forked(launch, drive, state) -> None:
    script = [call("fetch_fixture", text=PLANTED), call("ledger_write", entry=PAY), final("paid")]
    parent = launch(script)
    if state != "queued":
        parent = drive(parent, max_transitions=1) if state == "planning" else drive(parent)
    assert parent.state == state
    with pytest.raises(ActionError) as refused:
        run_fork(run_id=parent.pk, user=None, from_seq=parent.version)
    assert refused.value.code == "parent_live"


def test_a_call_a_cancelled_parent_had_not_begun_still_counts_as_maybe_done(launch, drive, rita) -> None:
    """Cancelled while acting, before its worker began the unsafe write: that worker may
    still begin it (it read the call before the cancel). The fork asks a human."""
    parent = drive(launch([call("ledger_write_unsafe", entry=PAY), final("paid")]), max_transitions=2)
    assert parent.state == "acting"
    run_cancel(run_id=parent.pk, user=None)
    assert ToolCall.objects.get(run=parent).status == "intended"
    child = drive(fork(parent, from_seq=seq_of(parent, "pickup")))
    assert child.state == "awaiting_approval"
    approval = Approval.objects.get(run=child)
    assert approval.kind == "already_ran" and approval.prior["status"] == "started"
    assert "reuse" not in approval.choices
    assert LedgerEntry.objects.count() == 0


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_an_already_ran_card_names_no_allow_rule_as_the_reason_it_asked(launch, drive, rita) -> None:
    AgentProfile.objects.filter(name="scripted").update(
        rules=[{"tool": "ledger_write_unsafe", "then": "allow", "reason": "small writes go through"}]
    )
    parent = drive(launch([call("ledger_write_unsafe", entry="wire $5"), final("done")]))
    assert parent.state == "done" and LedgerEntry.objects.count() == 1
    child = drive(fork(parent))
    approval = Approval.objects.get(run=child)
    assert approval.kind == "already_ran" and approval.rule is None and approval.rule_label == ""
    html = client_for(rita).get("/reviews/").content.decode()
    why = html[html.index("Why asked") : html.index("</dd>", html.index("Why asked"))]
    assert "this exact call already ran" in why
    assert "rule" not in why and "small writes go through" not in why


def test_a_forks_chart_starts_from_what_it_inherited(launch, drive, otto) -> None:
    """#47, item 6: the chart counted only the fork's own steps ("0 tok" against an
    inherited 476 in the header)."""
    parent = drive(launch([call("echo", usage=USAGE, text="a"), call("echo", usage=USAGE, text="b"), final("done")]))
    child = fork(parent, from_seq=seq_of(parent, "tool", 1))
    assert child.tokens == 110
    child = drive(child)
    assert child.state == "done" and child.tokens == 220  # 110 inherited, 110 its own
    html = client_for(otto).get(f"/runs/{child.pk}/").content.decode()
    chart = html[html.index('id="run-chart"') : html.index("</section>", html.index('id="run-chart"'))]
    assert f"{child.tokens:,} tok" in chart and "and 0 tokens" not in chart
    assert f"and {child.tokens} tokens over" in chart
