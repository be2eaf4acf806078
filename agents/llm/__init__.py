"""Model clients, one module each, found through CLIENTS by provider name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents.engine.protocols import ModelClient

# provider name -> factory(profile, run) -> client; the modules register themselves.
CLIENTS: dict[str, Callable[[Any, Any], ModelClient]] = {}


def client_for(profile: Any, run: Any) -> ModelClient:
    from . import anthropic, demo, openai, scripted  # noqa: F401  (each registers itself)

    try:
        factory = CLIENTS[profile.provider]
    except KeyError:
        from agents.engine.protocols import ModelError

        raise ModelError(f"no model client for provider {profile.provider!r}") from None
    return factory(profile, run)
