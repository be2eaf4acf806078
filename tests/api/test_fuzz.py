"""Schema-driven fuzzing: schemathesis generates requests from /api/openapi.json (valid and
invalid ones), sends them in-process to the WSGI app, and no answer may be a 5xx or
anything but a JSON object; every refusal has the `{"error", "detail"}` shape."""

from __future__ import annotations

import json

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.generation import GenerationMode

from agents.actions.tokens import token_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def keep_connection():
    """The real WSGI handler closes "old" connections around each request, which would
    close the test's transaction; Django's own test client disconnects the same signals."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


EXAMPLES = 100  # per mode and persona: 400 requests in all, about 12 s


@pytest.mark.parametrize("persona", ["root", "lena"])
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzzed_requests_never_get_a_server_error(users, launch, drive, keep_connection, persona, mode) -> None:
    from tests.helpers import tainted_write
    done = drive(launch([{"final": "hi"}], user=users["lena"]))
    waiting = drive(launch(tainted_write(), user=users["lena"]))
    ids = {"run_id": [done.pk, waiting.pk], "approval_id": list(waiting.approvals.values_list("pk", flat=True))}
    raw = token_create(user=users[persona])[1]
    auth = {"Authorization": f"Bearer {raw}"}
    app = get_wsgi_application()
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", app, headers=auth)
    seen: dict[int, int] = {}

    @given(case=schema.as_strategy(generation_mode=mode), aim=st.booleans(), pick=st.integers(0, 1))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def check(case, aim: bool, pick: int) -> None:
        if aim:
            # Random text rarely names a real agent or id: half the cases point at real ones,
            # so the fuzz also reaches launches, reads, cancels and decisions that succeed.
            for name, real in ids.items():
                if case.path_parameters and name in case.path_parameters and real:
                    case.path_parameters[name] = real[pick % len(real)]
            if isinstance(case.body, dict) and "agent" in case.body:
                case.body["agent"] = "scripted"
        response = case.call(headers=auth)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500, (case.method, case.formatted_path, case.body, response.text[:500])
        headers = {k.lower(): v for k, v in response.headers.items()}
        if response.status_code == 200 and case.formatted_path.endswith("/runs/export"):
            # JSON Lines: one JSON object per line.
            assert headers["content-type"][0] == "application/x-ndjson", response.text[:200]
            assert all(isinstance(json.loads(line), dict) for line in response.content.splitlines())
            return
        assert headers["content-type"][0].startswith("application/json"), response.text[:200]
        data = json.loads(response.content)
        if response.status_code >= 400:
            assert set(data) == {"error", "detail"} and isinstance(data["error"], str), data

    check()
    assert sum(seen.values()) >= EXAMPLES // 2
    print(f"fuzz {persona} {mode}: status counts {dict(sorted(seen.items()))}")
