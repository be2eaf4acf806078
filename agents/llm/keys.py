"""Which environment variable holds a profile's model key, and reading it."""

from __future__ import annotations

import os
from typing import Any

from agents.engine.protocols import ModelError
from agents.lib.keys import API_KEY_ENV


def profile_key(profile: Any, default: str) -> tuple[str, str]:
    """(variable name, key) for a profile: its `api_key_env`, else `default`."""
    name = profile.api_key_env or default
    if not API_KEY_ENV.match(name):
        raise ModelError(f"api_key_env {name!r} must name an environment variable ending in _API_KEY")
    return name, os.environ.get(name, "")
