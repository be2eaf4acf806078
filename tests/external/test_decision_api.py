"""The decision API: an external agent proposes calls, Airlock decides and runs its own
tools once, the client runs its tools and reports, and finishes the run."""

from __future__ import annotations

import pytest

from agents.models import LedgerEntry, Run, ToolCall
from agents.runs import verify

pytestmark = pytest.mark.django_db


def test_an_allowed_registry_tool_runs_once_and_its_result_is_the_answer(api, external_run) -> None:
    run_id = external_run()
    lena = api("lena")
    response = lena.post(f"/api/runs/{run_id}/calls", {"tool": "echo", "args": {"text": "hello"}})
    assert response.status_code == 200, response.data
    answer = response.data
    assert (answer["verdict"], answer["status"]) == ("allow", "succeeded")
    assert answer["result"] == {"ok": True, "result": "hello"}
    assert len(answer["key"]) == 64 and answer["approval"] is None
    run = Run.objects.get(pk=run_id)
    assert run.state == "planning" and run.steps == 2
    assert ToolCall.objects.get(run=run).idempotency_key == answer["key"]
    again = lena.get(f"/api/runs/{run_id}/calls/{answer['key']}")
    assert again.status_code == 200 and again.data["status"] == "succeeded"


def test_a_client_tool_is_run_by_the_client_and_its_report_recorded_once(api, external_run) -> None:
    run_id = external_run()
    lena = api("lena")
    answer = lena.post(
        f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": {"customer": "ACME", "note": "called"}}
    ).data
    assert (answer["verdict"], answer["status"], answer["client_tool"]) == ("allow", "approved", True)
    assert Run.objects.get(pk=run_id).state == "acting"
    url = f"/api/runs/{run_id}/calls/{answer['key']}/result"
    first = lena.post(url, {"ok": True, "output": {"updated": 1}})
    assert first.status_code == 200 and first.data["status"] == "succeeded"
    assert first.data["result"] == {"ok": True, "result": {"updated": 1}}
    second = lena.post(url, {"ok": False, "output": "changed my mind"})
    assert second.status_code == 200 and second.data["result"] == {"ok": True, "result": {"updated": 1}}
    run = Run.objects.get(pk=run_id)
    assert run.state == "planning" and run.transitions.filter(kind="tool").count() == 1


def test_finish_ends_the_run_done_with_the_answer_and_its_usage(api, external_run) -> None:
    run_id = external_run()
    lena = api("lena")
    lena.post(f"/api/runs/{run_id}/calls", {"tool": "echo", "args": {"text": "x"},
                                            "usage": {"input_tokens": 100, "output_tokens": 20}})
    response = lena.post(f"/api/runs/{run_id}/finish",
                         {"answer": "ledger tidied", "usage": {"input_tokens": 50, "output_tokens": 5}})
    assert response.status_code == 200, response.data
    assert (response.data["state"], response.data["answer"], response.data["tokens"]) == ("done", "ledger tidied", 175)
    assert verify.verify_run(Run.objects.get(pk=run_id)) == []
    assert LedgerEntry.objects.count() == 0


def test_the_call_schema_names_the_keys_of_a_real_answer(api, external_run) -> None:
    """The schema drops what it does not name: hold it to what call_propose answers."""
    from agents.actions import external
    from agents.api.schemas import CallOut

    run_id = external_run()
    answer = api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "echo", "args": {"text": "x"}}).data
    real = external.call_status(run_id=run_id, key=answer["key"], user=Run.objects.get(pk=run_id).created_by)
    assert list(CallOut.model_fields) == list(real.to_dict()) == list(answer)
    assert set(answer) >= {"key", "tool", "args", "verdict", "reason", "rule", "approval", "status", "result"}
