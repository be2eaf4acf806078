"""External agents: runs whose decisions come from a client through the decision API
(docs/gateway.md), not from a model Airlock calls. The functions the API and the MCP
gateway share: `call_propose`, `call_status`, `call_wait`, `call_report`, `run_finish`.

A proposed call is a model decision given from outside (`llm.external.ExternalClient`),
so it takes the engine's own path, `step()`: validation, budgets, repeats, policy with
rules, taint and grants, approvals, the journal. One call at a time: the run is locked
(`SELECT ... FOR UPDATE`) while a proposal or a finish is judged and committed, and
no tool runs inside that lock; a report's one commit is conditional on the run's
version instead, as every transition's is.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import prefetch_related_objects
from django.utils import timezone

from agents import access, broker
from agents.actions.base import ActionError, actor_name
from agents.engine import policy, states
from agents.engine.acting import report
from agents.engine.fingerprints import fingerprint, idempotency_key
from agents.engine.history import Query
from agents.engine.protocols import Deps, ModelReply, ProposedCall, ToolOutcome, Usage
from agents.engine.run import Move, RunState
from agents.engine.step import step
from agents.lib import prepared, rows, sanitize
from agents.llm.external import ExternalClient
from agents.models import Approval, ClientCall, Run, ToolCall
from agents.runs import driver, statement, store
from agents.runs.history import StoreHistory
from agents.tools import OnDemand

# What a call can be, as `call_status` answers:
PENDING = "pending"  # waiting for a human (policy asked, or "outcome unknown")
APPROVED = "approved"  # a client tool the client may run now, with the answer's `args`
RUNNING = "running"  # Airlock runs it (a registry tool), or is about to
SUCCEEDED = "succeeded"  # the result is in `result`
FAILED = "failed"  # it ran and failed: `result` says how
REJECTED = "rejected"  # a reviewer said no: `note` says why
EXPIRED = "expired"  # nobody answered in time, or the run ended before it ran
DENIED = "denied"  # policy refused it: `reason` says why
STATUSES = (PENDING, APPROVED, RUNNING, SUCCEEDED, FAILED, REJECTED, EXPIRED, DENIED)
# The statuses a long poll waits through: the client has nothing to do in them.
WAITING = frozenset({PENDING, RUNNING})
MAX_WAIT_SECONDS = 30.0
POLL_SECONDS = 0.2
# How long a proposal waits for Airlock's tool running another call of the run.
RUNNING_WAIT_SECONDS = 10.0
# How many times a report reads the run again when another move of it came first.
REPORT_ATTEMPTS = 5


@dataclass
class CallAnswer:
    """A proposed call and what became of it, as the API answers."""

    key: str
    tool: str
    args: Any
    verdict: str
    reason: str
    rule: dict[str, Any] | None
    approval: dict[str, Any] | None
    status: str
    result: Any
    edited: bool
    note: str
    client: bool
    run_state: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "tool": self.tool, "args": self.args, "verdict": self.verdict, "reason": self.reason,
            "rule": self.rule, "approval": self.approval, "status": self.status, "result": self.result,
            "edited": self.edited, "note": self.note, "client_tool": self.client, "run_state": self.run_state,
        }


def parse_usage(raw: Any) -> Usage | None:
    """A client's `usage` ({"input_tokens", "output_tokens", "cached_input_tokens"?,
    "cache_write_tokens"?}, whole numbers), or None when it sent none."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ActionError("invalid_usage", "usage must be an object with input_tokens and output_tokens")
    names = ("input_tokens", "output_tokens", "cached_input_tokens", "cache_write_tokens")
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ActionError("invalid_usage", f"unknown usage key(s): {', '.join(unknown)}")
    values = [raw.get(n, 0) for n in names]
    if any(n not in raw for n in names[:2]) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**53 for v in values
    ):
        raise ActionError("invalid_usage", "usage needs whole, non-negative input_tokens and output_tokens")
    if values[2] + values[3] > values[0]:
        raise ActionError("invalid_usage", "cached tokens are part of input_tokens and cannot exceed it")
    return Usage(*values)


def _driven_run(run_id: int, user: Any) -> Run:
    """The external run `user` may drive: 404 for a run they may not read (as every
    read answers), 403 for one they may read but did not launch, 409 for a run whose
    profile is not external."""
    return _drivable(access.readable_run(user, run_id), user)


def _drivable(run: Run, user: Any) -> Run:
    if not access.can_drive(user, run):
        raise ActionError("forbidden", "only the run's launcher (or a superuser) may drive it", status=403)
    if run.profile.provider != "external":
        raise ActionError("not_external", f"run {run.pk} is driven by its {run.profile.provider} model, not a client",
                          status=409)
    return run


_DRIVEN = "a.id = %s AND (a.created_by_id = %s OR %s)"


@functools.cache
def _lock_query() -> rows.Joined:
    # Only a run the user launched (or any, for a superuser) is locked: nobody can hold
    # up another's run by asking for it. SQLite has no row locks (nor needs them: it
    # takes one writer at a time).
    lock = " FOR UPDATE OF a" if connection.features.has_select_for_update_of else ""
    return rows.Joined(Run, ["profile", "created_by"], _DRIVEN + lock, defer=["script"], prepared=True)


_READ = rows.Joined(Run, ["profile", "created_by"], _DRIVEN, defer=["script"], prepared=True)
# A call beside its run, found by its key's own unique index: a plan that walked the
# run's calls instead (as a generic plan made while the table was small did) costs with
# every call.
_BY_KEY_ON = f"c0.id = (SELECT k.id FROM {ClientCall._meta.db_table} k WHERE k.key = %s) AND c0.run_id = a.id"
# A report's run with the reported call beside it (`run.by_key`, None if the run has no
# such call): the two reads of every report in one statement.
_READ_WITH_CALL = rows.Joined(
    Run, ["profile", "created_by"], _DRIVEN, defer=["script"], prepared=True,
    beside=[("by_key", ClientCall, _BY_KEY_ON)],
)

# The same two reads whoever asks (no launcher filter, no lock): a report's first read,
# sent in the token's round trip before its user is known (`call_read_ahead`,
# agents/api/external.py) and judged after it (`_judged`).
_RUN_WITH_CALL = rows.Joined(
    Run, ["profile", "created_by"], "a.id = %s", defer=["script"], prepared=True,
    beside=[("by_key", ClientCall, _BY_KEY_ON)],
)
# A status read's: with what its answer shows (`_answer(ahead=True)`), the call's newest
# journal entry and newest approval, the people that approval names and how many of its
# votes count.
_USER = get_user_model()
_RUN_WITH_ANSWER = rows.Joined(
    Run, ["profile", "created_by"], "a.id = %s", defer=["script"], prepared=True,
    beside=[
        ("by_key", ClientCall, _BY_KEY_ON),
        ("journal_entry", ToolCall,
         f"c1.id = (SELECT max(j.id) FROM {ToolCall._meta.db_table} j WHERE j.run_id = a.id AND j.call_id = c0.call_id)"),
        ("call_approval", Approval,
         f"c2.id = (SELECT max(p.id) FROM {Approval._meta.db_table} p WHERE p.run_id = a.id AND p.call_id = c0.call_id)"),
        ("call_approval_decided_by", _USER, "c3.id = c2.decided_by_id"),
        ("call_approval_edited_by", _USER, "c4.id = c2.edited_by_id"),
        ("call_approval_claimed_by", _USER, "c5.id = c2.claimed_by_id"),
    ],
    annotate=[("call_approval_votes", Approval.counted_votes_sql("c2"))],
)


Statement = prepared.Statement


def call_read_ahead(run_id: int, key: str, *, answer: bool) -> tuple[str, list[Any]] | None:
    """The statement a report (`answer=False`) or a status read (`answer=True`: with what
    the answer shows) of call `key` of run `run_id` reads the run and its call with, to
    send in the token's round trip (its rows go to the action's `read`); None for an id
    no run can have or a key no call can have."""
    if not 0 < run_id <= access.MAX_ID or not _valid_key(key):
        return None
    return (_RUN_WITH_ANSWER if answer else _RUN_WITH_CALL).sql, [key, run_id]


def _judged(run_id: int, user: Any, read: Sequence[Sequence[Any]], *, answer: bool) -> Run:
    """The run (its call of the key beside it) from the rows `call_read_ahead`'s statement
    read before `user` was known, judged now: the refusals `_locked(lock=False)` gives
    (404 for a run they may not read, 403 for one they did not launch, 409 for one not
    external)."""
    found = (_RUN_WITH_ANSWER if answer else _RUN_WITH_CALL).instances(read)
    if not found:
        return _driven_run(run_id, user)  # no such run: the 404 every read gives
    return _judge(found[0], user)


def _judge(run: Run, user: Any) -> Run:
    """A run read before asking whether `user` may drive it (`_locked`, `_judged`): a
    404 like a missing run's if they may not read it, else `_drivable`'s answer."""
    if not access.can_read_run(user, run):
        raise access.RunHidden(f"no run {run.pk}")
    return _drivable(run, user)


def _locked(
    run_id: int, user: Any, *, lock: bool = True, key: str | None = None,
    then: Sequence[Statement] = (), into: list[list[tuple[Any, ...]] | None] | None = None,
) -> Run:
    """The external run `user` may drive, read and locked (`SELECT ... FOR UPDATE`) in
    the caller's transaction, or the refusal `_driven_run` gives. Every proposal and
    finish of a run queues here, and so does a reviewer's decision
    (actions.approval_decide locks the same row): each sees the last one's commit.
    `lock=False` reads it only (a report, whose commit checks the version instead);
    with a `key` too, the run's call of that key comes in the same read (`_call`).

    `then`: statements sent in the same round trip, after the run's (`prepared.pipelined`;
    prepared reads only, one after another, where nothing is prepared): each a statement
    of its own, so each starts once the lock is held and sees the last holder's commit;
    their rows go to `into`."""
    query, params = _lock_query() if lock else _READ, [run_id, user.pk, user.is_superuser]
    if not lock and _valid_key(key):
        query, params = _READ_WITH_CALL, [key, *params]
    if not 0 < run_id <= access.MAX_ID:
        found = []
    elif then:
        statements = [(query.sql, params, True), *then]
        if prepared.preparing():
            read, *also = prepared.pipelined(statements)
        else:
            read, *also = prepared.fetch_together([(text, values or ()) for text, values, _kept in statements])
        assert read is not None
        found = query.instances(read)
        if into is not None:
            into += also
    else:
        found = query.fetch(params)
    if not found:
        _driven_run(run_id, user)  # not theirs: the refusal a read gives (404, 403)
        raise ActionError("forbidden", "only the run's launcher (or a superuser) may drive it", status=403)
    return _judge(found[0], user)


def _ended(run: Run) -> ActionError:
    return ActionError("run_ended", {"state": run.state, "error": run.error, "answer": run.answer}, status=409)


def _deps(
    run: Run, state: RunState, reply: ModelReply | None, counts: dict[str, int] | None = None,
    history: StoreHistory | None = None,
) -> tuple[Deps, ExternalClient]:
    """`counts`: repeat counts (fingerprint -> times run) the caller has read under the
    run's lock, so the journal does not read them again; `history`: the run's history
    (with the figures the caller read ahead), or a new one."""
    client = ExternalClient(reply)
    # The run's own tool names, read only if the call is of an MCP tool (or an unknown
    # tool's refusal lists them): a client or built-in tool's proposal reads none.
    registry = OnDemand(run.profile, state.tools)
    journal = driver.StoreJournal(run)
    journal.counts.update(counts or {})
    # Judged inside the run's locked transaction (see `_propose`).
    history = history or StoreHistory(run, lock=True)
    return Deps(model=client, registry=registry, journal=journal, history=history), client


def _step_reply(
    run: Run, state: RunState, user: Any, reply: ModelReply, owner: str | None = None,
    record: Callable[[RunState, Move], ClientCall | None] | None = None,
    counts: dict[str, int] | None = None, history: StoreHistory | None = None,
) -> tuple[RunState, Move | None, ClientCall | None]:
    """Step the locked run from `state` until the client's decision is taken (or the
    run ends): a queued run is picked up first, a run over its context budget folds
    first. Returns the state after, the transition that took the decision (None if
    none did) and the row `record` made of that transition (it gets the state after
    and the transition; its row is written by the transition's own commit). With
    `owner`, the commit that leaves a call of Airlock's own tool to run also takes the
    run's lease for `owner` (free, expired or theirs), so the drive that runs it takes
    no lease; held by another, the commit goes without it. `counts`, `history`: see `_deps`."""
    deps, client = _deps(run, state, reply, counts, history)
    for _ in range(4):
        outcome = step(state, deps)
        if outcome is None:
            break
        after, t = outcome
        decided = client.reply is None and t.kind == "model"
        row = record(after, t) if decided and record is not None else None
        runs_here = owner is not None and after.state == states.ACTING and not (after.current_call or {}).get("client")
        try:
            try:
                store.commit(run, state, after, t, actor=actor_name(user), lease_owner=owner if runs_here else None,
                             take_lease=runs_here, record=row)
            except store.StaleRun:
                if not runs_here:
                    raise
                # Someone holds the lease (a woken worker): commit without it, as they may run it.
                store.commit(run, state, after, t, actor=actor_name(user), record=row)
        except store.StaleRun:
            # Cannot happen while we hold the run's lock (every commit of a run updates
            # that row); should a change make it possible, the client retries, no 500.
            raise ActionError("busy", f"run {run.pk} moved meanwhile; try again", status=409) from None
        state = after
        if decided:
            return state, t, row
        if state.state in states.TERMINAL:
            break
    return state, None, None


class _ToolRunning(Exception):
    """Airlock's own tool is running for another call of the run: it will finish by
    itself, so a different call may wait for it instead of being refused."""

    def __init__(self, detail: dict[str, Any]) -> None:
        self.detail = detail


# The statuses a call ends in: an outcome the client can be given.
FINISHED = frozenset({SUCCEEDED, FAILED, REJECTED, EXPIRED, DENIED})


def call_propose(
    *, run_id: int, tool: Any, args: Any, user: Any, usage: Any = None, once: datetime | None = None
) -> CallAnswer:
    """Propose one call of an external run (see `_propose`). `once` (the gateway) is when
    this call arrived: an identical call whose outcome was delivered by then
    (`call_delivered`) is not answered again; this call is a new intent, policed anew.
    One whose outcome was delivered after this call arrived is the call this one is a
    retry of, racing the retry that was answered: it gets the same outcome (however
    late its proposal gets the run's lock). A different call that
    meets Airlock's own tool running for another call (an agent calling tools in
    parallel) waits for it, up to RUNNING_WAIT_SECONDS, holding no lock or connection,
    then is proposed in turn; a call waiting for a human or for the client is refused
    at once (409 call_pending)."""
    give_up = time.monotonic() + RUNNING_WAIT_SECONDS
    foresee = True
    while True:
        try:
            return _propose(run_id=run_id, tool=tool, args=args, user=user, usage=usage, once=once, foresee=foresee)
        except _Unforeseen:
            foresee = False  # the run's policy or scope changed: read as it is now
        except _ToolRunning as running:
            if time.monotonic() >= give_up:
                raise ActionError("call_pending", running.detail, status=409) from None
            driver.release_connection()
            time.sleep(POLL_SECONDS)


class _Unforeseen(Exception):
    """The history figures a proposal read ahead were another policy's or scope's: its
    transaction is rolled back (with their locks) and the proposal made again."""


# What each run's last proposal in this process judged under, by (run, user): the run
# (its history's scope) and its policy, so the next proposal can send its history
# rules' figures in the run lock's round trip (`_propose`). A few hundred runs at most.
_FORESEEN: OrderedDict[tuple[int, int], tuple[StoreHistory, dict[str, Any] | None]] = OrderedDict()
_FORESEEN_LOCK = threading.Lock()  # the web process's threads share it
FORESEEN_KEPT = 512


def _foreseen(
    run_id: int, user: Any, tool: str, args: Any
) -> tuple[StoreHistory | None, dict[str, Any] | None, list[Query]]:
    """The history, policy and queries this proposal will judge with, if the run's last
    one in this process is anything to go by (PostgreSQL, preparing: the figures ride a
    pipeline)."""
    if not prepared.preparing():
        return None, None, []
    with _FORESEEN_LOCK:
        seen = _FORESEEN.get((run_id, user.pk))
    if seen is None:
        return None, None, []
    history, run_policy = seen
    return history, run_policy, policy.history_queries(run_policy, tool, args)


def _foresee(run: Run, user: Any, history: StoreHistory, run_policy: dict[str, Any] | None) -> None:
    key = (run.pk, user.pk)
    with _FORESEEN_LOCK:
        _FORESEEN[key] = (history, run_policy)
        _FORESEEN.move_to_end(key)
        while len(_FORESEEN) > FORESEEN_KEPT:
            _FORESEEN.popitem(last=False)


def _propose(
    *, run_id: int, tool: Any, args: Any, user: Any, usage: Any, once: datetime | None, foresee: bool = True
) -> CallAnswer:
    """Propose one call of an external run; what policy made of it and, for a
    registry tool that was allowed, its result.

    1. Lock the run, refusing who may not drive it; then bad usage, a tool name that
       is not text. An identical call (same tool, same canonical arguments) proposed
       before in this run answers with that call, whatever became of it: a retry never
       runs anything twice (with `once`, only if its outcome was not delivered before
       this call arrived). A run that ended: 409 run_ended.
    2. A different call while one waits (for a reviewer, for the client's report):
       409 call_pending, with that call; while Airlock's tool runs: _ToolRunning.
    3. Step the engine with the call as the model's decision: one transition, the
       proposal's record (`ClientCall`) in the same commit. Invalid arguments or an
       unknown tool are recorded as a model's bad call would be, then answered 400.
    4. Outside the lock: an allowed registry tool runs now (the driver, under the
       run's lease, with its journal), and the answer carries its result.
    """
    invalid = None
    named = isinstance(tool, str) and 0 < len(tool) <= 100
    if named:
        # As the arguments: text PostgreSQL can store (a NUL was a 500); such a name is
        # no tool's, so it is recorded and answered as an unknown tool.
        tool = sanitize.clean(tool)
        args = sanitize.clean(args if args is not None else {})
        fp = fingerprint(tool, args)
    foreseen, seen_policy, guessed = _foreseen(run_id, user, tool, args) if named and foresee else (None, None, [])
    with transaction.atomic():
        # The identical-call read goes in the lock's round trip (it needs only the run's
        # id and the call's fingerprint), and so do the history rules' figures under
        # their advisory locks when the run's last proposal here says which: each runs
        # once the run's lock is held, the advisory locks after the row's.
        then: list[Statement] = [(*_identical_read(run_id, fp), True)] if named else []
        if foreseen is not None and guessed:
            # The figures' first statement (their locks, the plan settings) is a
            # one-row read too: it goes in the identical read's statement.
            settings, figures = foreseen.ahead(guessed)
            then = [prepared.beside(then[0], settings), figures]
        ahead: list[list[tuple[Any, ...]] | None] = []
        run = _locked(run_id, user, then=then, into=ahead)
        parsed_usage = parse_usage(usage)
        if not named:
            raise ActionError("invalid_call", "tool must be a tool's name")
        state = store.load(run)
        # Judged inside the run's locked transaction: the history rules' figures are read
        # under their advisory locks, held until this proposal commits (runs/history.py),
        # ahead of the judgement that asks.
        history = StoreHistory(run, lock=True)
        # The queries are the policy's: under the policy foreseen, those worked out then.
        same_policy = foreseen is not None and state.policy == seen_policy
        queries = guessed if same_policy else policy.history_queries(state.policy, tool, args)
        if guessed:
            assert foreseen is not None
            if not same_policy or foreseen.scope() != history.scope():
                raise _Unforeseen
            history.take(queries, ahead)
        _foresee(run, user, history, state.policy)
        same, repeats = _identical(run, fp, history, queries, cast(list[list[tuple[Any, ...]]], ahead[:1]))
        if same is not None and not (once is not None and same.delivered_at is not None and same.delivered_at <= once):
            return _answer(same, run)
        if run.state in states.TERMINAL:
            raise _ended(run)
        if state.state == states.ACTING and not (state.current_call or {}).get("client"):
            raise _ToolRunning(_waiting_detail(run, state))
        if state.state not in (states.QUEUED, states.PLANNING) or state.pending_calls:
            raise ActionError("call_pending", _waiting_detail(run, state), status=409)
        call_id = f"ext_{state.model_calls}"
        reply = ModelReply(calls=(ProposedCall(id=call_id, tool=tool, args=args),), usage=parsed_usage)
        owner = driver.worker_name()

        def record(after: RunState, t: Move) -> ClientCall | None:
            # The proposal's row, written by the commit of the transition that judged it.
            if "verdict" not in t.detail:
                return None
            verdict = t.detail["verdict"]
            current = after.current_call if after.current_call and after.current_call["id"] == call_id else None
            return ClientCall(
                run=run, call_id=call_id, fingerprint=fp, tool=tool, args=args,
                key=current["key"] if current else idempotency_key(run.pk, after.steps, tool, args),
                client=bool(current and current.get("client")), verdict=verdict["action"],
                reason=verdict.get("reason", ""), rule=verdict.get("rule"),
            )

        after, t, proposed = _step_reply(run, state, user, reply, owner, record, counts={fp: repeats}, history=history)
        if t is not None and "invalid" in t.detail:
            invalid = t.detail["invalid"]
    if invalid is not None:
        raise ActionError(invalid["error"], invalid["detail"], status=400)
    if after.state in states.TERMINAL:
        raise _ended(run)
    if proposed is None:  # the engine took no decision (cannot happen in planning): say so, not 500
        raise ActionError("busy", f"run {run.pk} did not take the call; try again", status=409)
    if after.state == states.ACTING and not proposed.client:
        # `run` as our commit left it (version, profile), with the lease that commit
        # took; without it (a worker held it) the driver's lease checks that version,
        # so a run that moved since is read again there, not trusted.
        made: list[Deps] = []
        leased = run.lease_owner == owner

        def deps(driven: Run) -> Deps:
            made.append(driver.deps_for(driven, after.tools))
            journal = made[0].journal
            if leased and t is not None and isinstance(journal, driver.StoreJournal):
                # Our commit wrote the call's intent and took the lease, so nobody has
                # touched the call since: the drive need not read its journal entry back.
                # (Without the lease a worker may have begun it meanwhile: read it then.)
                journal.committed(t)
            return made[0]

        run = driver.drive(run.pk, run=run, state=after, owner=owner, leased=leased, deps=deps)
        if run.state == states.ACTING and run.lease_owner is None:
            # A worker held the lease when we tried (and may have let go before seeing
            # the call): wake one rather than wait for the sweeper's idle check.
            broker.wake_run(run.pk)
        ran = cast(driver.StoreJournal, made[0].journal).known.get(proposed.key) if made else None
        if ran is not None and ran.status in ("succeeded", "failed") and proposed.verdict == "allow":
            # This drive ran the call and committed its result: that is the answer (an
            # allowed call that ran to its end never met a reviewer).
            return _answer(proposed, run, journal={"status": ran.status, "result": ran.result}, reviewed=False)
    elif after.state == states.ACTING:
        # A client tool allowed: our commit wrote its journal intent, which the client's
        # report is the next thing to change (and it needs the key this answer gives).
        return _answer(proposed, run, journal={"status": "intended", "result": None})
    return _answer(proposed, run)


# The reads every proposal, report and answer makes, written out (agents/lib/rows.py);
# the two on every allowed call's path are prepared too.
_BY_KEY = rows.Joined(ClientCall, [], "a.run_id = %s AND a.key = %s ORDER BY a.id LIMIT 1", prepared=True)
_APPROVAL = rows.Joined(Approval, ["decided_by"], "a.run_id = %s AND a.call_id = %s ORDER BY a.id DESC LIMIT 1")


@functools.cache
def _journal() -> rows.Rows:
    return rows.Rows(ToolCall, ["status", "result"])


@functools.cache
def _identical_query() -> tuple[str, rows.Columns]:
    # Always one row: the call's columns (NULLs when there is none) and the count.
    call = rows.Columns(ClientCall, "a")
    sql = (
        f"SELECT {call.sql}, ({driver.REPEATS})"  # noqa: S608
        " FROM (SELECT 1 AS one) o LEFT JOIN agents_clientcall a ON a.id = (SELECT max(id) FROM ("
        # The newest call of the same fingerprint, or whose journal entry (an edit's
        # arguments) has it: the first on (run, fingerprint); the second from the journal's
        # entries of that fingerprint (on its own (run, fingerprint), none for a new call),
        # each looking up its call. As one OR, the plan walked every call of the run
        # backwards from the newest, and a new call (the usual case) matches none.
        " SELECT max(c.id) AS id FROM agents_clientcall c WHERE c.run_id = %s AND c.fingerprint = %s"
        " UNION ALL SELECT max((SELECT max(c.id) FROM agents_clientcall c WHERE c.run_id = j.run_id"
        " AND c.call_id = j.call_id)) FROM agents_toolcall j WHERE j.run_id = %s AND j.fingerprint = %s) newest)"
    )
    return sql, call


def _identical_read(run_id: int, fp: str) -> tuple[str, list[Any]]:
    return _identical_query()[0], [run_id, fp, run_id, fp, run_id, fp]


def _identical(
    run: Run, fp: str, history: StoreHistory | None = None, queries: Sequence[Query] = (),
    read: Sequence[Sequence[tuple[Any, ...]]] = (),
) -> tuple[ClientCall | None, int]:
    """The run's earlier call identical to this one: proposed as such, or the call a
    reviewer's edit turned into this one (its journal entry has the fingerprint); and
    how many times a call with this fingerprint ran to an end in the run, the repeat
    count the engine checks a new call against (StoreJournal.executed's). One prepared
    statement for both, under the run's lock: a proposal's two questions about its
    fingerprint cost one round trip, the lock's (`_locked`), whose rows come as `read`
    (read here without). Then the figures of the history `queries` the judgement will
    ask `history` are read ahead, under their locks (`StoreHistory.read_ahead`)."""
    _sql, call = _identical_query()
    [[row]] = read or [rows.fetch(*_identical_read(run.pk, fp), prepared=True)]
    if history is not None and queries:
        history.read_ahead(queries)
    return (call.instance(row) if row[0] is not None else None), int(row[call.width])


def _waiting_detail(run: Run, state: RunState) -> dict[str, Any]:
    current = state.current_call or {}
    waiting = ClientCall.objects.filter(run=run, call_id=current.get("id", "")).first()
    detail: dict[str, Any] = {"message": "a call of this run is waiting; one call at a time", "state": state.state}
    if waiting is not None:
        detail["call"] = _answer(waiting, run).to_dict()
    return detail


def _answer(
    call: ClientCall, run: Run, journal: dict[str, Any] | None = None, *, reviewed: bool = True,
    ahead: bool = False,
) -> CallAnswer:
    """What became of `call`, read from the engine's rows: its approval (the newest,
    for this call) and its journal entry (`journal`, {"status", "result"}, when the
    caller has just written it; `reviewed=False` when it knows no approval exists).
    `ahead`: `run` is `_judged`'s, which holds both as they were read beside it (the
    journal entry unless `journal` is given)."""
    approval = None
    if ahead:
        approval = _approval_ahead(run)
        if journal is None:
            journal = _journal_ahead(run)
    elif reviewed and not (call.client and call.verdict == "allow"):  # such a call never meets a reviewer
        found = _APPROVAL.fetch([call.run_id, call.call_id])
        approval = found[0] if found else None
        if approval is not None:
            prefetch_related_objects([approval], "votes")
    if journal is None and not ahead:
        newest = _journal().fetch("run_id = %s AND call_id = %s", [call.run_id, call.call_id], order_by="id DESC",
                                  limit=1)
        journal = newest[0]._asdict() if newest else None
    result = None
    if approval is not None and approval.status == Approval.Status.PENDING:
        status = PENDING
    elif journal is not None:
        status = {
            "intended": APPROVED if call.client else RUNNING, "started": RUNNING,
            "succeeded": SUCCEEDED, "failed": FAILED,
        }[journal["status"]]
        result = journal["result"]
    elif approval is not None:
        status = {"rejected": REJECTED, "expired": EXPIRED, "denied": DENIED}.get(approval.status, PENDING)
    else:
        status = DENIED if call.verdict == "deny" else PENDING
    if status in (PENDING, APPROVED, RUNNING) and run.state in states.TERMINAL:
        status = EXPIRED  # the run ended first: this call will never run (or finish)
    edited = approval is not None and approval.edited_args is not None
    args = approval.edited_args if edited else call.args
    return CallAnswer(
        key=call.key, tool=call.tool, args=args, verdict=call.verdict, reason=call.reason, rule=call.rule,
        approval=_plain(approval.to_dict()) if approval is not None else None, status=status, result=result,
        edited=edited, note=approval.note if approval is not None else "", client=call.client, run_state=run.state,
    )


def _plain(data: Any) -> Any:
    # Datetimes as the API writes them, so the answer is JSON however it is sent.
    return json.loads(json.dumps(data, default=lambda v: v.isoformat()))


def _valid_key(key: Any) -> bool:
    return isinstance(key, str) and len(key) <= 64


def _call(run: Run, key: str) -> ClientCall:
    """The run's call of `key`, or a 404: read beside the run if `_locked` was given the
    key, else now."""
    if "by_key" in run.__dict__:
        found = [c for c in (run.__dict__["by_key"],) if c is not None]
    else:
        found = _BY_KEY.fetch([run.pk, key]) if _valid_key(key) else []
    if not found:
        raise ActionError("not_found", f"run {run.pk} has no call {key!r}", status=404)
    return cast(ClientCall, found[0])


def call_delivered(*, run_id: int, key: str) -> None:
    """The call's outcome was given to its caller (the gateway's streams): the caller's
    next identical call is a new intent (`call_propose(once=...)`). Conditional, so
    of two answers racing, both give the outcome and the mark is set once."""
    ClientCall.objects.filter(run_id=run_id, key=key, delivered_at__isnull=True).update(delivered_at=timezone.now())


def call_status(*, run_id: int, key: str, user: Any, read: Sequence[Sequence[Any]] | None = None) -> CallAnswer:
    """The call as it stands; `read`: the rows `call_read_ahead`'s statement read."""
    return _as_it_stands(run_id, key, user, read)[2]


def _as_it_stands(
    run_id: int, key: str, user: Any, read: Sequence[Sequence[Any]] | None
) -> tuple[Run, ClientCall, CallAnswer]:
    """The run `user` drives, its call of `key` and the call's answer: read now, or
    judged from `read` (`call_read_ahead`'s rows, with what the answer shows beside them)."""
    if read is None:
        run = _driven_run(run_id, user)
        call = _call(run, key)
        return run, call, _answer(call, run)
    run = _judged(run_id, user, read, answer=True)
    call = _call(run, key)
    return run, call, _answer(call, run, ahead=True)


def _journal_ahead(run: Run) -> dict[str, Any] | None:
    """The call's newest journal entry as `_answer` reads it, from what `_judged`'s rows
    held beside the run (None: the call has none)."""
    entry = run.__dict__["journal_entry"]
    return None if entry is None else {"status": entry.status, "result": entry.result}


def _approval_ahead(run: Run) -> Approval | None:
    """The call's newest approval as `_answer` reads it (who decided, edited and claims
    it attached; its votes read only if one counts), from `_judged`'s rows."""
    approval: Approval | None = run.__dict__["call_approval"]
    if approval is not None:
        approval.attach(
            {"decided_by": run.__dict__["call_approval_decided_by"], "edited_by": run.__dict__["call_approval_edited_by"],
             "claimed_by": run.__dict__["call_approval_claimed_by"]},
            counted_votes=run.__dict__["call_approval_votes"],
        )
    return approval


def call_wait(
    *, run_id: int, key: str, user: Any, wait: float, read: Sequence[Sequence[Any]] | None = None
) -> CallAnswer:
    """The call's answer once it leaves `pending` or `running`, or after `wait`
    seconds (at most 30) as it stands.

    No transaction or connection is held across the wait: each poll reads the run's
    version and state (one indexed query) and gives the connection back before
    sleeping, so a threaded web server's waiting requests hold threads, not database
    connections. The call's rows are read again only when the version moved: every
    change of a call's status (a decision, an expiry, a result, the run's end) is a
    transition, and every transition bumps the version (the gateway's watcher relies
    on the same).
    """
    if not 0 <= wait <= MAX_WAIT_SECONDS:
        raise ActionError("invalid_wait", f"wait is 0 to {MAX_WAIT_SECONDS:g} seconds")
    run, call, answer = _as_it_stands(run_id, key, user, read)
    give_up = time.monotonic() + wait
    seen = run.version
    while True:
        left = give_up - time.monotonic()
        if answer.status not in WAITING or left <= 0:
            return answer
        driver.release_connection()
        time.sleep(min(POLL_SECONDS, left))
        now = Run.objects.filter(pk=run.pk).values_list("version", "state").first()
        if now is not None and now[0] != seen:
            seen, run.state = now
            answer = _answer(call, run)


def call_report(
    *, run_id: int, key: str, ok: Any, output: Any, user: Any, read: Sequence[Sequence[Any]] | None = None
) -> CallAnswer:
    """The client's result of a client tool it was allowed (or approved) to run.

    A second report of the same call changes nothing and answers as the first left
    it; a report for a call that may not run (pending, rejected, denied) is a 409
    `not_approved`; for a tool Airlock runs itself, a 409 `not_a_client_tool`.
    `read`: the rows `call_read_ahead`'s statement read, for the first attempt.
    """
    if not isinstance(ok, bool):
        raise ActionError("invalid_result", "ok must be true or false")
    output = sanitize.clean(output)
    # No lock: the commit is conditional on the run's version, so a report that meets
    # another move of the run (a second report of the call, the deadline) reads again.
    for attempt in range(REPORT_ATTEMPTS):
        if attempt == 0 and read is not None:
            run = _judged(run_id, user, read, answer=False)
        else:
            run = _locked(run_id, user, lock=False, key=key)
        call = _call(run, key)
        if not call.client:
            raise ActionError("not_a_client_tool", f"{call.tool} is run by Airlock, which records its result",
                              status=409)
        state = store.load(run)
        current = state.current_call or {}
        if state.state != states.ACTING or current.get("id") != call.call_id:
            answer = _answer(call, run)
            if answer.status in (SUCCEEDED, FAILED):
                return answer  # reported before: the first report stands
            raise ActionError("not_approved", answer.to_dict(), status=409)
        if ok:
            outcome = ToolOutcome(ok=True, value=output)
        else:
            detail = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)
            outcome = ToolOutcome(ok=False, error="client_error", detail=detail[:2000])
        # The client tool's own spec (its `returns` taints); no registry needed.
        spec = next((c for c in run.profile.client_specs() if c.name == call.tool), None)
        after, t = report(state, spec, outcome)
        try:
            store.commit(run, state, after, t, actor=actor_name(user))
        except store.StaleRun:
            continue
        # What the commit just wrote is the call's journal entry: no need to read it back.
        written = statement.result_fields(t.journal_result) if t.journal_result is not None else None
        return _answer(call, run, journal=written)
    raise ActionError("busy", f"run {run_id} kept moving; report the result again", status=409)


def run_finish(*, run_id: int, answer: Any, user: Any, usage: Any = None) -> Run:
    """End the external run with the client's answer (`done`); the usage counts like
    a model call's. A run that already ended: 409 run_ended (a repeat of the same
    finish answers with the run as it is)."""
    run = _driven_run(run_id, user)
    if not isinstance(answer, str):
        raise ActionError("invalid_answer", "answer must be text")
    parsed_usage = parse_usage(usage)
    answer = sanitize.clean(answer)
    with transaction.atomic():
        run = _locked(run.pk, user)
        if run.state == states.DONE and run.answer == answer:
            return run
        if run.state in states.TERMINAL:
            raise _ended(run)
        state = store.load(run)
        if state.state not in (states.QUEUED, states.PLANNING) or state.pending_calls:
            raise ActionError("call_pending", _waiting_detail(run, state), status=409)
        after, _t, _row = _step_reply(run, state, user, ModelReply(final=answer, usage=parsed_usage))
    if after.state != states.DONE:
        raise _ended(run)
    return run

