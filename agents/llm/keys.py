"""Which environment variable holds a profile's model key, and reading it."""

from __future__ import annotations

import os
import re
from typing import Any

from agents.engine.protocols import ModelError

# A profile's `api_key_env` may only name a variable meant for a model key: otherwise
# whoever edits a profile could have SECRET_KEY or a database password sent as the
# bearer token to a base URL of their choosing.
API_KEY_ENV = re.compile(r"^[A-Z][A-Z0-9_]*_API_KEY$")


def profile_key(profile: Any, default: str) -> tuple[str, str]:
    """(variable name, key) for a profile: its `api_key_env`, else `default`."""
    name = profile.api_key_env or default
    if not API_KEY_ENV.match(name):
        raise ModelError(f"api_key_env {name!r} must name an environment variable ending in _API_KEY")
    return name, os.environ.get(name, "")
