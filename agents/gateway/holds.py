"""A held call in the 2026-07-28 era: the `input_required` rounds of a tools/call that
waits for a human (docs/gateway.md, "Holds").

A round that ends with the call still held answers `input_required` with a
`requestState` naming the call (its run and key) and how many rounds it has had. The
SDK's `RequestStateBoundary` seals it on the way out and checks it on the way back:
encrypted and authenticated under a key derived from SECRET_KEY (so every web process
and host accepts it), bound to the same tool and arguments and to the caller (the
token's user and the profile). An altered state, another caller's, or one replayed
with another call is refused with a protocol error before any handler runs: nothing is
proposed, approved or called upstream.

The official clients retry a state-only `input_required` by themselves, ten rounds by
default, then raise. So a call is held for at most HOLD_ROUNDS rounds (each up to
AIRLOCK_GATEWAY_WAIT_SECONDS) and AIRLOCK_GATEWAY_HOLD_SECONDS from its first round,
then answered as it stands ("pending_approval"), which a model can read; its next
identical call joins the same approval.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from . import core

# Below the official SDKs' default of ten rounds before they raise.
HOLD_ROUNDS = 9
AUDIENCE = "airlock-gateway"
# A state outlives one round's wait and the client's backoff by far.
TTL_SECONDS = 600.0


@dataclass(frozen=True)
class Held:
    run_id: int
    key: str
    rounds: int
    since: float  # the first round's time (epoch seconds)

    def again(self) -> bool:
        """Whether a round that ends held may answer `input_required` once more."""
        return self.rounds < HOLD_ROUNDS and time.time() - self.since < settings.AIRLOCK_GATEWAY_HOLD_SECONDS


def _principal(ctx: Any) -> str | None:
    """Whose state it is: the token's user and the profile (the gateway's own
    authentication; the SDK's auth context is unused here)."""
    gate = ctx.request.scope.get("airlock.gateway") if ctx.request is not None else None
    caller = getattr(gate, "caller", None)
    return f"{caller.user.pk}:{caller.profile_id}" if caller is not None else None


def boundary() -> RequestStateBoundary:
    secret = hashlib.sha256(b"airlock/gateway/request-state:" + settings.SECRET_KEY.encode()).hexdigest()
    security = RequestStateSecurity(keys=[secret], ttl=TTL_SECONDS, bind_principal=_principal)
    return RequestStateBoundary(security, default_audience=AUDIENCE)


def first(run_id: int, key: str, *, since: float) -> Held:
    """A call held for the first time (since `since`, epoch seconds): no round yet."""
    return Held(run_id=run_id, key=key, rounds=0, since=since)


def write(caller: core.Caller, held: Held) -> str:
    """The state of the round after `held`'s (plain: the boundary seals it)."""
    return json.dumps({"run": held.run_id, "key": held.key, "rounds": held.rounds + 1, "since": held.since,
                       "user": caller.user.pk})


def read(state: str, caller: core.Caller) -> Held:
    """The held call a state names, as the boundary unsealed it (so it is one this
    gateway minted for this caller and this call)."""
    try:
        data = json.loads(state)
        held = Held(run_id=int(data["run"]), key=str(data["key"]), rounds=int(data["rounds"]),
                    since=float(data["since"]))
        if data["user"] != caller.user.pk:
            raise ValueError("another caller's")
    except (ValueError, KeyError, TypeError):
        raise MCPError(code=INVALID_PARAMS, message="Invalid or expired requestState",
                       data={"reason": "invalid_request_state"}) from None
    return held
