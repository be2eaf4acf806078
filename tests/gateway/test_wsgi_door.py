"""`config.wsgi`, what gunicorn serves, hands `/mcp/` to the gateway before Django's
request handling (agents/gateway/bridge.py, `application`), as `config.asgi` does; the
gateway logs its own refusals, once, whichever way a request came in."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents.actions.tokens import token_create
from agents.gateway.app import MAX_BODY
from agents.models import AgentProfile, Approval, GatewaySession, ToolCall
from config.wsgi import application
from tests.gateway.test_auth import ACCEPT, INIT, post
from tests.helpers import requires_postgres, wsgi_call

# The gateway's queries run on its own threads: the rows must be committed to be seen.
pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]


@pytest.fixture
def ext(defaults: None) -> AgentProfile:
    return AgentProfile.objects.create(name="ext", provider="external", tools=["echo"])


class Body(io.BytesIO):
    """A request body that counts what the application read of it."""

    taken = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.taken += len(chunk)
        return chunk


def wsgi(path: str, body: bytes, token: str | None = None, length: int | None = None,
         **headers: str) -> tuple[int, dict[str, str], bytes, Body]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST", "PATH_INFO": path, "HTTP_HOST": "testserver", "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body) if length is None else length), "HTTP_ACCEPT": ACCEPT, **headers,
    }
    if token is not None:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    environ["wsgi.input"] = stream = Body(body)
    return (*wsgi_call(application, environ), stream)


def test_the_wsgi_door_answers_mcp_before_djangos_request_handling(ext: AgentProfile, lena: User) -> None:
    _t, raw = token_create(user=lena)
    status, head, content, _ = wsgi("/mcp/ext/", json.dumps(INIT).encode(), token=raw)
    assert status == 200, content
    sid = head["mcp-session-id"]
    assert GatewaySession.objects.get(session_id=sid).user == lena
    assert int(head["content-length"]) == len(content)
    # None of Django's middleware ran: no session cookie, no CSRF cookie, no page headers;
    # the gateway sets what its JSON needs itself.
    assert "set-cookie" not in head and "x-frame-options" not in head
    assert head["x-content-type-options"] == "nosniff"
    listing = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).encode()
    status, _head, content, _ = wsgi("/mcp/ext/", listing, token=raw, HTTP_MCP_SESSION_ID=sid)
    assert status == 200 and [t["name"] for t in json.loads(content)["result"]["tools"]] == ["echo"]


def test_the_rest_of_the_site_still_goes_through_django() -> None:
    # A cookie-less POST to a page meets Django's CSRF check, which /mcp/ never does.
    status, head, _content, _ = wsgi("/reviews/", b"")
    assert status == 403 and head["x-frame-options"] == "DENY"


@pytest.mark.parametrize("door", ["config.wsgi", "Django's URLs"])
def test_a_refusal_is_logged_once_whichever_way_it_came(ext: AgentProfile, rita: User, caplog, door: str) -> None:
    _t, rita_token = token_create(user=rita)  # a reviewer: may not drive an agent
    for token, status in ((None, 401), ("not-a-token", 401), (rita_token, 403)):
        caplog.clear()
        if door == "config.wsgi":
            answered = wsgi("/mcp/ext/", json.dumps(INIT).encode(), token=token)[0]
        else:
            answered = post(Client(), "/mcp/ext/", INIT, token=token).status_code
        assert answered == status
        who = rita.username if status == 403 else "anonymous"
        lines = [r.getMessage() for r in caplog.records if r.name == "airlock.access"]
        assert lines == [f"denied status={status} method=POST path=/mcp/ext/ user={who}"]
        assert "not-a-token" not in caplog.text and rita_token not in caplog.text
    assert not GatewaySession.objects.exists()


def test_a_body_over_the_limit_is_refused_unread(ext: AgentProfile, lena: User) -> None:
    _t, raw = token_create(user=lena)
    huge = b"x" * (MAX_BODY + 1000)
    status, head, content, stream = wsgi("/mcp/ext/", huge, token=raw, length=20 * MAX_BODY)
    assert status == 413 and json.loads(content)["error"] == "too_large"
    assert head["x-content-type-options"] == "nosniff"
    assert stream.taken == MAX_BODY + 1  # one byte past the limit, never the 80 MB it announced
    assert not GatewaySession.objects.exists()


def test_a_held_call_streams_its_progress_through_the_door(gw, upstream, token, settings) -> None:
    settings.AIRLOCK_GATEWAY_WAIT_SECONDS = 1.5
    status, head, _content, _ = wsgi("/mcp/gw/", json.dumps(INIT).encode(), token=token)
    assert status == 200
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "web__delete_record", "arguments": {"record_id": "beta"}, "_meta": {"progressToken": "p1"}}}
    status, answer, content, _ = wsgi("/mcp/gw/", json.dumps(call).encode(), token=token,
                                      HTTP_MCP_SESSION_ID=head["mcp-session-id"],
                                      HTTP_MCP_PROTOCOL_VERSION=INIT["params"]["protocolVersion"])
    assert status == 200 and answer["content-type"].startswith("text/event-stream")
    assert "content-length" not in answer  # streamed as the loop sends it
    events = [json.loads(line[5:]) for line in content.decode().splitlines() if line.startswith("data:")]
    progress = [e for e in events if e.get("method") == "notifications/progress"]
    assert progress and all(e["params"]["progressToken"] == "p1" for e in progress)
    assert events[-1]["id"] == 2
    assert events[-1]["result"]["structuredContent"]["airlock"]["status"] == "pending_approval"
    assert upstream.calls("delete_record") == []  # held: nothing ran


def _session(token: str) -> dict[str, str]:
    status, head, _content, _ = wsgi("/mcp/gw/", json.dumps(INIT).encode(), token=token)
    assert status == 200
    return {"HTTP_MCP_SESSION_ID": head["mcp-session-id"], "HTTP_MCP_PROTOCOL_VERSION": INIT["params"]["protocolVersion"]}


def _tools_call(tool: str, args: Any, **extra: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                       "params": {"name": tool, "arguments": args, **extra}}).encode()


def _counted_trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from agents.gateway import app

    trips: list[str] = []
    real = app.db

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append(fn.__name__)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(app, "db", counted)
    return trips


def test_a_tools_call_is_proposed_in_the_fronts_one_trip_to_the_database(gw, upstream, token, monkeypatch) -> None:
    session = _session(token)
    trips = _counted_trips(monkeypatch)
    status, _head, content, _ = wsgi("/mcp/gw/", _tools_call("web__lookup", {"record_id": "beta"}), token=token,
                                     **session)
    assert status == 200 and json.loads(content)["result"]["content"][0]["text"] == "the second record"
    assert trips == ["admit_and_start"]  # the token, the session, the proposal and its drive: one trip
    assert ToolCall.objects.get(tool="web__lookup").status == "succeeded"


@pytest.mark.parametrize("why, answered", [("accepts no JSON", 406), ("not JSON", 400), ("bad params", 200),
                                           ("no id", 202)])
def test_a_tools_call_the_sdk_refuses_proposes_nothing(gw, upstream, token, why: str, answered: int) -> None:
    """What the SDK refuses (or takes as a notification, and drops) is never proposed,
    though the front reads the call before the SDK does."""
    session = _session(token)
    headers = dict(session)
    body = _tools_call("web__delete_record", {"record_id": "beta"})
    if why == "accepts no JSON":
        headers["HTTP_ACCEPT"] = "text/html"
    elif why == "not JSON":
        headers["CONTENT_TYPE"] = "text/plain"
    elif why == "bad params":
        body = _tools_call("web__delete_record", ["beta"])
    else:
        message = json.loads(body)
        del message["id"]
        body = json.dumps(message).encode()
    status, _head, content, _ = wsgi("/mcp/gw/", body, token=token, **headers)
    assert status == answered
    if why == "bad params":
        assert json.loads(content)["error"]["code"] == -32602
    assert not ToolCall.objects.exists() and not Approval.objects.exists()
    assert upstream.calls() == []


# A 2026-07-28 request's envelope and routing headers, as the SDK's client sends them.
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "raw-wire", "version": "1"}}


def _modern_call(tool: str, args: Any, **headers: str) -> tuple[bytes, dict[str, str]]:
    routing = {"HTTP_MCP_PROTOCOL_VERSION": "2026-07-28", "HTTP_MCP_METHOD": "tools/call", "HTTP_MCP_NAME": tool}
    return _tools_call(tool, args, _meta=MODERN_META), {**routing, **headers}


def test_a_2026_07_28_tools_call_is_proposed_in_the_fronts_one_trip(gw, upstream, token, monkeypatch) -> None:
    trips = _counted_trips(monkeypatch)
    body, headers = _modern_call("web__lookup", {"record_id": "beta"})
    status, _head, content, _ = wsgi("/mcp/gw/", body, token=token, **headers)
    assert status == 200 and json.loads(content)["result"]["content"][0]["text"] == "the second record"
    assert trips == ["admit_and_start"]  # the token, the stream, the proposal and its drive: one trip
    assert ToolCall.objects.get(tool="web__lookup").status == "succeeded"


@pytest.mark.parametrize("why", ["Mcp-Name names another tool", "Mcp-Method names another method",
                                 "no envelope in _meta", "Mcp-Name twice", "an unsupported version"])
def test_a_2026_07_28_call_the_sdks_ladder_refuses_proposes_nothing(gw, upstream, token, why: str) -> None:
    """The front proposes a 2026-07-28 call in its own trip only when the SDK's ladder
    (routing headers against the body, the envelope, the version) would let it reach
    the handler: what the SDK refuses was never proposed, nor run."""
    body, headers = _modern_call("web__delete_record", {"record_id": "beta"})
    if why == "Mcp-Name names another tool":
        headers["HTTP_MCP_NAME"] = "web__lookup"
    elif why == "Mcp-Method names another method":
        headers["HTTP_MCP_METHOD"] = "tools/list"
    elif why == "no envelope in _meta":
        body = _tools_call("web__delete_record", {"record_id": "beta"})
    elif why == "an unsupported version":
        meta = {**MODERN_META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
        body = _tools_call("web__delete_record", {"record_id": "beta"}, _meta=meta)
    if why == "Mcp-Name twice":
        status, content = _with_duplicate_header(body, token, headers, "mcp-name", "web__delete_record")
    else:
        status, _head, content, _ = wsgi("/mcp/gw/", body, token=token, **headers)
    assert status >= 400 and "error" in json.loads(content), content
    assert not ToolCall.objects.exists() and not Approval.objects.exists()
    assert upstream.calls() == []


def _with_duplicate_header(body: bytes, token: str, headers: dict[str, str], name: str, value: str) -> tuple[int, bytes]:
    """The gateway's ASGI application answering a request that carries `name` twice (a
    WSGI environ folds repeated headers; the ASGI scope keeps them apart)."""
    from agents.gateway.bridge import answer

    raw = [(k[5:].replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/mcp/gw/", "raw_path": b"/mcp/gw/", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"), (b"accept", ACCEPT.encode()),
                    (b"authorization", f"Bearer {token}".encode()), *raw, (name.encode(), value.encode())],
        "client": ("127.0.0.1", 0), "server": ("testserver", 80),
    }
    found = answer(scope, body)
    return found.status, found.body


def test_a_2026_07_28_calls_mcp_param_headers_are_checked_before_it_is_proposed(
    gw, upstream, token, monkeypatch
) -> None:
    """A call whose listed schema mirrors an argument into an `Mcp-Param-*` header: a
    header that disagrees with the body is the SDK's refusal, and nothing is proposed;
    one that agrees is proposed in the front's one trip."""
    from agents.gateway import app

    schema = {"type": "object", "properties": {"record_id": {"type": "string", "x-mcp-header": "Record"}}}
    monkeypatch.setitem(app._schemas, (gw.pk, "web__lookup"), schema)
    trips = _counted_trips(monkeypatch)
    body, headers = _modern_call("web__lookup", {"record_id": "beta"}, HTTP_MCP_PARAM_RECORD="alpha")
    status, _head, content, _ = wsgi("/mcp/gw/", body, token=token, **headers)
    assert status == 400 and json.loads(content)["error"]["code"] == -32020  # HEADER_MISMATCH
    assert not ToolCall.objects.exists() and upstream.calls() == []
    assert trips == ["admit_and_start"]  # the token read; its check refused the start
    del trips[:]
    body, headers = _modern_call("web__lookup", {"record_id": "beta"}, HTTP_MCP_PARAM_RECORD="beta")
    status, _head, content, _ = wsgi("/mcp/gw/", body, token=token, **headers)
    assert status == 200 and json.loads(content)["result"]["content"][0]["text"] == "the second record"
    assert trips == ["admit_and_start"]
    assert ToolCall.objects.get(tool="web__lookup").status == "succeeded"


def test_the_gateways_database_threads_outlive_a_request(gw, upstream, token, monkeypatch) -> None:
    """The front's trips to the database threads run on threads the gateway's loop
    keeps (anyio ends them with the loop's root task, which is not a request's): ten
    calls through the WSGI door start at most one such thread, not one each."""
    from agents.gateway import core

    local, fresh = threading.local(), []
    real = core.admit_and_start

    def watched(*args: Any, **kwargs: Any) -> Any:
        if not getattr(local, "seen", False):
            local.seen = True
            fresh.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "admit_and_start", watched)
    for _ in range(10):
        body, headers = _modern_call("web__lookup", {"record_id": "beta"})
        status, _head, _content, _ = wsgi("/mcp/gw/", body, token=token, **headers)
        assert status == 200
    assert len(fresh) <= 1, fresh
