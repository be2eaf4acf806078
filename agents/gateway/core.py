"""The MCP gateway's Django side: plain synchronous functions over the database, called
by the ASGI app (`app.py`) in worker threads. Who is calling, which session and run a
request belongs to, the tools a profile offers, and a tools/call as the decision API's
proposal (`agents.actions.external`): the gateway never judges a call itself.
"""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents import access
from agents.actions import external, tokens
from agents.actions.base import ActionError
from agents.actions.external import CallAnswer
from agents.actions.runs import run_launch
from agents.engine import states
from agents.engine.registry import ToolSpec
from agents.lib import rows, sanitize
from agents.lib.mcp_mapping import hints_for
from agents.models import AgentProfile, GatewaySession, GatewayStream, Run
from agents.ops.middleware import who_of
from agents.runs import driver, statement
from agents.tools import mcp as mcp_tools
from agents.tools import registry

from . import content, names


class Refused(Exception):
    """An HTTP answer before the MCP layer: status, error name, detail."""

    def __init__(
        self, status: int, error: str, detail: str, headers: dict[str, str] | None = None, who: str = "anonymous"
    ) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail, self.headers = status, error, detail, headers or {}
        self.who = who  # for the denial's log line (agents.ops.middleware.who_of)


@dataclass(frozen=True)
class Caller:
    """Who sent a request to which profile: what every MCP handler of it needs."""

    user: Any
    profile_id: int
    profile_name: str
    # The profile row as this request read it: a request's handlers need it again
    # (tools, limits) and need not read it again.
    profile: Any = None
    # The caller's stream under a conversation key, as the token's statement read it
    # beside the profile: (key, its row's run id, that run's state and updated_at),
    # for `stream_run`'s first look; None if it was not read.
    stream: tuple[str, tuple[Any, ...]] | None = None
    # The marks of the profile's MCP tools (`mcp_tools.marks_column`), as the token's
    # statement read them beside the profile, for the request's `read_once`; None if it
    # did not (`_TOOLS_GUESS`).
    marks: list[tuple[int, str]] | None = None


# Every gateway request reads these: written out (agents/lib/rows.py), they skip
# building a queryset each time, and prepared, they skip planning each time.
_OPEN_SESSION = rows.Joined(
    GatewaySession, [], "a.session_id = %s AND a.user_id = %s AND a.profile_id = %s AND a.closed_at IS NULL",
    prepared=True,
)


@functools.lru_cache(maxsize=64)
def _beside_token(marks: str = "") -> tuple[rows.Columns, str, str]:
    """What the token's statement (agents/actions/tokens.py, `token_read`) reads beside the
    token for a gateway request, in the same round trip: the external profile named by
    the path, and the caller's stream under the request's conversation key with its
    run's state (what `stream_run` looks at first); with `marks` (a
    `mcp_tools.marks_column`), that column last. Outer joins: the token alone decides
    whether there is a row, and a missing profile reads as NULLs."""
    profile = rows.Columns(AgentProfile, "p")
    beside = f", {profile.sql}, s.run_id, sr.state, sr.updated_at" + (f", {marks}" if marks else "")
    join = (
        f" LEFT JOIN {AgentProfile._meta.db_table} p ON p.name = %s AND p.provider = %s"
        f" LEFT JOIN {GatewayStream._meta.db_table} s ON s.user_id = b0.id AND s.profile_id = p.id AND s.key = %s"
        f" LEFT JOIN {Run._meta.db_table} sr ON sr.id = s.run_id"
    )
    return profile, beside, join


def authenticate(header: str | None, profile_name: str, stream_key: str | None = None) -> Caller:
    """The token's user and the external profile, or the refusal: 401 (with
    `WWW-Authenticate: Bearer`) for a missing or bad token, 404 for a profile that does
    not exist, is not external or is of a project where the caller holds no role, 403
    for a user who may not launch runs there. One statement reads the token, its user
    and roles, the profile, (for a `stream_key`) the caller's stream under it and (for
    the profile's tool list as this process last saw it) its MCP tools' marks."""
    challenge = {"WWW-Authenticate": 'Bearer realm="airlock"'}
    if not header:
        raise Refused(401, "unauthenticated", "send 'Authorization: Bearer <API token>'", challenge)
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise Refused(401, "unauthenticated", "the Authorization header must be 'Bearer <token>'", challenge)
    guess = _TOOLS_GUESS.get(profile_name, _NO_GUESS)
    marks = mcp_tools.marks_column(guess) if guess is not _NO_GUESS else None
    columns, beside, join = _beside_token(marks[0] if marks is not None else "")
    user, found = tokens.token_read(raw.strip(), beside, join,
                                    [*(marks[1] if marks is not None else ()), profile_name, "external", stream_key])
    if user is None:
        # Never log or echo the token itself.
        raise Refused(401, "unauthenticated", "unknown or revoked API token",
                      {"WWW-Authenticate": 'Bearer realm="airlock", error="invalid_token"'})
    profile = columns.instance(found[0]) if found[0][0] is not None else None
    if profile is None or not access.is_member(user, profile.project_id):
        # Another project's profile is answered exactly like one that does not exist.
        raise Refused(404, "not_found", f"no external agent profile {profile_name!r}")
    if not access.can_launch(user, profile.project_id):
        raise Refused(403, "forbidden", "driving an agent through the gateway needs the launcher role",
                      who=who_of(user))
    stream = (stream_key, found[0][columns.width:columns.width + 3]) if stream_key is not None else None
    tools = profile.tool_names()
    read = mcp_tools.marks_read(found[0][-1]) if marks is not None and tools == guess else None
    if len(_TOOLS_GUESS) >= _GUESSES_KEPT:
        _TOOLS_GUESS.clear()
    _TOOLS_GUESS[profile_name] = tools
    return Caller(user=user, profile_id=profile.pk, profile_name=profile.name, profile=profile, stream=stream,
                  marks=read)


# Each profile's tool names as this process last read them: what its next request's
# token statement reads the MCP tools' marks for (`mcp_tools.marks_column`), beside the
# profile whose tools they are. A profile whose tools changed since reads its marks on
# its own (`read_once`), as every profile's first request does.
_TOOLS_GUESS: dict[str, list[str] | None] = {}
_NO_GUESS: Any = object()
_GUESSES_KEPT = 512


# -- sessions and streams ----------------------------------------------------------------

# The limits a stream's run gets for the keys its profile's own `limits` leave unset:
# sized for a client that stays connected for a working day (docs/gateway.md, "Streams").
STREAM_LIMITS = {"max_steps": 2000, "deadline_seconds": 10 * 3600, "max_identical_calls": 100}
# Where a client may name its conversation (a stream of its own under one token): this
# header, or this key of a tools/call's `_meta`.
CONVERSATION_HEADER = "airlock-conversation"
CONVERSATION_META = "airlock/conversation"
KEY_MAX = 200


@dataclass(frozen=True)
class Admitted:
    """A request's caller and where its calls go: the session (handshake era; `sid` and
    `session_pk`, 0 for none), the run `Airlock-Run` pinned (None: the stream's) and
    the stream's conversation key; when the request arrived (a retry that arrived
    before its call's outcome was delivered is answered with it: `call_start`)."""

    caller: Caller
    sid: str | None = None
    session_pk: int = 0
    pinned: int | None = None
    key: str = ""
    arrived: datetime = field(kw_only=True)  # `admit` says when (now if the front did not)


def conversation_key(header: str | None, meta: Any = None, session_key: str = "") -> str:
    """The stream's conversation key: the `Airlock-Conversation` header, else the call's
    `_meta["airlock/conversation"]`, else the one the session was opened with; '' for
    none. At most KEY_MAX characters, NUL-free (400 otherwise)."""
    value = header
    if value is None and isinstance(meta, dict) and meta.get(CONVERSATION_META) is not None:
        value = meta[CONVERSATION_META]
        if not isinstance(value, str):
            raise Refused(400, "invalid_conversation", f"_meta[{CONVERSATION_META!r}] must be text")
    if value is None:
        return session_key
    value = value.strip()
    if len(value) > KEY_MAX or "\x00" in value:
        raise Refused(400, "invalid_conversation", f"a conversation key is at most {KEY_MAX} characters, no NUL")
    return value


def admit(
    header: str | None, profile_name: str, *, sid: str | None, run_header: str | None, opening: bool,
    client_name: str, protocol_version: str, modern: bool = False, conversation: str | None = None,
    meta: Any = None, arrived: datetime | None = None,
) -> Admitted:
    """A POST's caller and where its calls go, checked in this order: the token and
    profile (401, 404); then, in the handshake era, the session (400 without one, 404
    for one that is not the caller's; `initialize` opens one); then `Airlock-Run` (a run
    of the caller's, of this profile). The 2026-07-28 era has no session: each request
    names its caller alone. `arrived`: when the front took the request (now if None)."""
    caller = authenticate(header, profile_name, stream_key=_key_guess(conversation, meta))
    arrived = arrived or timezone.now()
    if modern:
        pinned = _run_from_header(caller, run_header) if run_header is not None else None
        return Admitted(caller, pinned=pinned, key=conversation_key(conversation, meta), arrived=arrived)
    if opening:
        if sid:
            raise Refused(400, "session_exists", "initialize opens a session: send it without Mcp-Session-Id")
        pinned = _run_from_header(caller, run_header, opening=True) if run_header is not None else None
        key = conversation_key(conversation)
        return Admitted(caller, session_open(caller, client_name=client_name, protocol_version=protocol_version,
                                             pinned=pinned, key=key), pinned=pinned, key=key, arrived=arrived)
    if not sid:
        raise Refused(400, "missing_session", "Bad Request: Missing session ID (initialize first)")
    session_pk, pinned, session_key = session_find(caller, sid)
    if run_header is not None and str(pinned) != run_header.strip():
        if pinned is not None:
            raise Refused(409, "run_mismatch", f"this session drives run {pinned}, not {run_header!r}")
        pinned = _run_from_header(caller, run_header)
    return Admitted(caller, sid, session_pk, pinned, conversation_key(conversation, meta, session_key),
                    arrived=arrived)


def _key_guess(header: str | None, meta: Any) -> str | None:
    # The stream's key as the request names it, for reading the stream beside the token;
    # a key the request gets wrong is refused later, after the token (as before).
    try:
        return conversation_key(header, meta)
    except Refused:
        return None


def admit_and_start(
    header: str | None, profile_name: str, *, sid: str | None, run_header: str | None, tool: str, args: Any,
    modern: bool = False, conversation: str | None = None, meta: Any = None,
    check: Callable[[Admitted], bool] | None = None, arrived: datetime | None = None,
) -> tuple[Admitted, tuple[CallAnswer, int] | Reply | None]:
    """`admit` a tools/call's request and `call_start` its call, in one trip to the
    database threads (app.py: for a tools/call the SDK will take as it stands). A
    `check` the admitted request fails (what the SDK would refuse once the caller is
    known) starts nothing: None, and the SDK answers it."""
    admitted = admit(header, profile_name, sid=sid, run_header=run_header, opening=False, client_name="",
                     protocol_version="", modern=modern, conversation=conversation, meta=meta, arrived=arrived)
    if check is not None and not check(admitted):
        return admitted, None
    return admitted, call_start(admitted, tool, args)


def session_open(
    caller: Caller, *, client_name: str, protocol_version: str, pinned: int | None = None, key: str = ""
) -> str:
    """A new session's id (the `Mcp-Session-Id` the initialize answer carries). Its
    calls go to the caller's stream under `key`, or to the run `Airlock-Run` pinned."""
    session = GatewaySession.objects.create(
        session_id=secrets.token_hex(32), profile_id=caller.profile_id, user=caller.user, run_id=pinned,
        # The client's words, cleaned as arguments are (a NUL was a 503, and that client
        # could never connect).
        client_name=sanitize.clean(client_name[:200]), protocol_version=sanitize.clean(protocol_version[:20]),
        stream_key=key,
    )
    return session.session_id


def _run_from_header(caller: Caller, value: str, *, opening: bool = False) -> int:
    """The run `Airlock-Run` names: the caller's own, of this profile (else 404, as for
    any run that is not theirs). One that ended is refused when a session would open on
    it (409); a call to it is answered `run_ended` as a tool result."""
    missing = Refused(404, "not_found", f"Airlock-Run: no run {value!r} of yours of {caller.profile_name} to continue")
    if not value.strip().isdigit():
        raise Refused(400, "invalid_run", "Airlock-Run must be a run id")
    run = Run.objects.filter(pk=int(value), profile_id=caller.profile_id).first()
    if run is None or not access.can_drive(caller.user, run):
        raise missing
    if opening and run.state in states.TERMINAL:
        raise Refused(409, "run_ended", f"run {run.pk} ended ({run.state}); send calls without Airlock-Run to "
                      "continue in your stream")
    return run.pk


def session_find(caller: Caller, session_id: str) -> tuple[int, int | None, str]:
    """The session's row id, the run it pinned (None: its stream's) and its stream's
    key; 404 for a session that is not this caller's (another user's, another
    profile's, closed or unknown: the MCP client starts a new one)."""
    found = _OPEN_SESSION.fetch([session_id[:64], caller.user.pk, caller.profile_id])
    if not found:
        raise Refused(404, "session_not_found", "no such MCP session; initialize a new one")
    session = found[0]
    return session.pk, session.run_id, session.stream_key


def session_close(caller: Caller, session_id: str) -> None:
    """The client ended its session (DELETE). Its calls' runs are the stream's, which
    other connections of the caller may be using: they go on (and end by their budget,
    deadline or idle time)."""
    closed = GatewaySession.objects.filter(
        session_id=session_id[:64], user=caller.user, profile_id=caller.profile_id, closed_at__isnull=True
    ).update(closed_at=timezone.now())
    if not closed:
        raise Refused(404, "session_not_found", "no such MCP session")


# The stream's current run, its state and when it last moved: every call reads it.
_STREAM_RUN = (
    "SELECT s.run_id, r.state, r.updated_at FROM agents_gatewaystream s LEFT JOIN agents_run r ON r.id = s.run_id"
    " WHERE s.user_id = %s AND s.profile_id = %s AND s.key = %s"
)


def _live(state: str | None, updated_at: Any) -> bool:
    """A stream's run that takes its next call: not ended, and not resting idle past
    AIRLOCK_GATEWAY_IDLE_SECONDS (a run with a call in hand is never idle)."""
    if state is None or state in states.TERMINAL:
        return False
    idle = settings.AIRLOCK_GATEWAY_IDLE_SECONDS
    resting = state in (states.QUEUED, states.PLANNING)
    return not (resting and idle and (timezone.now() - updated_at).total_seconds() > idle)


def stream_run(caller: Caller, key: str = "", client_name: str = "", *, fresh: bool = False) -> int:
    """The run of the caller's stream under `key` that takes its next call: the
    stream's current one while it lives (one read: the one the token's statement made
    beside it, unless `fresh`), else a new run continuing it."""
    seen = caller.stream[1] if caller.stream is not None and caller.stream[0] == key and not fresh else None
    found = [seen] if seen is not None else rows.fetch(_STREAM_RUN, [caller.user.pk, caller.profile_id, key],
                                                       prepared=True)
    if found and found[0][0] is not None and _live(found[0][1], found[0][2]):
        return int(found[0][0])
    return _stream_next(caller, key, client_name)


def _stream_next(caller: Caller, key: str, client_name: str) -> int:
    """Under the stream's row lock (two calls racing on a new or ended stream launch one
    run): the current run if another call just launched it, else a new one that
    continues the last, with its taint (`actions.carried_taint`). A run that went
    idle is finished first, unless a call waits in it (then it goes on)."""
    with transaction.atomic():
        stream, _ = GatewayStream.objects.get_or_create(
            user=caller.user, profile_id=caller.profile_id, key=key, defaults={"client_name": client_name[:200]}
        )
        stream = GatewayStream.objects.select_for_update().get(pk=stream.pk)
        previous = Run.objects.filter(pk=stream.run_id).first() if stream.run_id else None
        if previous is not None and _live(previous.state, previous.updated_at):
            return previous.pk
        if previous is not None and previous.state not in states.TERMINAL:
            try:
                previous = external.run_finish(
                    run_id=previous.pk, user=caller.user,
                    answer="The gateway stream was idle; its next call continues in a new run.",
                )
            except ActionError:
                return previous.pk  # a call waits in it: the stream goes on there
        name = stream.client_name or client_name or "an MCP client"
        what = f"continues run {previous.pk}" if previous is not None else "its first run"
        run = run_launch(
            agent=caller.profile or AgentProfile.objects.get(pk=caller.profile_id),
            task=f"MCP calls of {name} through the gateway ({what})",
            user=caller.user, by_launcher=True, continues=previous, limit_defaults=STREAM_LIMITS,
        )
        stream.run = run
        stream.save(update_fields=["run"])
        return run.pk


# -- tools ------------------------------------------------------------------------------


def offered(profile: AgentProfile) -> list[ToolSpec]:
    """The tools the gateway offers for `profile`: its registered tools (built-in, and
    MCP tools whose pinned definition is active), not its client tools (those are for
    the decision API: an MCP client has no way to report their results) nor the ones it
    denies, in the profile's order. Only the profile's MCP tools are read."""
    tools = profile.tool_names()
    reg = registry(tools)
    names = reg.expand(tools) if tools else reg.names()
    denied = set(profile.denied_tools or ())
    return [spec for n in names or () if n not in denied and (spec := reg.get(n)) is not None]


def tool_list(caller: Caller) -> list[dict[str, Any]]:
    """tools/list: each offered tool's name, description and input schema as pinned,
    and its annotations as Airlock applies them: the server's own (a title, say) with
    the four hints set to the kind Airlock enforces, overrides included."""
    profile = caller.profile or AgentProfile.objects.get(pk=caller.profile_id)
    with mcp_tools.read_once(profile.tool_names(), marks=caller.marks):
        specs = offered(profile)
    pinned = {t.name: t for t in mcp_tools.offered_tools([s.name for s in specs])}
    listed = []
    for spec in specs:
        annotations = dict(pinned[spec.name].annotations or {}) if spec.name in pinned else {}
        annotations.update(hints_for(spec.risk, spec.returns, spec.retry_safety))
        upstream = pinned[spec.name].mcp_name if spec.name in pinned else None
        listed.append({
            "name": names.listed(profile, spec.name, upstream), "description": spec.description,
            "inputSchema": spec.schema, "annotations": annotations,
        })
    return listed


# -- calls ------------------------------------------------------------------------------


@dataclass
class Reply:
    """A tools/call answer: text for the model, whether it is an error, and the
    structured content (`{"airlock": {...}}`) when Airlock has something to say."""

    text: str
    is_error: bool = False
    structured: dict[str, Any] | None = None
    # The upstream's own content blocks, passed through instead of `text` (content.py).
    content: list[dict[str, Any]] | None = None


def call_start(admitted: Admitted, tool: str, args: Any) -> tuple[CallAnswer, int] | Reply:
    """Propose the call in its stream's run (or the pinned one); the answer to wait
    on, or the reply now. A stream whose run ended (its budget, its deadline) takes
    the call in the run that continues it: a client is never told to start over.

    A tool the gateway does not offer is refused before anything is proposed: the
    client learns nothing of tools outside its list, and no upstream is reached.
    The offered-tools check, the policy and the drive read the MCP tools once, and
    only the profile's: a call costs the same however many tools other servers have.
    An identical call whose outcome was delivered before this request arrived leaves
    this one a new intent; one delivered since is what this retry gets."""
    caller, pinned = admitted.caller, admitted.pinned
    profile = caller.profile or AgentProfile.objects.get(pk=caller.profile_id)
    run_id = pinned
    asked, governed = tool, names.governed(profile, tool)  # None: a name its server has no tool of
    with mcp_tools.read_once(profile.tool_names(), marks=caller.marks):
        spec = next((s for s in offered(profile) if s.name == governed), None) if governed is not None else None
        if spec is None:
            return Reply(f"Unknown tool {asked!r}: this gateway offers only the tools in its tools/list.",
                         is_error=True, structured={"airlock": {"status": "unknown_tool", "tool": asked}})
        for attempt in (1, 2):
            try:
                if pinned is None:
                    # A second attempt follows the stream's run ending: read it afresh.
                    run_id = stream_run(caller, admitted.key, fresh=attempt > 1)
                with _delivering(spec) as marked:
                    answer = external.call_propose(run_id=run_id, tool=governed, args=args, user=caller.user,
                                                   once=admitted.arrived)
                break
            except ActionError as exc:
                if exc.code == "run_ended" and pinned is None and attempt == 1 and not _stopped_looping(exc):
                    continue  # the stream's run ended: its next run takes the call
                return _refusal(exc, run_id, pinned=pinned is not None)
        assert run_id is not None
        if answer.status == external.RUNNING:
            answer = call_progress(caller, run_id, answer)
        elif answer.key not in marked:
            delivered(answer, run_id)
    return answer, run_id


def _delivering(spec: ToolSpec) -> AbstractContextManager[set[str]]:
    """The delivery mark of a call the gateway answers at once, written by its result's
    commit (agents/runs/statement.py, `delivering`) for a retry-safe tool only: a
    process that dies between that commit and the answer leaves a retry that runs
    again, which such a tool allows (a read reads again, as any later identical read
    does). An unsafe tool's mark stays a commit of its own after the result's, so such
    a retry is answered from the journal, never run twice."""
    return statement.delivering() if spec.retry_safety == "safe" else nullcontext(set())


def call_resume(caller: Caller, run_id: int, key: str) -> tuple[CallAnswer, int] | Reply:
    """A held call's next round (2026-07-28: its `requestState` names it): the call as
    it stands, run now if it was approved (`call_progress`)."""
    try:
        answer = external.call_status(run_id=run_id, key=key, user=caller.user)
    except ActionError as exc:
        return _refusal(exc, run_id)
    if answer.status == external.RUNNING:
        answer = call_progress(caller, run_id, answer)
    else:
        delivered(answer, run_id)
    return answer, run_id


def _stopped_looping(exc: ActionError) -> bool:
    # The run ended on the repeated-call cap: the call that met it is told (the loop
    # shows), and only the stream's next call continues in a new run.
    detail = exc.detail if isinstance(exc.detail, dict) else {}
    return str(detail.get("error") or "").startswith("repeated identical call")


def delivered(answer: CallAnswer, run_id: int) -> None:
    """An outcome the gateway answers is the caller's, once: its next identical call
    is a new intent (reads run again, a write is policed again)."""
    if answer.status in external.FINISHED:
        external.call_delivered(run_id=run_id, key=answer.key)


def call_progress(caller: Caller, run_id: int, answer: CallAnswer) -> CallAnswer:
    """The call as it stands now. A call of a tool Airlock runs whose run is in `acting`
    with nobody's live lease on it (approved a moment ago, or proposed and allowed) is
    run here and now, under the run's lease and journal, instead of waiting for a
    worker: the journal's key keeps it to one execution whoever gets there first. The
    run's row says so in one read, so a woken call reads its own status once, after."""
    if not answer.client:
        run = Run.objects.only("state", "lease_owner", "lease_expires").get(pk=run_id)
        # Nobody's lease, or a lease whose holder stopped renewing it (a web process
        # killed mid-call): the driver takes it and resumes as a worker would, so an
        # interrupted unsafe call becomes "outcome unknown", never a blind second call.
        # One call at a time per run: the run's call in `acting` is this one, and it
        # runs only as the reviewer (or policy) let it; the driver's lease is a
        # conditional update, so of two gateways (or a worker) one drives.
        lapsed = run.lease_expires is not None and run.lease_expires < timezone.now()
        if run.state == states.ACTING and (run.lease_owner is None or lapsed):
            profile = caller.profile or AgentProfile.objects.get(pk=caller.profile_id)
            # A tool the profile no longer offers (changed while the call waited) is
            # outside the scope: the drive reads it on its own, as before.
            with mcp_tools.read_once(profile.tool_names()):
                driver.drive(run_id)
    answer = external.call_status(run_id=run_id, key=answer.key, user=caller.user)
    delivered(answer, run_id)
    driver.release_connection()
    return answer


def run_versions(run_ids: list[int]) -> dict[int, int]:
    """Each run's version: what the gateway's waiting calls watch (one query for all)."""
    return dict(Run.objects.filter(pk__in=run_ids).values_list("pk", "version"))


def waiting(answer: CallAnswer) -> bool:
    return answer.status in external.WAITING


def _refusal(exc: ActionError, run_id: int | None, *, pinned: bool = False) -> Reply:
    detail = exc.detail
    if exc.code == "call_pending":
        waiting_call = detail.get("call") if isinstance(detail, dict) else None
        what = f"{waiting_call['tool']} {json.dumps(waiting_call['args'], sort_keys=True)}" if waiting_call else "another call"
        return Reply(
            f"Not run: this stream's run already has a call waiting ({what}), and Airlock takes one call at "
            "a time per run. Call that same tool again with the same arguments to get its outcome, then retry "
            "this one.",
            is_error=True,
            structured={"airlock": {"status": "busy", "run_id": run_id, "waiting": _airlock(waiting_call, run_id)
                                    if waiting_call else None}},
        )
    if exc.code == "run_ended":
        state = detail.get("state") if isinstance(detail, dict) else ""
        error = (detail.get("error") if isinstance(detail, dict) else "") or state
        if pinned:
            text = (f"Not run: run {run_id}, named by Airlock-Run, has ended ({error}). Send calls without "
                    "Airlock-Run to continue in your stream.")
        else:
            text = f"Not run: Airlock ended this stream's run {run_id}: {error}. Your next call continues in a new run."
        return Reply(text, is_error=True,
                     structured={"airlock": {"status": "run_ended", "run_id": run_id, "state": state}})
    text = detail if isinstance(detail, str) else json.dumps(detail, default=str)
    return Reply(f"Not run: {exc.code}: {text}", is_error=True,
                 structured={"airlock": {"status": exc.code, "run_id": run_id}})


def _airlock(call: dict[str, Any], run_id: int) -> dict[str, Any]:
    approval = call.get("approval") or {}
    found: dict[str, Any] = {"status": call["status"], "run_id": run_id, "key": call["key"], "tool": call["tool"]}
    if approval:
        found["approval_id"] = approval["id"]
        found["url"] = f"{settings.AIRLOCK_BASE_URL}/reviews/{approval['id']}/"
    return found


def reply(answer: CallAnswer, run_id: int) -> Reply:
    """What the model reads for the call's status. Only a success is not an error; a
    call still waiting says so, and how to learn its outcome."""
    data = answer.to_dict()
    status = answer.status
    if status == external.SUCCEEDED:
        text = _text(_unwrapped(answer.result))
        kept = content.sent(answer.result)
        if answer.edited:
            note = f" Reviewer's note: {answer.note}" if answer.note else ""
            said = (f"[Airlock: a reviewer edited the arguments before approving; what ran: "
                    f"{json.dumps(answer.args, sort_keys=True, ensure_ascii=False)}.{note}]")
            airlock = {"airlock": {**_airlock(data, run_id), "edited": True, "args": answer.args}}
            return Reply(f"{said}\n{text}", structured=content.structured(kept, airlock),
                         content=content.blocks(kept, said))
        return Reply(text, structured=content.structured(kept), content=content.blocks(kept))
    airlock = _airlock(data, run_id)
    if status == external.PENDING:
        approval = answer.approval or {}
        reason = approval.get("reason") or answer.reason
        return Reply(
            f"Airlock is holding this call for a human reviewer (approval {airlock.get('approval_id')}, run "
            f"{run_id}): {reason}. It has not run yet. Call this same tool again with exactly the same "
            "arguments to get its outcome: its result once approved, or the reviewer's note if rejected. "
            f"Review: {airlock.get('url', '')}",
            structured={"airlock": {**airlock, "status": "pending_approval"}},
        )
    if status == external.RUNNING:
        return Reply("Approved; Airlock is running this call now. Call this same tool again with the same "
                     "arguments to get its result.", structured={"airlock": airlock})
    if status == external.REJECTED:
        note = answer.note or "no note"
        return Reply(f"A reviewer rejected this call; it did not run. Reviewer's note: {note}", is_error=True,
                     structured={"airlock": {**airlock, "note": answer.note}})
    if status == external.DENIED:
        return Reply(f"Airlock's policy denied this call; it did not run: {answer.reason}", is_error=True,
                     structured={"airlock": {**airlock, "reason": answer.reason}})
    if status == external.EXPIRED:
        return Reply("Nobody decided this call in time (or its run ended); it did not run.", is_error=True,
                     structured={"airlock": airlock})
    # failed: the tool ran and failed; `result` says how.
    failed = answer.result if isinstance(answer.result, dict) else {}
    detail = _text(failed.get("detail") or failed.get("error") or answer.result)
    return Reply(f"The tool failed: {detail}", is_error=True,
                 structured={"airlock": {**airlock, "error": failed.get("error")}})


def _unwrapped(result: Any) -> Any:
    # The journal keeps a tool's outcome as {"ok": true, "result": ...}.
    if isinstance(result, dict) and result.get("ok") is True and "result" in result:
        return result["result"]
    return result


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
