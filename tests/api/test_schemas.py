"""A run, an approval, a vote and a grant have one shape each: the TypedDict their model's
to_dict() returns (agents/models/runs.py, approvals.py). The API's schemas are derived
from those (agents/api/schemas.py, `from_dict_shape`), and what the API answers is what
webhooks, exports and commands send: these tests hold the OpenAPI document, the schemas
and to_dict() to each other, field by field and value by value.

The schemas cannot drop a key quietly any more (they name the TypedDict's fields), but a
nested shape they name (votes, grants, history...) could still differ from what
to_dict() puts there: the last test compares the API's JSON with to_dict()'s, as a
webhook encodes it, on rows where every nested value is there.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from ninja import Schema

from agents.api.schemas import ApprovalOut, ApprovalPage, GrantOut, RunOut, RunPage, VoteOut
from agents.models import AgentProfile, Approval, ApprovalDict, Grant, GrantDict, Run, RunDict, VoteDict
from agents.runs import driver
from tests.helpers import launch_body

SHAPES = [(RunOut, RunDict), (ApprovalOut, ApprovalDict), (VoteOut, VoteDict), (GrantOut, GrantDict)]


@pytest.mark.parametrize(("schema", "shape"), SHAPES)
def test_each_response_schema_names_the_fields_of_its_shape_in_order(schema: type[Schema], shape: type) -> None:
    assert list(schema.model_fields) == list(shape.__annotations__)


def as_sent(value: Any) -> Any:
    """`value` as a webhook body carries it (agents/notifications/delivery.py)."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


@pytest.mark.django_db(transaction=True)  # the diagnostic tools run on a thread with its own connection
def test_the_openapi_document_the_api_and_to_dict_agree_field_by_field(api, rita) -> None:
    # A run waiting on a history rule's call that needs two votes and has one, with a
    # grant and a legal hold: every nested value of a run and its approval is there.
    history = {"scope": "run", "calls_over": 1, "same": ["entry.order"]}
    rule = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "twice", "history": history}
    AgentProfile.objects.filter(name="scripted").update(rules=[rule])
    writes = [{"call": {"tool": "ledger_write", "args": {"entry": {"order": "1042", "amount": n}}}} for n in (1, 2)]
    launched = api("lena").post("/api/runs", launch_body([*writes, {"final": "ok"}]))
    assert launched.status_code == 201, launched.data
    run = driver.drive(launched.data["id"])
    approval = Approval.objects.get(run=run, status="pending")
    voted = api("rita").post(f"/api/approvals/{approval.pk}/decision", {"decision": "approve"})
    assert voted.status_code == 200 and voted.data["status"] == "pending", voted.data
    Grant.objects.create(run=run, number=1, tool="echo", args={"text": "x"}, by=rita)
    Run.objects.filter(pk=run.pk).update(hold_reason="audit")

    run = Run.objects.select_related("profile").get(pk=run.pk)
    approval = Approval.objects.get(pk=approval.pk)
    mine, its = run.to_dict(), approval.to_dict()
    assert its["votes"] and its["history"] and mine["grants"] and mine["hold"] and mine["pending_approval"]

    document = api("rita").get("/api/openapi.json").data["components"]["schemas"]
    for name, value in [("RunOut", mine), ("ApprovalOut", its), ("VoteOut", its["votes"][0]),
                        ("GrantOut", mine["grants"][0])]:
        assert list(document[name]["properties"]) == list(value), name
    assert api("rita").get(f"/api/runs/{run.pk}").data == as_sent(mine)
    assert api("rita").get(f"/api/approvals/{approval.pk}").data == as_sent(its)


def test_the_launch_schemas_approver_values_are_the_engines() -> None:
    from typing import get_args

    from agents.api.schemas import RunIn
    from agents.engine.policy import APPROVERS

    assert get_args(RunIn.model_fields["approver"].annotation) == APPROVERS


@pytest.mark.parametrize(("page", "item"), [(RunPage, RunOut), (ApprovalPage, ApprovalOut)])
def test_each_list_answers_items_of_its_schema_and_a_cursor(page: type[Schema], item: type[Schema]) -> None:
    assert list(page.model_fields) == ["items", "next"]
    assert page.model_fields["items"].annotation == list[item]
