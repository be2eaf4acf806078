"""The external "client": an agent that lives outside Airlock proposes its calls through
the decision API (agents/actions/external.py), so its decision is given, not computed."""

from __future__ import annotations

from typing import Any

from agents.engine.protocols import Decision, ModelRequest


class ExternalClient:
    """Answers with the decision it was given (a proposed call, or the client's final
    answer), once; without one it has none, and the engine rests the run in planning.
    A worker that meets an external run therefore never calls a model for it."""

    # Answers from memory: the driver keeps its database connection (driver.ReleasingModel).
    waits = False
    # The client's own code holds its tools: the engine need not list them for it.
    reads_tools = False

    def __init__(self, decision: Decision | None = None) -> None:
        self.decision = decision

    def propose(self, request: ModelRequest) -> Decision | None:
        decision, self.decision = self.decision, None
        return decision


def make_client(profile: Any, run: Any) -> ExternalClient:
    return ExternalClient()
