"""The response schemas and the models' to_dict() name the same fields in the same order.

Both are written out (agents/api/schemas.py documents the API; agents/models.py types
what the API, webhooks and commands send). The schemas are not generated from the
TypedDicts because the OpenAPI document says more than they do: which fields may be
left out (the nullable ones, and `grants` with its default [], but not `votes`) and the
shapes of votes and grants, which the TypedDicts type as plain dicts. So this keeps the
two from drifting: a key that to_dict() gains and the schema lacks would vanish from the
JSON without an error, as the schema drops what it does not name.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from ninja import Schema

from agents.api.schemas import ApprovalOut, ApprovalPage, GrantOut, RunOut, RunPage, VoteOut
from agents.models import ApprovalDict, ApprovalVote, Grant, RunDict

NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("schema", "fields"),
    [
        (RunOut, list(RunDict.__annotations__)),
        (ApprovalOut, list(ApprovalDict.__annotations__)),
        (VoteOut, list(ApprovalVote(by_name="rita", decision="approve", at=NOW).to_dict())),
        (GrantOut, list(Grant(tool="echo").to_dict())),
    ],
)
def test_each_response_schema_names_the_fields_of_its_to_dict(schema: type[Schema], fields: list[Any]) -> None:
    assert list(schema.model_fields) == fields


def test_the_run_and_approval_schemas_name_the_keys_of_real_to_dict_output(pending) -> None:
    """The TypedDicts could drift from what to_dict() really returns; the JSON is what
    to_dict() returns, so hold the schemas to the keys of real rows' output."""
    approval = pending()
    run = approval.run
    assert list(RunOut.model_fields) == list(run.to_dict())
    assert list(ApprovalOut.model_fields) == list(approval.to_dict())
    assert list(RunDict.__annotations__) == list(run.to_dict())
    assert list(ApprovalDict.__annotations__) == list(approval.to_dict())


def test_the_launch_schemas_approver_values_are_the_engines() -> None:
    from typing import get_args

    from agents.api.schemas import RunIn
    from agents.engine.policy import APPROVERS

    assert get_args(RunIn.model_fields["approver"].annotation) == APPROVERS


@pytest.mark.parametrize(("page", "item"), [(RunPage, RunOut), (ApprovalPage, ApprovalOut)])
def test_each_list_answers_items_of_its_schema_and_a_cursor(page: type[Schema], item: type[Schema]) -> None:
    assert list(page.model_fields) == ["items", "next"]
    assert page.model_fields["items"].annotation == list[item]
