"""An approval's actions: a reviewer's decision (votes counted, an edit checked, alone or
in a batch), and the sweeper's expiry and escalation."""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

from django.db import IntegrityError, transaction
from django.utils import timezone

from agents import access, broker
from agents.actions.base import ActionError, actor_name, wake_after_commit
from agents.engine import decisions, states
from agents.engine.human import EditRefused, apply_decision, check_edit, edited_key
from agents.engine.run import RunState
from agents.engine.step import step
from agents.lib import sanitize
from agents.models import Approval, ApprovalClaim, ApprovalVote, Run
from agents.notifications import events as outbox
from agents.ops import metrics
from agents.runs import driver, store
from agents.runs.history import StoreHistory
from agents.tools import registry_for

log = logging.getLogger("airlock.actions")

VoteOutcome = Literal["decided", "voted", "already_voted", "late"]


@dataclass
class DecisionResult:
    """What became of one reviewer's answer; `approval` is the row as it stands now.

    decided: it settled the approval (this request's transition was committed);
    voted: it was counted and the approval waits for more votes;
    already_voted: this reviewer had voted in this round: nothing changed;
    late: someone decided first (or it expired, or the run ended): their answer stands.
    """

    approval: Approval
    outcome: VoteOutcome

    @property
    def won(self) -> bool:
        return self.outcome == "decided"


def approval_decide(
    *,
    approval_id: int,
    user: Any,
    decision: str,
    note: str = "",
    args: Any = None,
    remember: str | None = None,
    voter: str = "",
    args_hash: str | None = None,
    via: str = "dashboard",
    by_reviewer: bool = False,
) -> DecisionResult:
    """Record a reviewer's answer (a vote); the first answer that decides wins.

    1. Refuse what no reviewer may do: an unknown approval, a decision this kind does not
       take, an edit with anything but approve, the run's launcher when duties are
       separated.
    2. Lock the run row, then find the approval still pending: every vote and decision
       on a run queues here in turn (and takes its locks in the order a transition's
       commit does: the run, then its approvals), so each voter counts the votes
       committed before it. Not pending any more: someone decided first.
    3. Bind the answer to the call its voter saw (`args_hash`, the approval's as they
       read it): a call that changed since, or an edited call the answer does not name,
       is refused with 409 `call_changed` (engine.decisions.stale_vote). Checked under
       the run's lock, where every edit is made, so no edit lands between check and vote.
    4. An edit (args that differ from the call on the card) is checked against the tool's
       schema and the run's policy, then starts a new round of votes for the new call:
       votes cast on the old arguments stay on the record and no longer count.
    5. Add this reviewer's vote (once a round) and tally the round. Not decided yet: the
       vote is the answer. Decided: a conditional update `WHERE status = 'pending'`
       closes the approval and the engine's transition commits in the same database
       transaction, so a decision never exists without its transition.
    6. The decider wakes a worker after commit. A claim on the call ends with it: the
       decider's own as "decided", anyone else's as "left".

    `remember` ("call" or "tool", with approve) also grants the call that runs for the
    rest of the run, where `Approval.grant_refusal()` has no objection (checked after an
    edit, which may raise the votes needed). `voter` names a vote cast without a user
    (the evals replaying a saved run's votes). `via` says where the answer came from
    (`Approval.CHANNELS`: dashboard, api, slack, email): kept on the vote, on the
    approval it decides, and in the decision's transition. `by_reviewer` (pages, API,
    Slack, email links): `user` answers in their reviewer role, so only a call of a
    project where they hold it; another project's call is answered as a missing one.
    """
    approval = Approval.objects.select_related("run__profile").filter(pk=approval_id).first()
    if approval is None:
        raise ActionError("not_found", f"no approval {approval_id}", status=404)
    if by_reviewer and not access.may_decide(user, approval):
        # Who reviews (access.may_review), for every channel alike (pages, API, Slack,
        # emailed links pass by_reviewer). Checked outside the run's lock: an escalation
        # landing meanwhile only widens who may answer.
        if not access.visible_approvals(user).filter(pk=approval_id).exists():
            # Hidden (another project's, another group's): answered like a missing one.
            raise ActionError("not_found", f"no approval {approval_id}", status=404)
        raise ActionError("forbidden", access.review_refusal(approval), status=403)
    refused = decisions.refusal(
        approval.kind, decision, edits=args is not None, remember=remember, reusable=approval.reusable
    )
    if refused is not None:
        raise ActionError(*refused)
    if access.duties_separated(user, approval.run):
        raise ActionError(
            "separation_of_duties",
            "you launched this run and its policy separates duties: another reviewer must decide",
            status=403,
        )
    note = sanitize.clean(note or "")
    name = user.get_username() if user is not None else (voter or "system")
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("profile").get(pk=approval.run_id)
        approval = Approval.objects.pending().filter(pk=approval_id).first()
        if approval is None:
            return DecisionResult(_fresh(approval_id), "late")
        stale = decisions.stale_vote(current=approval.args_hash, seen=args_hash, edited=approval.edited)
        if stale is not None:
            raise ActionError("call_changed", _changed(approval, stale), status=409)
        state = store.load(run)
        if args is not None:
            args = sanitize.clean(args)
            if args != (approval.edited_args if approval.edited_args is not None else approval.args):
                _edit(approval, state, args, user=user)
        if remember is not None:
            refusal = approval.grant_refusal()
            if refusal is not None:
                # Raised inside the transaction: an edit made above rolls back with it.
                raise ActionError("grant_refused", refusal)
        if approval.votes.filter(round=approval.round, by_name=name).exists():
            return DecisionResult(_fresh(approval_id), "already_voted")
        try:
            with transaction.atomic():  # a savepoint: a lost insert leaves the rest standing
                ApprovalVote.objects.create(
                    approval=approval, round=approval.round, by=user, by_name=name, decision=decision, note=note,
                    args=approval.edited_args, via=via, at=timezone.now(),
                )
        except IntegrityError:
            # The same reviewer's other request (a double click) recorded this round's vote
            # between our check and our insert: where the run's lock does not order them
            # (SQLite has no row locks) the unique key does. Their vote is the answer.
            return DecisionResult(_fresh(approval_id), "already_voted")
        votes = [v.to_dict() for v in approval.current_votes()]
        tally = decisions.tally(votes, approval.required)
        if tally.decision is None:
            return DecisionResult(_fresh(approval_id), "voted")
        now = timezone.now()
        # A decided call holds no claim (docs/reviewing.md#claims).
        updated = Approval.objects.pending().filter(pk=approval_id).update(
            status=decisions.DECISION_STATUS[tally.decision], decision=tally.decision, decided_by=user,
            decided_at=now, note=note, via=via, claimed_by=None, claimed_until=None,
        )
        if updated != 1:
            # Cannot happen while we hold the run's lock (every close of an approval
            # commits through that row); kept so a change there fails loudly here.
            raise store.StaleRun(f"approval {approval_id} changed under the run's lock")
        if approval.claimed_by_id is not None:
            # In the decision's transaction: the claim ends with the decision, never apart.
            claims = ApprovalClaim.objects.filter(approval_id=approval_id)
            if user is not None:
                claims.filter(user=user).close("decided", now)
            claims.close("left", now)
        edit = None
        # The edit rides with an approval only: a rejection of an edited call runs nothing.
        if approval.edited_args is not None and tally.decision == "approve":
            editor = approval.edited_by.get_username() if approval.edited_by else ""
            first = votes[0] if votes else {}
            edit = {"args": approval.edited_args, "by": editor, "note": first.get("note", "")}
        after, t = apply_decision(
            state, tally.decision, note, by=name if user is not None else voter, remember=remember, edit=edit,
            votes=_plain_votes(votes),
        )
        store.commit(run, state, after, t, actor=actor_name(user), user=user)
        if after.state not in states.TERMINAL:
            wake_after_commit(run.pk)
    return DecisionResult(_fresh(approval_id), "decided")


def _changed(approval: Approval, why: str) -> dict[str, Any]:
    """The 409's detail: the call as it stands, so the voter can look again."""
    editor = approval.edited_by.get_username() if approval.edited_by else None
    by = f" ({editor} edited the arguments)" if editor else ""
    return {
        "message": f"not recorded: {why}{by}; review the call as it stands and answer again with its args_hash",
        "args_hash": approval.args_hash,
        "args": approval.current_args,
        "edited_by": editor,
    }


def _edit(approval: Approval, state: RunState, args: Any, *, user: Any) -> None:
    """Bind the approval to the reviewer's call and start a new round of votes.

    The edited call meets the same checks as a proposed one (the tool's schema, then
    policy on these arguments); it may need more votes than the original, never fewer.
    """
    try:
        spec = registry_for(approval.run.profile, [approval.tool]).get(approval.tool)
        # History rules count the calls before this one: not this call's own approval.
        history = StoreHistory(approval.run, lock=True, exclude_approval=approval.pk).figures
        verdict = check_edit(state, spec, args, history)
    except EditRefused as exc:
        raise ActionError(exc.code, exc.detail, status=exc.status) from None
    approval.edited_args = args
    approval.edited_by = user
    approval.round += 1
    approval.required = max(approval.required, verdict.required)
    approval.idempotency_key = edited_key(state, args)
    # An edited call is a person's, no longer like the agent's others: it leaves its group.
    approval.group_key = ""
    approval.save(update_fields=["edited_args", "edited_by", "round", "required", "idempotency_key", "group_key"])


def _plain_votes(votes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**v, "at": v["at"].isoformat()} for v in votes]


def _fresh(approval_id: int) -> Approval:
    return Approval.objects.select_related("decided_by", "edited_by").get(pk=approval_id)


BatchOutcome = Literal["decided", "already_decided", "refused", "needs_more_votes"]
BATCH_MAX = 200  # ids in one batch: as many as the queue's polls may name


@dataclass(frozen=True)
class BatchResult:
    """What became of one id of a batch (`approval_batch_decide`), as the API says it."""

    id: int
    outcome: BatchOutcome
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "outcome": self.outcome, "detail": self.detail}


def _batch_result(approval_id: int, result: DecisionResult, decision: str, *, me: Any) -> BatchResult:
    a = result.approval
    if result.outcome == "decided":
        return BatchResult(approval_id, "decided", a.status)
    if result.outcome == "voted":
        counted = decisions.tally([v.to_dict() for v in a.current_votes()], a.required).approvals
        return BatchResult(approval_id, "needs_more_votes", f"vote recorded: {counted} of {a.required} approvals")
    if result.outcome == "already_voted":
        mine = next((v for v in a.current_votes() if me is not None and v.by_id == me.pk), None)
        if mine is not None and mine.decision != decision:
            return BatchResult(approval_id, "refused", f"you already voted {mine.decision} in this round")
        counted = decisions.tally([v.to_dict() for v in a.current_votes()], a.required).approvals
        return BatchResult(
            approval_id, "needs_more_votes", f"your vote was already recorded: {counted} of {a.required} approvals"
        )
    who = a.decided_by.get_username() if a.decided_by else ""
    return BatchResult(approval_id, "already_decided", f"{a.status_text} by {who}" if who else a.status_text)


def approval_batch_decide(
    *,
    approval_ids: list[int],
    user: Any,
    decision: str,
    note: str = "",
    args_hashes: dict[int, str] | None = None,
    require_hashes: bool = False,
    via: str = "dashboard",
) -> list[BatchResult]:
    """Decide the approvals a reviewer selected, one by one, as the same number of
    single clicks would: each id goes through `approval_decide` on its own (its own
    transaction, lock, compare-and-set and transition), never inside one transaction
    for all, so a batch holds one run's lock at a time and cannot deadlock with a
    single decision or with another batch, and a refusal of one id rolls back nothing
    of the others. `args_hashes` binds each answer to the call its voter saw. No
    argument edits and no grants: a batch answers the calls exactly as shown.

    Each id is refused exactly as a single decision refuses it, with the same reason
    (`refused`, "<error>: <detail>"): one `user` may see but does not review
    (access.may_decide) is "forbidden: <who reviews it>", never decided.
    Ids `user` may not see answer `refused` "not found", exactly like missing ones; with
    `require_hashes` (the queue's form, whose every row carries its call's hash) so does
    an id without a hash: the page did not show it. Results come in the order of
    `approval_ids` (distinct, at most BATCH_MAX)."""
    if decision not in decisions.KIND_DECISIONS[decisions.POLICY]:
        raise ActionError("invalid_decision", "a batch approves or rejects")
    if not approval_ids or len(approval_ids) > BATCH_MAX or len(set(approval_ids)) != len(approval_ids):
        raise ActionError("invalid_ids", f"name between 1 and {BATCH_MAX} distinct approval ids")
    hashes = args_hashes or {}
    valid = [i for i in approval_ids if 0 < i <= access.MAX_ID]
    visible = set(access.visible_approvals(user).filter(pk__in=valid).values_list("pk", flat=True))
    results = []
    for approval_id in approval_ids:
        if approval_id not in visible or (require_hashes and approval_id not in hashes):
            results.append(BatchResult(approval_id, "refused", "not found"))
            continue
        try:
            # by_reviewer: each id meets the single decision's every check (who reviews
            # it, access.may_decide, then duties), and is refused with its reason.
            result = approval_decide(
                approval_id=approval_id, user=user, decision=decision, note=note,
                args_hash=hashes.get(approval_id), via=via, by_reviewer=True,
            )
        except ActionError as exc:
            if exc.code == "not_found":  # gone since it was listed: no different from hidden
                results.append(BatchResult(approval_id, "refused", "not found"))
                continue
            detail = exc.detail.get("message", exc.code) if isinstance(exc.detail, dict) else str(exc.detail)
            results.append(BatchResult(approval_id, "refused", f"{exc.code}: {detail}"))
            continue
        results.append(_batch_result(approval_id, result, decision, me=user))
    return results


def approval_expire(*, approval_id: int, owner: str, now: float | None = None) -> bool:
    """Expire one pending approval whose time is up: the one place an approval expires
    for want of an answer (the sweeper calls it). True if this call expired it.

    1. Claim the run's lease (a worker or another sweeper holds it: leave it to them).
    2. Step the waiting run on the clock alone: the engine expires the approval as the
       run's `on_expiry` says (the model is told no reviewer answered, or the run
       fails), or fails the run if its deadline came first.
    3. Commit with the version check: a reviewer who answered first moved the version,
       and their answer stands. Release the lease, then wake a worker if the run goes on
       (woken before the release, the worker would find the run still leased).
    """
    run_id = Approval.objects.pending().filter(pk=approval_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return False  # answered (or the run ended) since the sweeper listed it
    run = driver.step_once(
        run_id, owner, lambda run, state: step(state, driver.clock_only(run, now if now is not None else time.time()))
    )
    if run is None:
        return False
    if run.state not in states.TERMINAL:
        broker.wake_run(run_id)
    return True


def approval_escalate(*, approval_id: int, now: dt.datetime | None = None) -> bool:
    """Escalate one pending call to its profile's backup group: the one place a call is
    escalated (the sweeper calls it once its profile's `escalate_after_seconds` passed).
    True if this call escalated it.

    1. Lock the run's row first, as a decision does (approval_decide): the same order
       (the run, then its approvals), so a reviewer answering now and this escalation
       queue one behind the other instead of deadlocking on the event's reference to
       the run.
    2. A conditional update stamps `escalated_at` only on a call still pending and not
       yet escalated: of two sweepers the second finds it stamped and does nothing; a
       call decided meanwhile is left alone.
    3. The `approval.escalated` event goes into the outbox in the same transaction: one
       event per escalation, sent once it commits (webhooks, Slack; the backup group's
       digest picks the call up because they may now decide it).
    """
    now = now or timezone.now()
    found = (
        Approval.objects.pending().filter(pk=approval_id)
        .values_list("run_id", "run__profile__backup_group", "run__profile__name").first()
    )
    if found is None:
        return False  # answered (or the run ended) since the sweeper listed it
    run_id, group, agent = found
    if not group:
        return False  # the profile no longer names a backup group: nowhere to go
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run_id).values_list("pk").first()
        escalated = (
            Approval.objects.pending()
            .filter(pk=approval_id, escalated_at__isnull=True)
            .update(escalated_at=now, escalated_to=group)
        )
        if escalated != 1:
            # Another sweeper escalated it first (its event stands), or a reviewer decided it.
            return False
        outbox.emit("approval.escalated", Approval.objects.get(pk=approval_id))
        metrics.observe_escalation(agent)  # in this transaction: counted once, with the escalation
    log.info("approval=%s of run=%s escalated to %s", approval_id, run_id, group)
    return True
