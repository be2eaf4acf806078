"""The name a profile's `api_key_env` may take: read by the ORM's validation and by the
model clients, so it lives below both."""

from __future__ import annotations

import re

# A profile's `api_key_env` may only name a variable meant for a model key: otherwise
# whoever edits a profile could have SECRET_KEY or a database password sent as the
# bearer token to a base URL of their choosing.
API_KEY_ENV = re.compile(r"^[A-Z][A-Z0-9_]*_API_KEY$")
