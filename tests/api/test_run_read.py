"""GET /api/runs/<id> reads the run, its pending approval and its grant count in one
prepared statement (access.readable_run(for_dict=True), issue #48): the answer is the
ORM's `to_dict()`, field by field, and a run with no grants costs no grants query."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agents import access
from agents.actions.tokens import token_create
from agents.models import Approval, Grant, Run

pytestmark = pytest.mark.django_db


def orm_dict(run_id: int) -> dict[str, Any]:
    return dict(Run.objects.select_related("profile", "created_by").get(pk=run_id).to_dict())


def test_a_waiting_runs_read_is_the_orms(pending: Any, lena: User, rita: User) -> None:
    approval: Approval = pending(user=lena)
    Grant.objects.create(run=approval.run, number=2, tool="b", args=None, by=rita)
    Grant.objects.create(run=approval.run, number=1, tool="a", args={"x": 1}, by=None, approval=approval)
    fast = access.readable_run(lena, approval.run_id, for_dict=True).to_dict()
    assert fast == orm_dict(approval.run_id)
    assert fast["pending_approval"]["id"] == approval.pk
    assert [g["tool"] for g in fast["grants"]] == ["a", "b"]


def test_a_finished_runs_read_is_the_orms(launch: Any, drive: Any, lena: User) -> None:
    run = drive(launch([{"final": "done"}], user=lena))
    fast = access.readable_run(lena, run.pk, for_dict=True).to_dict()
    assert fast == orm_dict(run.pk)
    assert fast["pending_approval"] is None and fast["grants"] == []


def test_a_runs_read_is_two_statements_the_token_and_the_run(launch: Any, lena: User) -> None:
    run = launch([{"final": "done"}], user=lena)
    _row, raw = token_create(user=lena)
    api = Client(headers={"Authorization": f"Bearer {raw}"})
    api.get(f"/api/runs/{run.pk}")  # the connection's first use prepares the statements
    with CaptureQueriesContext(connection) as queries:
        answer = api.get(f"/api/runs/{run.pk}")
    assert answer.status_code == 200
    assert answer.json()["id"] == run.pk
    assert len(queries.captured_queries) == 2, [q["sql"][:80] for q in queries.captured_queries]


def test_another_users_run_is_still_hidden(launch: Any, lena: User, leo: User) -> None:
    run = launch([{"final": "done"}], user=lena)
    _row, raw = token_create(user=leo)
    assert Client(headers={"Authorization": f"Bearer {raw}"}).get(f"/api/runs/{run.pk}").status_code == 404
