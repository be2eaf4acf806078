"""The profile's admin page: "Try these rules" backtests a proposed policy and shows
each shadow rule's agreement; it saves nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from agents.actions.approvals import approval_decide
from agents.models import AgentProfile, Approval
from tests.helpers import call, counts, final, person

pytestmark = pytest.mark.django_db

ASK_20 = {
    "tool": "ledger_write",
    "when": {"arg": "entry.amount", "op": "gte", "value": 20},
    "then": "ask",
    "reason": "entries of 20 or more need a human",
}
SHADOW = {"tool": "ledger_write", "then": "allow", "reason": "try: no human", "mode": "shadow"}


@pytest.fixture
def admin_client(defaults: None) -> Client:
    client = Client()
    client.force_login(person("root", superuser=True))
    return client


@pytest.fixture
def answered(launch, drive, lena, rita) -> dict[str, Approval]:
    AgentProfile.objects.filter(name="scripted").update(rules=[SHADOW, ASK_20])
    out = {}
    for amount, decision in ((50, "approve"), (70, "reject")):
        run = drive(launch([call("ledger_write", entry={"amount": amount}), final()], user=lena))
        approval = Approval.objects.get(run=run)
        approval_decide(approval_id=approval.pk, user=rita, decision=decision, note="")
        drive(run)
        out[decision] = approval
    return out


def url() -> str:
    return f"/admin/agents/agentprofile/{AgentProfile.objects.get(name='scripted').pk}/backtest/"


def test_the_change_page_links_to_try_these_rules(admin_client: Client) -> None:
    profile = AgentProfile.objects.get(name="scripted")
    page = admin_client.get(f"/admin/agents/agentprofile/{profile.pk}/change/").content.decode()
    assert f'href="{url()}"' in page and "Try these rules" in page


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_trying_looser_rules_lists_the_calls_and_how_reviewers_answered(admin_client: Client, answered: Any) -> None:
    before = counts()
    rules = AgentProfile.objects.get(name="scripted").rules
    response = admin_client.post(url(), {"policy": json.dumps({"rules": []}), "days": "30"})
    assert response.status_code == 200
    page = response.content.decode()
    rejected = answered["reject"].pk
    assert "2 calls in the last 30 days" in page
    assert (
        f"ask-&gt;allow: 2 calls would let through without asking; reviewers approved 1, rejected 1: #{rejected}"
        in page
    )
    assert f'href="/reviews/{rejected}/"' in page and f'href="/reviews/{answered["approve"].pk}/"' in page
    # The shadow rule (allow every ledger write) agreed with the approval, not the rejection.
    assert '<tr class="shadow-rule"><td>shadow rule 1</td><td>1</td><td>1</td><td>0</td></tr>' in page
    assert counts() == before and AgentProfile.objects.get(name="scripted").rules == rules


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_try_these_rules_says_how_many_calls_a_purge_left_unjudged(admin_client: Client, answered: Any) -> None:
    from agents.runs.retention import purge

    purge(actor="test", older_than_days=0, only=[answered["reject"].run_id])
    page = admin_client.post(url(), {"policy": json.dumps({"rules": []}), "days": "30"}).content.decode()
    assert "1 call in the last 30 days" in page
    assert (
        "Not judged: 1 call in the window could not be judged: its 1 run was purged by retention" in page
    )


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_bad_policy_is_a_form_error_not_a_500(admin_client: Client, answered: Any) -> None:
    bad = {"rules": [{"tool": "ledger_write", "then": "perhaps", "reason": "r"}]}
    response = admin_client.post(url(), {"policy": json.dumps(bad), "days": "30"})
    assert response.status_code == 200
    assert "rules[1].then: must be allow, ask or deny" in response.content.decode()
    response = admin_client.post(url(), {"policy": "{not json", "days": "30"})
    assert response.status_code == 200 and "errorlist" in response.content.decode()


def test_people_without_the_admin_are_sent_to_log_in(defaults: None, lena: Any) -> None:
    client = Client()
    client.force_login(lena)
    assert client.get(url()).status_code == 302
