"""The decision API over HTTP: start a run of an external profile, propose each tool
call, wait for its decision, report a client tool's result, finish the run.

Every method is one request (`wait` a few long polls of at most 30 s each); none keeps
state between calls, so a client may restart and carry on with the run's id and a
call's key."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from .errors import Denied, Expired, Refused, Rejected, StillPending, Unavailable

Status = Literal["pending", "approved", "running", "succeeded", "failed", "rejected", "expired", "denied"]
#: Statuses after which nothing more happens to the call.
FINAL: frozenset[str] = frozenset({"succeeded", "failed", "rejected", "expired", "denied"})
#: The most one long poll may wait (the server's limit).
MAX_POLL_SECONDS = 30


@dataclass(frozen=True)
class RunInfo:
    """A run as the API answers it (`data` holds every field)."""

    id: int
    agent: str
    state: str
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunInfo:
        return cls(id=int(data["id"]), agent=str(data.get("agent", "")), state=str(data.get("state", "")), data=data)


@dataclass(frozen=True)
class Decision:
    """One proposed call as Airlock answers it.

    `args` are the arguments to run it with: the reviewer's if they edited the call
    (`edited` is then true). `result` is set once the call ran: `{"ok": true, "result":
    ...}` or `{"ok": false, "error", "detail"}`."""

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
    client_tool: bool
    run_state: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decision:
        return cls(
            key=str(data["key"]), tool=str(data["tool"]), args=data.get("args"), verdict=str(data.get("verdict", "")),
            reason=str(data.get("reason") or ""), rule=data.get("rule"), approval=data.get("approval"),
            status=str(data["status"]), result=data.get("result"), edited=bool(data.get("edited", False)),
            note=str(data.get("note") or ""), client_tool=bool(data.get("client_tool", False)),
            run_state=str(data.get("run_state", "")),
        )

    @property
    def approval_id(self) -> int | None:
        return int(self.approval["id"]) if self.approval else None

    @property
    def may_run(self) -> bool:
        """The client runs its tool now (allowed by policy or approved by a reviewer)."""
        return self.status == "approved"

    @property
    def final(self) -> bool:
        return self.status in FINAL


RunRef = int | RunInfo


def _run_id(run: RunRef) -> int:
    return run.id if isinstance(run, RunInfo) else int(run)


class Airlock:
    """A client of one Airlock deployment, as the holder of one API token.

    >>> airlock = Airlock("https://airlock.example.com", token)
    >>> run = airlock.start_run("crm-agent", "follow up with ACME")
    >>> decision = airlock.decide(run, "crm_update", {"customer": "ACME", "note": "called"})
    >>> airlock.report(run, decision.key, ok=True, output=crm_update(**decision.args))
    >>> airlock.finish(run, "ACME followed up")
    """

    def __init__(
        self, base_url: str, token: str, *, timeout: float = 10.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        # A long poll waits up to MAX_POLL_SECONDS on the server: the read timeout covers it.
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=httpx.Timeout(timeout, read=timeout + MAX_POLL_SECONDS),
            transport=transport,
        )

    def __enter__(self) -> Airlock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- the API, one method per endpoint ------------------------------------------------

    def start_run(self, agent: str, task: str, **options: Any) -> RunInfo:
        """Launch a run of an external profile (`options`: `limits`, `policy`, ... as
        `POST /api/runs` takes them)."""
        return RunInfo.from_json(self._request("POST", "/api/runs", {"agent": agent, "task": task, **options}))

    def get_run(self, run: RunRef) -> RunInfo:
        return RunInfo.from_json(self._request("GET", f"/api/runs/{_run_id(run)}"))

    def propose(self, run: RunRef, tool: str, args: Mapping[str, Any], usage: Mapping[str, int] | None = None) -> Decision:
        """Propose one call; the answer says whether it may run, waits for a human, was
        denied, or (a tool Airlock runs itself) already ran. An identical call (same tool,
        same arguments) is the same call: proposing it again answers with its key and
        status, and never runs it twice."""
        body: dict[str, Any] = {"tool": tool, "args": dict(args)}
        if usage is not None:
            body["usage"] = dict(usage)
        return Decision.from_json(self._request("POST", f"/api/runs/{_run_id(run)}/calls", body))

    def status(self, run: RunRef, key: str, *, wait: float = 0) -> Decision:
        """The call's status now, or after at most `wait` seconds (<= 30) while it waits."""
        seconds = max(0, min(MAX_POLL_SECONDS, int(wait)))
        return Decision.from_json(self._request("GET", f"/api/runs/{_run_id(run)}/calls/{key}", params={"wait": seconds}))

    def wait(self, run: RunRef, key: str, timeout: float | None = None) -> Decision:
        """Long-poll until the call leaves `pending`/`running` (so: `approved` or final),
        for at most `timeout` seconds (None: as long as it takes). Raises StillPending when
        the time is up."""
        give_up = None if timeout is None else time.monotonic() + timeout
        while True:
            left = MAX_POLL_SECONDS if give_up is None else give_up - time.monotonic()
            decision = self.status(run, key, wait=max(0, min(MAX_POLL_SECONDS, left)))
            if decision.status not in ("pending", "running"):
                return decision
            if give_up is not None and time.monotonic() >= give_up:
                raise StillPending(decision)

    def report(self, run: RunRef, key: str, ok: bool, output: Any) -> Decision:
        """Record a client tool's result (`output`: anything JSON can carry). Reporting the
        same key twice is harmless: the first report stands."""
        body = {"ok": bool(ok), "output": output}
        return Decision.from_json(self._request("POST", f"/api/runs/{_run_id(run)}/calls/{key}/result", body))

    def finish(self, run: RunRef, answer: str, usage: Mapping[str, int] | None = None) -> RunInfo:
        """End the run in `done` with the agent's answer."""
        body: dict[str, Any] = {"answer": answer}
        if usage is not None:
            body["usage"] = dict(usage)
        return RunInfo.from_json(self._request("POST", f"/api/runs/{_run_id(run)}/finish", body))

    # -- what an adapter needs ------------------------------------------------------------

    def decide(
        self, run: RunRef, tool: str, args: Mapping[str, Any], *, usage: Mapping[str, int] | None = None,
        timeout: float | None = None,
    ) -> Decision:
        """Propose the call and wait for the decision. Returns a call that may run now
        (`approved`: a client tool, run it with `decision.args` and `report`) or that
        Airlock ran itself (`succeeded` / `failed`, `decision.result`). Raises Denied,
        Rejected or Expired for a call that will not run, StillPending after `timeout`."""
        decision = self.propose(run, tool, args, usage)
        if decision.status in ("pending", "running"):
            decision = self.wait(run, decision.key, timeout)
        return raise_if_not_run(decision)

    def call(
        self, run: RunRef, tool: str, args: Mapping[str, Any], fn: Callable[..., Any], *,
        usage: Mapping[str, int] | None = None, timeout: float | None = None,
    ) -> Any:
        """Govern one call of a client tool end to end: decide, run `fn(**args)` with the
        arguments Airlock approved, report its result (or its exception, re-raised), and
        return it. For a tool Airlock runs itself, returns the journalled result."""
        decision = self.decide(run, tool, args, usage=usage, timeout=timeout)
        if not decision.may_run:
            return decision.result
        try:
            output = fn(**(decision.args or {}))
        except Exception as exc:
            self.report(run, decision.key, ok=False, output=f"{type(exc).__name__}: {exc}")
            raise
        self.report(run, decision.key, ok=True, output=output)
        return output

    # -- HTTP --------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        try:
            response = self._http.request(method, path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise Unavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        try:
            data = response.json()
        except ValueError:
            data = None
        if 400 <= response.status_code < 500:
            if isinstance(data, dict) and "error" in data:
                raise Refused(response.status_code, str(data["error"]), data.get("detail"))
            raise Refused(response.status_code, "http_error", response.text[:500])
        if response.status_code >= 300 or data is None:
            raise Unavailable(f"{method} {path}: HTTP {response.status_code}: {response.text[:500]}")
        return data


def raise_if_not_run(decision: Decision) -> Decision:
    """The decision, or the exception that says why its call will not run."""
    if decision.status == "denied":
        raise Denied(decision, f"Airlock policy denied {decision.tool}: {decision.reason}")
    if decision.status == "rejected":
        raise Rejected(decision, f"A reviewer rejected {decision.tool}: {decision.note or 'no note'}")
    if decision.status == "expired":
        raise Expired(decision, f"The call to {decision.tool} expired before anyone approved it")
    return decision
