"""The external "client": an agent that lives outside Airlock proposes its calls through
the decision API (agents/actions/external.py), so its reply is given, not computed."""

from __future__ import annotations

from typing import Any

from agents.engine.protocols import ModelReply, ModelRequest


class ExternalClient:
    """Answers with the reply it was given (a proposed call, or the client's final
    answer), once; without one it has none, and the engine rests the run in planning.
    A worker that meets an external run therefore never calls a model for it."""

    # Answers from memory: the driver keeps its database connection (driver.ReleasingModel).
    waits = False
    # The client's own code holds its tools: the engine need not list them for it.
    reads_tools = False

    def __init__(self, reply: ModelReply | None = None) -> None:
        self.reply = reply

    def propose(self, request: ModelRequest) -> ModelReply | None:
        reply, self.reply = self.reply, None
        return reply


def make_client(profile: Any, run: Any) -> ExternalClient:
    return ExternalClient()
