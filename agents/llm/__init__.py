"""Model clients, one module each, found through the `clients()` table by provider name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents.engine.protocols import ModelClient, ModelError, ModelReply, ModelRequest

from . import anthropic, demo, external, openai, scripted


def clients() -> dict[str, Callable[[Any, Any], ModelClient]]:
    """Provider name -> make_client(profile, run), one module each."""
    return {
        "scripted": scripted.make_client,
        "demo": demo.make_client,
        "openai": openai.make_client,
        "anthropic": anthropic.make_client,
        "external": external.make_client,
    }


def client_for(profile: Any, run: Any) -> ModelClient:
    """The profile's client; a profile that cannot have one gets a client that fails the
    run's next model call with the reason, so the run records it instead of a crash."""
    factory = clients().get(profile.provider)
    if factory is None:
        return Unusable(f"no model client for provider {profile.provider!r}")
    try:
        return factory(profile, run)
    except ModelError as exc:
        return Unusable(str(exc))


class Unusable:
    def __init__(self, reason: str) -> None:
        self.reason = reason

    def propose(self, request: ModelRequest) -> ModelReply:
        raise ModelError(self.reason)

