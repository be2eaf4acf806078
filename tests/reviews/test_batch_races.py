"""A batch of 200 is as safe as 200 clicks: batches raced against each other and against
single decisions, with a two-person rule on some calls and the launcher among the
reviewers (separation of duties), on PostgreSQL, in threads with their own connections."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from django.contrib.auth.models import User

from agents.actions.approvals import BatchResult, approval_batch_decide, approval_decide
from agents.actions.base import ActionError
from agents.actions.runs import run_launch
from agents.models import Approval, ApprovalVote, LedgerEntry, Run, ToolCall, Transition
from agents.runs import driver
from tests.helpers import at_once, person, requires_postgres

pytestmark = [pytest.mark.django_db(transaction=True), requires_postgres()]

ONE = {"tool": "ledger_write_unsafe", "then": "ask", "reason": "a human signs the ledger"}
TWO = {"tool": "ledger_write_unsafe", "then": "ask", "approvals": 2, "reason": "two people sign the ledger"}
CALLS = 200


@pytest.fixture
def team(defaults: None) -> dict[str, User]:
    """Three reviewers, and lena, who launches every run and is a reviewer too."""
    people = {name: person(name, "reviewer") for name in ("rita", "rob", "ruth")}
    people["lena"] = person("lena", "launcher", "reviewer")
    return people


def waiting_calls(lena: User, count: int) -> list[Approval]:
    """`count` runs of lena's, each waiting on one unsafe ledger write (every third
    needs two approvals), all with separated duties: lena may not vote on any."""
    approvals = []
    for n in range(count):
        run = run_launch(
            agent="scripted", task=f"refund order {n}", user=lena,
            script=[{"call": {"tool": "ledger_write_unsafe", "args": {"entry": f"refund {n}"}}}, {"final": "ok"}],
            policy={"rules": [TWO if n % 3 == 0 else ONE], "separate_duties": True},
        )
        driver.drive(run.pk)
        approvals.append(Approval.objects.pending().get(run=run))
    return approvals


def test_batches_and_single_clicks_raced_execute_each_call_at_most_once_and_obey_every_rule(team) -> None:
    approvals = waiting_calls(team["lena"], CALLS)
    ids = [a.pk for a in approvals]
    hashes = {a.pk: a.args_hash for a in approvals}
    singles = ids[::7]  # ruth rejects these one click at a time, racing the batches

    def act(who: str) -> list[BatchResult]:
        if who == "ruth":
            out = []
            for approval_id in singles:
                try:
                    result = approval_decide(approval_id=approval_id, user=team["ruth"], decision="reject", note="no")
                except ActionError as exc:  # pragma: no cover - would fail the test below
                    out.append(BatchResult(approval_id, "refused", exc.code))
                    continue
                outcome = {"decided": "decided", "voted": "needs_more_votes", "late": "already_decided"}
                out.append(BatchResult(approval_id, outcome[result.outcome], ""))  # type: ignore[arg-type]
            return out
        order = ids if who != "rob" else ids[::-1]  # rob goes the other way round: they meet in the middle
        return approval_batch_decide(
            approval_ids=order, user=team[who], decision="approve", note=f"batch by {who}", args_hashes=hashes
        )

    results = dict(zip(["rita", "rob", "lena", "ruth"], at_once(act, ["rita", "rob", "lena", "ruth"]), strict=True))

    # Every batch answers every id it named, in its order.
    assert [r.id for r in results["rita"]] == ids and [r.id for r in results["rob"]] == ids[::-1]
    # The launcher is refused on every call, and none of her votes exists.
    assert {r.outcome for r in results["lena"]} == {"refused"}
    assert all(r.detail.startswith("separation_of_duties") for r in results["lena"])
    assert not ApprovalVote.objects.filter(by_name="lena").exists()

    # No reviewer voted twice in a round (the constraint holds, and nothing hid it).
    per_voter = Counter(ApprovalVote.objects.values_list("approval_id", "round", "by_name"))
    assert max(per_voter.values()) == 1

    votes: dict[int, dict[str, str]] = defaultdict(dict)
    for approval_id, by, decision in ApprovalVote.objects.values_list("approval_id", "by_name", "decision"):
        votes[approval_id][by] = decision
    decided_outcomes = Counter(r.id for rs in results.values() for r in rs if r.outcome == "decided")
    for a in Approval.objects.filter(pk__in=ids).select_related("decided_by"):
        cast = votes[a.pk]
        # Each approval is decided at most once, by exactly the answer that said so.
        assert decided_outcomes[a.pk] == (0 if a.status == "pending" else 1), (a.pk, a.status)
        assert a.status in ("approved", "rejected"), (a.pk, a.status, cast)  # three reviewers answered each
        assert Transition.objects.filter(run_id=a.run_id, kind="decision").count() == 1
        if a.status == "approved":
            # The votes it needed, from distinct reviewers, none of them the launcher.
            assert sum(d == "approve" for d in cast.values()) >= a.required, (a.pk, cast)
        else:
            assert "reject" in cast.values() and a.decided_by.username == "ruth"
        assert a.decided_by.username in cast
        # Each reviewer's answer says what their vote became.
        for who in ("rita", "rob", "ruth"):
            mine = [r for r in results[who] if r.id == a.pk]
            if not mine:
                continue
            [r] = mine
            if r.outcome == "decided":
                assert a.decided_by.username == who
            elif r.outcome == "needs_more_votes":
                assert who in cast and a.decided_by.username != who
            else:
                assert r.outcome == "already_decided", (who, r)
                assert who not in cast

    # Every run goes on; each approved call ran exactly once, each rejected one never.
    for a in Approval.objects.filter(pk__in=ids):
        run = driver.drive(a.run_id)
        assert run.state == "done", (run.pk, run.error)
        executed = LedgerEntry.objects.filter(run=run).count()
        assert executed == (1 if a.status == "approved" else 0), (a.pk, a.status, executed)
        assert ToolCall.objects.filter(run=run, tool="ledger_write_unsafe").count() == executed
    assert Run.objects.filter(pk__in=[a.run_id for a in approvals], state="done").count() == CALLS


def test_two_batches_on_a_two_person_rule_decide_it_with_both_votes(team) -> None:
    approvals = waiting_calls(team["lena"], 30)
    ids = [a.pk for a in approvals]

    def batch(who: str) -> list[BatchResult]:
        return approval_batch_decide(approval_ids=ids, user=team[who], decision="approve")

    rita, rob = at_once(batch, ["rita", "rob"])
    for a, mine, theirs in zip(Approval.objects.filter(pk__in=ids).order_by("pk"), rita, rob, strict=True):
        assert a.status == "approved"
        pair = sorted([mine.outcome, theirs.outcome])
        if a.required == 2:
            # Both votes count: whoever came second decided, the other was told to wait.
            assert pair == ["decided", "needs_more_votes"], (a.pk, pair)
            assert ApprovalVote.objects.filter(approval=a).count() == 2
        else:
            assert pair == ["already_decided", "decided"], (a.pk, pair)
            assert ApprovalVote.objects.filter(approval=a).count() == 1

