"""GET /api/runs/<id> reads the run, its pending approval and its grant count in one
prepared statement (access.readable_run(for_dict=True), issue #48): the answer is the
ORM's `to_dict()`, field by field, and a run with no grants costs no grants query."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents import access
from agents.actions.tokens import token_create
from agents.models import Approval, ApprovalVote, Grant, Run
from tests.helpers import client_for, requires_postgres, round_trips

pytestmark = pytest.mark.django_db


def orm_dict(run_id: int) -> dict[str, Any]:
    return dict(Run.objects.select_related("profile", "created_by").get(pk=run_id).to_dict())


def orm_json(run_id: int) -> Any:
    """`orm_dict` as the API's JSON carries it."""
    return json.loads(json.dumps(orm_dict(run_id), cls=DjangoJSONEncoder))


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


def test_a_runs_read_is_one_statement_the_token_with_the_run_beside_it(launch: Any, lena: User) -> None:
    """The run's read rides the token's own statement, whatever roles its user holds
    (a row per role, each with the run beside it, read once)."""
    lena.groups.add(*Group.objects.filter(name__in=["operator", "reviewer"]))
    run = launch([{"final": "done"}], user=lena)
    _row, raw = token_create(user=lena)
    api = Client(headers={"Authorization": f"Bearer {raw}"})
    api.get(f"/api/runs/{run.pk}")  # the connection's first use prepares the statements
    with CaptureQueriesContext(connection) as queries:
        answer = api.get(f"/api/runs/{run.pk}")
    assert answer.status_code == 200
    assert answer.json() == orm_json(run.pk)
    assert len(queries.captured_queries) == 1, [q["sql"][:80] for q in queries.captured_queries]


@requires_postgres()
def test_a_tokens_run_read_rides_the_tokens_round_trip(pending: Any, lena: User, rita: User) -> None:
    """The run (with its pending approval, who edited and who claims it, its vote and
    grant counts) is read in the token's round trip: one round trip while a call waits,
    edited and claimed or not; the answer is the ORM's all the same. Votes counted on
    the call are read apart, a second trip."""
    approval = pending(user=lena)
    run_id = approval.run_id
    _row, raw = token_create(user=lena)
    api = Client(headers={"Authorization": f"Bearer {raw}"})
    api.get(f"/api/runs/{run_id}")  # prepares the statements; marks the token used

    def read(trips_expected: int) -> dict[str, Any]:
        with round_trips() as trips:
            answer = api.get(f"/api/runs/{run_id}")
        assert answer.status_code == 200
        assert answer.json() == orm_json(run_id) and answer.json()["pending_approval"] is not None
        assert trips.count == trips_expected, " | ".join(trips.sent)
        return dict(answer.json()["pending_approval"])

    assert read(1)["votes"] == []
    until = timezone.now() + dt.timedelta(minutes=5)
    Approval.objects.filter(pk=approval.pk).update(
        claimed_by=rita, claimed_until=until, edited_by=rita, edited_args={"x": 1}, round=1,
    )
    ApprovalVote.objects.create(approval=approval, round=0, by=rita, by_name="rita", decision="approve", at=until)
    shown = read(1)  # a vote of an earlier round does not count: none to read
    assert (shown["claimed_by"], shown["edited_by"], shown["votes"]) == ("rita", "rita", [])
    ApprovalVote.objects.create(approval=approval, round=1, by=rita, by_name="rita", decision="approve", at=until)
    assert [v["by"] for v in read(2)["votes"]] == ["rita"]
    # The session's read (no token) reads the run on its own, as before.
    session = client_for(lena)
    assert session.get(f"/api/runs/{run_id}").json() == orm_json(run_id)


def test_what_the_token_read_beside_it_is_judged_after_it(launch: Any, lena: User, leo: User) -> None:
    """Read before the token's user is known, the run still answers only whoever may
    read it: another's run 404 as a missing one, a bad token 401 with nothing of the run."""
    run = launch([{"final": "done"}], user=lena)
    _row, raw = token_create(user=leo)
    hidden = Client(headers={"Authorization": f"Bearer {raw}"}).get(f"/api/runs/{run.pk}")
    missing = Client(headers={"Authorization": f"Bearer {raw}"}).get("/api/runs/99999999")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["detail"].replace(str(run.pk), "N") == missing.json()["detail"].replace("99999999", "N")
    refused = Client(headers={"Authorization": "Bearer airlock_nope"}).get(f"/api/runs/{run.pk}")
    assert refused.status_code == 401 and "door test" not in refused.content.decode() and "task" not in refused.json()
    too_big = Client(headers={"Authorization": f"Bearer {raw}"}).get(f"/api/runs/{2**63}")
    assert too_big.status_code == 404


def test_another_users_run_is_still_hidden(launch: Any, lena: User, leo: User) -> None:
    run = launch([{"final": "done"}], user=lena)
    _row, raw = token_create(user=leo)
    assert Client(headers={"Authorization": f"Bearer {raw}"}).get(f"/api/runs/{run.pk}").status_code == 404
