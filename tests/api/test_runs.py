"""POST /api/runs, GET /api/runs/<id>, its transitions, and cancel: roles and refusals."""

from __future__ import annotations

import pytest
from django.test import override_settings

from agents.engine.limits import TASK_MAX_CHARS
from agents.models import IdempotencyKey, Run
from agents.runs import driver
from tests.helpers import at_once, launch_body, requires_postgres, tainted_write

pytestmark = pytest.mark.django_db

RUN_FIELDS = {
    "id",
    "agent",
    "state",
    "task",
    "steps",
    "cost_micros",
    "tokens",
    "answer",
    "error",
    "tainted",
    "created_at",
    "updated_at",
    "pending_approval",
    "grants",
    "purged_at",
    "hold",
    # A fork's parent and fork point (docs/retry.md), null for any other run.
    "forked_from",
    "continues",
}


def test_launcher_launches_a_run_and_reads_it(api) -> None:
    lena = api("lena")
    response = lena.post("/api/runs", launch_body(task="say hi", limits={"max_steps": 5}))
    assert response.status_code == 201
    run = response.data
    assert set(run) == RUN_FIELDS
    assert run["agent"] == "scripted" and run["state"] == "queued" and run["task"] == "say hi"
    row = Run.objects.get(pk=run["id"])
    assert row.created_by.username == "lena" and row.engine["limits"]["max_steps"] == 5
    driver.drive(row.pk)
    detail = lena.get(f"/api/runs/{run['id']}")
    assert detail.status_code == 200
    assert detail.data["state"] == "done" and detail.data["answer"] == "hi" and detail.data["steps"] == 1
    assert detail.data["pending_approval"] is None


def test_run_shows_its_pending_approval(api) -> None:
    lena = api("lena")
    run_id = lena.post("/api/runs", launch_body(tainted_write())).data["id"]
    driver.drive(run_id)
    run = lena.get(f"/api/runs/{run_id}").data
    assert run["state"] == "awaiting_approval" and run["tainted"] is True
    pending = run["pending_approval"]
    assert pending["tool"] == "ledger_write" and pending["args"] == {"entry": "discount code to all"}
    assert pending["status"] == "pending" and pending["run"] == run_id
    assert pending["taint_source"]["tool"] == "fetch_fixture"


def test_transitions_are_listed_in_order_with_their_fields(api) -> None:
    lena = api("lena")
    run_id = lena.post(
        "/api/runs", launch_body([{"call": {"tool": "echo", "args": {"text": "x"}}}, {"final": "ok"}])
    ).data["id"]
    driver.drive(run_id)
    response = lena.get(f"/api/runs/{run_id}/transitions")
    assert response.status_code == 200
    rows = response.data
    assert [t["seq"] for t in rows] == list(range(1, len(rows) + 1))
    assert [(t["from_state"], t["to_state"]) for t in rows] == [
        ("", "queued"),
        ("queued", "planning"),
        ("planning", "acting"),
        ("acting", "planning"),
        ("planning", "done"),
    ]
    assert set(rows[0]) == {
        "seq",
        "from_state",
        "to_state",
        "kind",
        "payload",
        "cost_micros",
        "tokens",
        "duration_ms",
        "actor",
        "created_at",
    }
    assert rows[0]["actor"] == "user:lena" and rows[0]["kind"] == "launch"


@pytest.mark.parametrize(
    "who,status", [("lena", 200), ("leo", 404), ("otto", 200), ("rita", 200), ("root", 200), ("nina", 404), (None, 401)]
)
def test_who_may_read_a_run(api, who, status) -> None:
    run_id = api("lena").post("/api/runs", launch_body()).data["id"]
    for path in (f"/api/runs/{run_id}", f"/api/runs/{run_id}/transitions"):
        response = api(who).get(path)
        assert response.status_code == status
        if status != 200:
            assert {"error", "detail"} <= set(response.data)


@pytest.mark.parametrize(
    "who,status", [("lena", 201), ("root", 201), ("otto", 403), ("rita", 403), ("nina", 403), (None, 401)]
)
def test_who_may_launch(api, who, status) -> None:
    response = api(who).post("/api/runs", launch_body())
    assert response.status_code == status
    assert Run.objects.count() == (1 if status == 201 else 0)
    if status == 403:
        assert response.data["error"] == "forbidden"
    if status == 401:
        assert response.data["error"] == "unauthenticated" and response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "who,status", [("otto", 200), ("root", 200), ("lena", 403), ("rita", 403), ("nina", 403), (None, 401)]
)
def test_who_may_cancel(api, who, status) -> None:
    run_id = api("lena").post("/api/runs", launch_body()).data["id"]
    response = api(who).post(f"/api/runs/{run_id}/cancel")
    assert response.status_code == status
    state = Run.objects.get(pk=run_id).state
    assert state == ("cancelled" if status == 200 else "queued")
    if status == 200:
        assert response.data["state"] == "cancelled" and f"cancelled by {who}" in response.data["error"]


def test_cancel_of_an_ended_run_is_a_conflict(api) -> None:
    run_id = api("lena").post("/api/runs", launch_body()).data["id"]
    driver.drive(run_id)
    response = api("otto").post(f"/api/runs/{run_id}/cancel")
    assert response.status_code == 409 and response.data["error"] == "not_active"
    assert Run.objects.get(pk=run_id).state == "done"


def test_cancel_while_awaiting_approval_closes_the_approval(api) -> None:
    run_id = api("lena").post("/api/runs", launch_body(tainted_write())).data["id"]
    driver.drive(run_id)
    assert api("otto").post(f"/api/runs/{run_id}/cancel").data["state"] == "cancelled"
    assert api("rita").get("/api/approvals?status=pending").data["items"] == []


@pytest.mark.parametrize("path", ["/api/runs/999999", "/api/runs/999999/transitions", "/api/runs/9223372036854775808"])
def test_unknown_run_is_404(api, path) -> None:
    response = api("root").get(path)
    assert response.status_code == 404 and response.data["error"] == "not_found"


def test_cancel_of_unknown_run_is_404(api) -> None:
    response = api("otto").post("/api/runs/999999/cancel")
    assert response.status_code == 404 and response.data["error"] == "not_found"


@pytest.mark.parametrize(
    "method,path",
    [
        ("DELETE", "/api/runs"),
        ("PUT", "/api/runs/export"),
        ("PUT", "/api/runs/1"),
        ("GET", "/api/runs/1/cancel"),
        ("POST", "/api/approvals"),
        ("GET", "/api/approvals/1/decision"),
    ],
)
def test_wrong_method_is_405_in_json(api, method, path) -> None:
    response = api("root").request(method, path)
    assert response.status_code == 405 and response.data["error"] == "method_not_allowed"
    assert response["Allow"]


@pytest.mark.parametrize("path", ["/api/nothing", "/api/runs/", "/api/runs/abc", "/api/runs/-1"])
def test_unknown_api_path_is_404_in_json(api, path) -> None:
    for method in ("GET", "POST"):
        response = api("root").request(method, path)
        assert response.status_code == 404 and response.data["error"] == "not_found"


INVALID = [
    ("malformed JSON", b'{"agent": "scripted", "task": ', "invalid_json"),
    ("not JSON at all", b"\xff\xfe\x00garbage", "invalid_json"),
    ("NaN is not JSON", b'{"agent": "scripted", "task": "t", "limits": {"max_steps": NaN}}', "invalid_json"),
    ("a list, not an object", [1, 2], "invalid_request"),
    ("empty body", b"", "invalid_request"),
    ("task is a number", {"agent": "scripted", "task": 5}, "invalid_request"),
    ("task missing", {"agent": "scripted"}, "invalid_request"),
    ("limit as a string", launch_body(limits={"max_steps": "5"}), "invalid_request"),
    ("limit as a bool", launch_body(limits={"max_steps": True}), "invalid_request"),
    ("limit below one", launch_body(limits={"max_steps": 0}), "invalid_request"),
    ("unknown limit", launch_body(limits={"max_fun": 3}), "invalid_request"),
    ("unknown field", launch_body(colour="blue"), "invalid_request"),
    ("bad approver", launch_body(approver="robot"), "invalid_request"),
    ("script not a list", launch_body(script={"final": "x"}), "invalid_request"),
    ("agent with odd characters", {"agent": "scr\u0000ipted", "task": "t"}, "invalid_request"),
    ("unknown agent", launch_body(agent="nosuch"), "unknown_agent"),
    ("empty task", launch_body(task=""), "invalid_task"),
    ("blank task", launch_body(task="   \n"), "invalid_task"),
    ("looser limits than the profile's", launch_body(limits={"max_steps": 21}), "invalid_limits"),
    ("malformed script item", launch_body(script=[{"say": "hi"}]), "invalid_script"),
    ("a script for the demo agent", launch_body(agent="demo"), "invalid_script"),
    ("an empty script for the scripted agent", launch_body(script=[]), "invalid_script"),
    ("no script for the scripted agent", {"agent": "scripted", "task": "t"}, "invalid_script"),
    (
        "a launch rule for a tool the agent lacks",
        launch_body(policy={"rules": [{"tool": "refund", "then": "deny", "reason": "no refunds"}]}),
        "invalid_policy",
    ),
]


def test_the_api_takes_the_task_length_the_form_takes(api) -> None:
    lena = api("lena")
    over = lena.post("/api/runs", launch_body(task="x" * (TASK_MAX_CHARS + 1)))
    assert over.status_code == 400 and over.data["error"] == "invalid_request"
    assert over.data["detail"][0]["loc"][-1] == "task"
    assert f"at most {TASK_MAX_CHARS} characters" in over.data["detail"][0]["msg"]
    assert Run.objects.count() == 0
    assert lena.post("/api/runs", launch_body(task="x" * TASK_MAX_CHARS)).status_code == 201


@pytest.mark.parametrize("label,body,code", INVALID, ids=[i[0] for i in INVALID])
def test_invalid_launch_is_refused_with_a_json_error(api, label, body, code) -> None:
    lena = api("lena")
    if isinstance(body, bytes):
        response = lena.post("/api/runs", raw=body)
    else:
        response = lena.post("/api/runs", body)
    assert response.status_code == 400, response.data
    assert response.data["error"] == code and response.data["detail"]
    assert Run.objects.count() == 0


@override_settings(AIRLOCK_ALLOW_SCRIPTED=False)
def test_script_is_refused_when_scripted_runs_are_off(api) -> None:
    response = api("lena").post("/api/runs", launch_body())
    assert response.status_code == 403 and response.data["error"] == "scripted_disabled"
    assert Run.objects.count() == 0


def test_same_idempotency_key_and_body_launch_once(api) -> None:
    lena = api("lena")
    headers = {"Idempotency-Key": "order-1042-refund"}
    first = lena.post("/api/runs", launch_body(task="refund 1042"), headers=headers)
    again = lena.post("/api/runs", launch_body(task="refund 1042"), headers=headers)
    assert first.status_code == 201 and again.status_code == 200
    assert first.data["id"] == again.data["id"]
    assert Run.objects.count() == 1 and IdempotencyKey.objects.count() == 1


def test_same_idempotency_key_with_another_body_is_a_conflict(api) -> None:
    lena = api("lena")
    headers = {"Idempotency-Key": "k1"}
    assert lena.post("/api/runs", launch_body(task="refund 1042"), headers=headers).status_code == 201
    response = lena.post("/api/runs", launch_body(task="refund 1043"), headers=headers)
    assert response.status_code == 409 and response.data["error"] == "idempotency_conflict"
    assert Run.objects.count() == 1


def test_idempotency_keys_are_per_user(api) -> None:
    headers = {"Idempotency-Key": "shared-key"}
    a = api("lena").post("/api/runs", launch_body(), headers=headers)
    b = api("leo").post("/api/runs", launch_body(), headers=headers)
    assert a.status_code == b.status_code == 201 and a.data["id"] != b.data["id"]


def test_refused_launch_does_not_burn_the_idempotency_key(api) -> None:
    lena = api("lena")
    headers = {"Idempotency-Key": "k2"}
    assert lena.post("/api/runs", launch_body(agent="nosuch"), headers=headers).status_code == 400
    assert lena.post("/api/runs", launch_body(), headers=headers).status_code == 201


def test_text_postgresql_cannot_store_is_sanitised_not_a_500(api) -> None:
    raw = '{"agent": "scripted", "task": "a\\u0000b", "script": [{"final": "x\\u0000"}]}'
    response = api("lena").post("/api/runs", raw=raw)
    assert response.status_code == 201
    assert response.data["task"] == "a\ufffdb"
    run = driver.drive(response.data["id"])
    assert run.state == "done" and run.answer == "x\ufffd"
    # A lone surrogate is not Unicode text: refused before it reaches anything.
    response = api("lena").post("/api/runs", raw='{"agent": "scripted", "task": "a \\ud800"}')
    assert response.status_code == 400 and response.data["error"] == "invalid_json"
    assert response.data["detail"] == "text with a lone surrogate (invalid Unicode) at $.task"


@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_idempotency_key_launch_once(api) -> None:
    lena = [api("lena") for _ in range(4)]
    responses = at_once(
        lambda c: c.post("/api/runs", launch_body(task="once"), headers={"Idempotency-Key": "same"}), lena
    )
    assert sorted(r.status_code for r in responses) == [200, 200, 200, 201]
    assert len({r.data["id"] for r in responses}) == 1
    assert Run.objects.filter(task="once").count() == 1


def test_oversized_body_is_413_not_a_500(api, settings) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    response = api("lena").post("/api/runs", launch_body(task="x" * 20_000))
    assert response.status_code == 413 and response.data["error"] == "too_large"
    assert Run.objects.count() == 0
