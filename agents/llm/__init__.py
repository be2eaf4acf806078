"""Model clients, one module each, found through the `clients()` table by provider name."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from agents.engine.protocols import Decision, ModelClient, ModelError, ModelRequest

# A profile's `api_key_env` may only name a variable meant for a model key: otherwise
# whoever edits a profile could have SECRET_KEY or a database password sent as the
# bearer token to a base URL of their choosing.
API_KEY_ENV = re.compile(r"^[A-Z][A-Z0-9_]*_API_KEY$")

def clients() -> dict[str, Callable[[Any, Any], ModelClient]]:
    """Provider name -> make_client(profile, run), one module each. Imported on first
    use: the modules import this package, and the models import it for API_KEY_ENV."""
    from . import anthropic, demo, openai, scripted

    return {
        "scripted": scripted.make_client,
        "demo": demo.make_client,
        "openai": openai.make_client,
        "anthropic": anthropic.make_client,
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

    def decide(self, request: ModelRequest) -> Decision:
        raise ModelError(self.reason)


def profile_key(profile: Any, default: str) -> tuple[str, str]:
    """(variable name, key) for a profile: its `api_key_env`, else `default`."""
    name = profile.api_key_env or default
    if not API_KEY_ENV.match(name):
        raise ModelError(f"api_key_env {name!r} must name an environment variable ending in _API_KEY")
    return name, os.environ.get(name, "")
