"""What can go wrong when an agent asks Airlock, each its own exception.

`AirlockError` is the root. A call Airlock will not let run raises a `CallNotRun`
(`Denied`, `Rejected`, `Expired`) carrying the call as Airlock answered it; a request
Airlock refused raises `Refused` with the API's `error` code and `detail`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import Decision


class AirlockError(Exception):
    """Anything this client raises."""


class Refused(AirlockError):
    """Airlock answered a request with a 4xx: `status`, `code` (the API's `error`, such as
    `invalid_arguments`, `unknown_tool`, `call_pending`, `run_ended`, `forbidden`) and
    `detail`."""

    def __init__(self, status: int, code: str, detail: Any = None) -> None:
        self.status = status
        self.code = code
        self.detail = detail
        super().__init__(f"Airlock refused the request ({status} {code}): {detail}")


class Unavailable(AirlockError):
    """Airlock could not be reached, or answered with a 5xx or something that is not JSON."""


class CallNotRun(AirlockError):
    """The call will not run. `decision` is the call as Airlock last answered it."""

    def __init__(self, decision: Decision, message: str) -> None:
        self.decision = decision
        super().__init__(message)


class Denied(CallNotRun):
    """Policy refused the call (`decision.reason`, `decision.rule`)."""


class Rejected(CallNotRun):
    """A reviewer rejected the call (`decision.note`)."""


class Expired(CallNotRun):
    """Nobody decided in time, or the run ended before the call could run."""


class StillPending(AirlockError):
    """`wait` gave up: the call still waits for a reviewer. Ask again with the same key
    (or propose the identical call again: it is the same call)."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        super().__init__(f"call {decision.tool} ({decision.key[:12]}) is still {decision.status}")
