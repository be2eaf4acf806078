"""The MCP gateway's Django side: plain synchronous functions over the database, called
by the ASGI app (`app.py`) in worker threads. Who is calling, which session and run a
request belongs to, the tools a profile offers, and a tools/call as the decision API's
proposal (`agents.external`): the gateway never judges a call itself.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents import access, external, tokens
from agents.actions import ActionError, run_launch
from agents.engine import states
from agents.engine.registry import ToolSpec
from agents.external import CallAnswer
from agents.models import AgentProfile, GatewaySession, Run
from agents.ops.middleware import who_of
from agents.runs import driver, rows, sanitize
from agents.tools import mcp as mcp_tools
from agents.tools import registry
from agents.tools.mcp.mapping import hints_for


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


# Every gateway request reads these: written out (agents/runs/rows.py), they skip
# building a queryset each time, and prepared, they skip planning each time.
_EXTERNAL_PROFILE = rows.Joined(AgentProfile, [], "a.name = %s AND a.provider = %s", prepared=True)
_OPEN_SESSION = rows.Joined(
    GatewaySession, [], "a.session_id = %s AND a.user_id = %s AND a.profile_id = %s AND a.closed_at IS NULL",
    prepared=True,
)


def authenticate(header: str | None, profile_name: str) -> Caller:
    """The token's user and the external profile, or the refusal: 401 (with
    `WWW-Authenticate: Bearer`) for a missing or bad token, 404 for a profile that does
    not exist, is not external or is of a project where the caller holds no role, 403
    for a user who may not launch runs there."""
    challenge = {"WWW-Authenticate": 'Bearer realm="airlock"'}
    if not header:
        raise Refused(401, "unauthenticated", "send 'Authorization: Bearer <API token>'", challenge)
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise Refused(401, "unauthenticated", "the Authorization header must be 'Bearer <token>'", challenge)
    user = tokens.token_user(raw.strip())
    if user is None:
        # Never log or echo the token itself.
        raise Refused(401, "unauthenticated", "unknown or revoked API token",
                      {"WWW-Authenticate": 'Bearer realm="airlock", error="invalid_token"'})
    found = _EXTERNAL_PROFILE.fetch([profile_name, "external"])
    profile = found[0] if found else None
    if profile is None or not access.is_member(user, profile.project_id):
        # Another project's profile is answered exactly like one that does not exist.
        raise Refused(404, "not_found", f"no external agent profile {profile_name!r}")
    if not access.can_launch(user, profile.project_id):
        raise Refused(403, "forbidden", "driving an agent through the gateway needs the launcher role",
                      who=who_of(user))
    return Caller(user=user, profile_id=profile.pk, profile_name=profile.name, profile=profile)


# -- sessions ---------------------------------------------------------------------------


def admit(
    header: str | None, profile_name: str, *, sid: str | None, run_header: str | None, opening: bool,
    client_name: str, protocol_version: str,
) -> tuple[Caller, str, int, int | None]:
    """A POST's caller, session id, session row (0 for `initialize`, which opens the
    session) and the session's run (None before its first call), checked in this
    order: the token and profile (401, 404), then the session (400 without one, 404
    for one that is not the caller's)."""
    caller = authenticate(header, profile_name)
    if opening:
        if sid:
            raise Refused(400, "session_exists", "initialize opens a session: send it without Mcp-Session-Id")
        return caller, session_open(caller, client_name=client_name, protocol_version=protocol_version,
                                    run_header=run_header), 0, None
    if not sid:
        raise Refused(400, "missing_session", "Bad Request: Missing session ID (initialize first)")
    return caller, sid, *session_find(caller, sid, run_header)


def admit_and_start(
    header: str | None, profile_name: str, *, sid: str | None, run_header: str | None, tool: str, args: Any,
) -> tuple[Caller, str, int, int | None, tuple[CallAnswer, int] | Reply]:
    """`admit` a tools/call's request and `call_start` its call, in one trip to the
    database threads (app.py: for a tools/call the SDK will take as it stands)."""
    caller, sid, session_pk, run_id = admit(header, profile_name, sid=sid, run_header=run_header, opening=False,
                                            client_name="", protocol_version="")
    return caller, sid, session_pk, run_id, call_start(caller, session_pk, tool, args, run_id)


def session_open(caller: Caller, *, client_name: str, protocol_version: str, run_header: str | None) -> str:
    """A new session's id (the `Mcp-Session-Id` the initialize answer carries). With
    `Airlock-Run`, the session continues that run: the caller's own, of this profile,
    not ended (else 404, as for any run that is not theirs)."""
    run_id = _run_from_header(caller, run_header) if run_header is not None else None
    session = GatewaySession.objects.create(
        session_id=secrets.token_hex(32), profile_id=caller.profile_id, user=caller.user, run_id=run_id,
        # The client's words, cleaned as arguments are (a NUL was a 503, and that client
        # could never connect).
        client_name=sanitize.clean(client_name[:200]), protocol_version=sanitize.clean(protocol_version[:20]),
    )
    return session.session_id


def _run_from_header(caller: Caller, value: str) -> int:
    missing = Refused(404, "not_found", f"Airlock-Run: no run {value!r} of yours of {caller.profile_name} to continue")
    if not value.strip().isdigit():
        raise Refused(400, "invalid_run", "Airlock-Run must be a run id")
    run = Run.objects.filter(pk=int(value), profile_id=caller.profile_id).first()
    if run is None or not access.can_drive(caller.user, run):
        raise missing
    if run.state in states.TERMINAL:
        raise Refused(409, "run_ended", f"run {run.pk} ended ({run.state}); start a new session without Airlock-Run")
    return run.pk


def session_find(caller: Caller, session_id: str, run_header: str | None) -> tuple[int, int | None]:
    """The session's row id and its run (None until its first call); 404 for a session that is not this caller's (another
    user's, another profile's, closed or unknown: the MCP client starts a new one)."""
    found = _OPEN_SESSION.fetch([session_id[:64], caller.user.pk, caller.profile_id])
    if not found:
        raise Refused(404, "session_not_found", "no such MCP session; initialize a new one")
    session = found[0]
    if run_header is not None and str(session.run_id) != run_header.strip():
        raise Refused(409, "run_mismatch", f"this session drives run {session.run_id}, not {run_header!r}")
    return session.pk, session.run_id


def session_close(caller: Caller, session_id: str) -> None:
    """The client ended its session (DELETE): the run the session launched, if resting
    between calls, is finished as done; one with a call still waiting is left to its
    reviewer and its deadline, and a run continued with `Airlock-Run` to its client."""
    session = GatewaySession.objects.filter(
        session_id=session_id[:64], user=caller.user, profile_id=caller.profile_id, closed_at__isnull=True
    ).first()
    if session is None:
        raise Refused(404, "session_not_found", "no such MCP session")
    # Conditional: of two DELETEs racing, one closes; the other finds it closed (fine).
    GatewaySession.objects.filter(pk=session.pk, closed_at__isnull=True).update(closed_at=timezone.now())
    if session.run_id is not None and session.launched_run:
        try:
            external.run_finish(run_id=session.run_id, answer="The MCP client closed its session.", user=caller.user)
        except ActionError:
            pass  # ended already, or a call still waits: nothing to finish now


def session_run(caller: Caller, session_pk: int, client_name: str = "") -> int:
    """The run of the session, launched by its first call. Under the session's row lock,
    so two calls racing on a new session launch one run."""
    with transaction.atomic():
        session = GatewaySession.objects.select_for_update().get(pk=session_pk)
        if session.run_id is None:
            # The session's user launches it, as through the API: the launcher of record.
            run = run_launch(
                agent=caller.profile or AgentProfile.objects.get(pk=caller.profile_id),
                task=f"MCP session of {session.client_name or 'an MCP client'} through the gateway",
                user=caller.user,
                by_launcher=True,
            )
            session.run, session.launched_run = run, True
            session.save(update_fields=["run", "launched_run"])
        return int(session.run_id)  # type: ignore[arg-type]


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
    specs = offered(caller.profile or AgentProfile.objects.get(pk=caller.profile_id))
    pinned = {t.name: t for t in mcp_tools.offered_tools([s.name for s in specs])}
    listed = []
    for spec in specs:
        annotations = dict(pinned[spec.name].annotations or {}) if spec.name in pinned else {}
        annotations.update(hints_for(spec.risk, spec.returns, spec.retry_safety))
        listed.append({
            "name": spec.name, "description": spec.description, "inputSchema": spec.schema,
            "annotations": annotations,
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


def call_start(
    caller: Caller, session_pk: int, tool: str, args: Any, run_id: int | None = None
) -> tuple[CallAnswer, int] | Reply:
    """Propose the call in the session's run; the answer to wait on, or the reply now.
    `run_id`: the session's run as the request's front read it (a session's run never
    changes once set), so only a session's first call takes the session's lock.

    A tool the gateway does not offer is refused before anything is proposed: the
    client learns nothing of tools outside its list, and no upstream is reached.
    The offered-tools check, the policy and the drive read the MCP tools once, and
    only the profile's: a call costs the same however many tools other servers have."""
    profile = caller.profile or AgentProfile.objects.get(pk=caller.profile_id)
    with mcp_tools.read_once(profile.tool_names()):
        if tool not in {s.name for s in offered(profile)}:
            return Reply(f"Unknown tool {tool!r}: this gateway offers only the tools in its tools/list.",
                         is_error=True, structured={"airlock": {"status": "unknown_tool", "tool": tool}})
        try:
            if run_id is None:
                run_id = session_run(caller, session_pk)
            answer = external.call_propose(run_id=run_id, tool=tool, args=args, user=caller.user)
        except ActionError as exc:
            return _refusal(exc, run_id)
        if answer.status == external.RUNNING:
            answer = call_progress(caller, run_id, answer)
    return answer, run_id


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
        # runs only as the reviewer (or policy) let it; the driver's claim is a
        # conditional update, so of two gateways (or a worker) one drives.
        lapsed = run.lease_expires is not None and run.lease_expires < timezone.now()
        if run.state == states.ACTING and (run.lease_owner is None or lapsed):
            profile = caller.profile or AgentProfile.objects.get(pk=caller.profile_id)
            # A tool the profile no longer offers (changed while the call waited) is
            # outside the scope: the drive reads it on its own, as before.
            with mcp_tools.read_once(profile.tool_names()):
                driver.drive(run_id)
    answer = external.call_status(run_id=run_id, key=answer.key, user=caller.user)
    driver.release_connection()
    return answer


def run_versions(run_ids: list[int]) -> dict[int, int]:
    """Each run's version: what the gateway's waiting calls watch (one query for all)."""
    return dict(Run.objects.filter(pk__in=run_ids).values_list("pk", "version"))


def waiting(answer: CallAnswer) -> bool:
    return answer.status in external.WAITING


def _refusal(exc: ActionError, run_id: int | None) -> Reply:
    detail = exc.detail
    if exc.code == "call_pending":
        waiting_call = detail.get("call") if isinstance(detail, dict) else None
        what = f"{waiting_call['tool']} {json.dumps(waiting_call['args'], sort_keys=True)}" if waiting_call else "another call"
        return Reply(
            f"Not run: this session's run already has a call waiting ({what}), and Airlock takes one call at "
            "a time per run. Call that same tool again with the same arguments to get its outcome, then retry "
            "this one.",
            is_error=True,
            structured={"airlock": {"status": "busy", "run_id": run_id, "waiting": _airlock(waiting_call, run_id)
                                    if waiting_call else None}},
        )
    if exc.code == "run_ended":
        state = detail.get("state") if isinstance(detail, dict) else ""
        return Reply(f"Not run: this session's run {run_id} has ended ({state}). Start a new MCP session.",
                     is_error=True, structured={"airlock": {"status": "run_ended", "run_id": run_id, "state": state}})
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
        if answer.edited:
            note = f" Reviewer's note: {answer.note}" if answer.note else ""
            text = (f"[Airlock: a reviewer edited the arguments before approving; what ran: "
                    f"{json.dumps(answer.args, sort_keys=True, ensure_ascii=False)}.{note}]\n{text}")
            return Reply(text, structured={"airlock": {**_airlock(data, run_id), "edited": True,
                                                       "args": answer.args}})
        return Reply(text)
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
