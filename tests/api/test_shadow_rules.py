"""Shadow rules: evaluated on every call and recorded, deciding nothing."""

from __future__ import annotations

from typing import Any

import pytest

from agents.engine.policy import PolicyError, validate_rules
from agents.models import AgentProfile, LedgerEntry, Run
from agents.runs import driver
from tests.helpers import client_for, launch_body

pytestmark = pytest.mark.django_db

ASK = {"tool": "ledger_write", "then": "ask", "reason": "entries need a human"}
SHADOW_ALLOW_SMALL = {
    "tool": "ledger_write",
    "when": {"arg": "entry.amount", "op": "lt", "value": 20},
    "then": "allow",
    "reason": "small entries need no human",
    "mode": "shadow",
}


def write(amount: int) -> dict[str, Any]:
    return {"call": {"tool": "ledger_write", "args": {"entry": {"amount": amount}}}}


def test_a_shadow_allow_rule_decides_nothing_and_is_recorded_on_the_transition_and_approval(api) -> None:
    AgentProfile.objects.filter(name="scripted").update(rules=[SHADOW_ALLOW_SMALL, ASK])
    run_id = api("lena").post("/api/runs", launch_body([write(5), {"final": "ok"}])).data["id"]
    driver.drive(run_id)
    run = api("rita").get(f"/api/runs/{run_id}").data
    # The enforced ask rule (rule 2) decided; the shadow rule before it did not allow.
    assert run["state"] == "awaiting_approval"
    assert LedgerEntry.objects.filter(run_id=run_id).count() == 0
    approval = run["pending_approval"]
    assert approval["rule"]["index"] == 2
    assert approval["shadow"] == [{"rule": 1, "verdict": "allow"}]
    [proposal] = [t for t in api("rita").get(f"/api/runs/{run_id}/transitions").data if "verdict" in t["payload"]]
    assert proposal["payload"]["shadow"] == [{"rule": 1, "verdict": "allow"}]
    assert proposal["payload"]["verdict"]["action"] == "ask"


def test_a_shadow_rule_that_does_not_match_records_nothing(api) -> None:
    AgentProfile.objects.filter(name="scripted").update(rules=[SHADOW_ALLOW_SMALL, ASK])
    run_id = api("lena").post("/api/runs", launch_body([write(50), {"final": "ok"}])).data["id"]
    driver.drive(run_id)
    approval = api("rita").get(f"/api/runs/{run_id}").data["pending_approval"]
    assert approval["shadow"] == []
    [proposal] = [t for t in api("rita").get(f"/api/runs/{run_id}/transitions").data if "verdict" in t["payload"]]
    assert "shadow" not in proposal["payload"]


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_shadow_deny_rule_lets_an_allowed_call_run_and_says_it_would_have_denied(api) -> None:
    deny = {"tool": "ledger_write", "then": "deny", "reason": "no ledger writes", "mode": "shadow"}
    AgentProfile.objects.filter(name="scripted").update(rules=[deny])
    run_id = api("lena").post("/api/runs", launch_body([write(5), {"final": "ok"}])).data["id"]
    driver.drive(run_id)
    assert Run.objects.get(pk=run_id).state == "done"
    assert LedgerEntry.objects.filter(run_id=run_id).count() == 1
    [proposal] = [t for t in api("rita").get(f"/api/runs/{run_id}/transitions").data if "verdict" in t["payload"]]
    assert proposal["payload"]["shadow"] == [{"rule": 1, "verdict": "deny"}]


def test_a_launch_rule_cannot_be_a_shadow_rule(api) -> None:
    rule = {**SHADOW_ALLOW_SMALL, "then": "ask"}
    response = api("lena").post("/api/runs", launch_body(policy={"rules": [rule]}))
    assert response.status_code == 400
    assert response.data["detail"].startswith("policy.rules[1].mode: ")


def test_an_unknown_mode_is_refused_naming_the_field() -> None:
    with pytest.raises(PolicyError) as info:
        validate_rules([{**ASK, "mode": "dry-run"}])
    assert info.value.field == "rules[1].mode"


def test_the_timeline_and_the_approval_page_say_what_the_shadow_rule_would_have_done(api, otto, rita) -> None:
    AgentProfile.objects.filter(name="scripted").update(rules=[SHADOW_ALLOW_SMALL, ASK])
    run_id = api("lena").post("/api/runs", launch_body([write(5), {"final": "ok"}])).data["id"]
    driver.drive(run_id)
    approval_id = api("rita").get(f"/api/runs/{run_id}").data["pending_approval"]["id"]
    timeline = client_for(otto).get(f"/runs/{run_id}/").content.decode()
    assert "shadow rule 1 would have allowed this (it decides nothing)" in timeline
    page = client_for(rita).get(f"/reviews/{approval_id}/").content.decode()
    assert "shadow rule 1 would have allowed this" in page
