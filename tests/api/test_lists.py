"""GET /api/runs, GET /api/runs/export and GET /api/approvals: keyset pages, filters and
who sees what (issue 25, item 4: GET /api/runs answered 405)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.utils import timezone

from agents.models import AgentProfile, Approval, Run
from agents.runs import driver
from tests.helpers import launch_body, tainted_write

pytestmark = pytest.mark.django_db


def launched(api, owner: str = "lena", n: int = 1, **body: Any) -> list[int]:
    return [api(owner).post("/api/runs", launch_body(**body)).data["id"] for _ in range(n)]


def every_page(client, path: str) -> tuple[list[int], int]:
    """The ids of every page, following `next`; and how many pages it took."""
    ids: list[int] = []
    pages = 0
    url = path
    while True:
        response = client.get(url)
        assert response.status_code == 200, response.data
        assert set(response.data) == {"items", "next"}
        ids += [item["id"] for item in response.data["items"]]
        pages += 1
        if response.data["next"] is None:
            return ids, pages
        url = f"{path}{'&' if '?' in path else '?'}after={response.data['next']}"


def test_runs_come_newest_first_a_page_at_a_time_with_no_repeats_or_gaps_under_ties(api) -> None:
    ids = launched(api, n=7)
    # Five of the seven share one instant: the id breaks the tie.
    same = timezone.now() - dt.timedelta(hours=1)
    Run.objects.filter(pk__in=ids[1:6]).update(created_at=same)
    expected = list(Run.objects.order_by("-created_at", "-pk").values_list("pk", flat=True))
    got, pages = every_page(api("otto"), "/api/runs?limit=2")
    assert got == expected and len(set(got)) == 7
    assert pages == 4
    first = api("otto").get("/api/runs?limit=2").data
    assert first["items"][0]["id"] == ids[-1] and set(first["items"][0]) >= {"id", "agent", "state", "task"}
    assert api("otto").get("/api/runs?limit=7").data["next"] is None


def test_a_page_holds_at_most_200(api) -> None:
    assert api("otto").get("/api/runs?limit=200").status_code == 200
    response = api("otto").get("/api/runs?limit=201")
    assert response.status_code == 400
    assert response.data == {
        "error": "invalid_filter",
        "detail": {"field": "limit", "message": "an integer from 1 to 200"},
    }


def test_launchers_list_only_their_own_runs(api) -> None:
    mine = launched(api, "lena", 2)
    theirs = launched(api, "leo", 2)
    assert every_page(api("lena"), "/api/runs")[0] == mine[::-1]
    assert every_page(api("lena"), "/api/runs?launched_by=leo")[0] == []
    assert every_page(api("otto"), "/api/runs?launched_by=leo")[0] == theirs[::-1]
    assert every_page(api("rita"), "/api/runs")[0] == (mine + theirs)[::-1]
    assert api("nina").get("/api/runs").status_code == 403  # no role
    assert api(None).get("/api/runs").status_code == 401


def test_each_run_filter_narrows(api, defaults) -> None:
    AgentProfile.objects.create(name="other", provider="scripted", model_name="x")
    waiting = api("lena").post("/api/runs", launch_body(tainted_write(), task="refund order 1042")).data["id"]
    driver.drive(waiting)
    [done] = launched(api, "lena", task="plain question", script=[{"final": "hi"}])
    driver.drive(done)
    [leos] = launched(api, "leo", task="ANOTHER REFUND")
    old = Run.objects.get(pk=leos)
    old.created_at = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    Run.objects.filter(pk=leos).update(created_at=old.created_at)

    def ids(query: str) -> set[int]:
        return set(every_page(api("otto"), f"/api/runs?{query}")[0])

    assert ids("state=awaiting_approval") == {waiting}
    assert ids("state=done") == {done}
    assert ids("agent=scripted") == {waiting, done, leos} and ids("agent=other") == set()
    assert ids("launched_by=lena") == {waiting, done} and ids("launched_by=nobody") == set()
    assert ids("q=refund") == {waiting, leos}  # case-insensitive, in the task
    assert ids("since=2026-06-01") == {waiting, done}
    assert ids("until=2026-06-01") == {leos}
    assert ids("since=2026-01-01T12:00:00Z&until=2026-01-01T12:00:01Z") == {leos}  # since is inclusive
    assert ids("until=2026-01-01T12:00:00Z") == set()  # until is not
    assert ids("since=2026-01-01T13:00:00%2B01:00&until=2026-01-01T13:00:01 01:00") == {leos}  # offsets
    assert ids("q=refund&launched_by=lena&state=awaiting_approval") == {waiting}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=sleeping", "state"),
        ("agent=nope", "agent"),
        ("agent=bad name", "agent"),
        ("since=yesterday", "since"),
        ("since=2026-02-30", "since"),
        ("until=2026-13-01T00:00:00", "until"),
        ("since=2026-02-01&until=2026-01-01", "until"),
        ("since=0001-01-01T00:00:00%2B01:00", "since"),
        ("q=" + "x" * 201, "q"),
        ("q=a%00b", "q"),
        ("launched_by=a%00b", "launched_by"),
        ("limit=0", "limit"),
        ("limit=x", "limit"),
        ("limit=²", "limit"),
        ("after=nonsense", "after"),
        ("after=MjAyNi0wMS0wMXwx", "after"),  # base64 of a date without a zone, and an id
    ],
)
def test_a_bad_filter_is_a_400_naming_the_field(api, query: str, field: str) -> None:
    for path in ("/api/runs", "/api/approvals", "/api/runs/export"):
        if path == "/api/runs/export" and field in ("limit", "after"):
            continue
        response = api("otto").get(f"{path}?{query}")
        assert response.status_code == 400, (path, query, response.data)
        assert response.data["error"] == "invalid_filter"
        assert response.data["detail"]["field"] == field and response.data["detail"]["message"]


def test_a_cursor_from_another_order_still_reads_safely(api) -> None:
    launched(api, n=3)
    nxt = api("otto").get("/api/runs?limit=1").data["next"]
    assert api("otto").get(f"/api/approvals?after={nxt}").status_code == 200


def export(client, query: str = "") -> list[dict[str, Any]]:
    response = client.client.get(f"/api/runs/export{query}", headers=client.headers)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    body = b"".join(response.streaming_content).decode()
    assert body == "" or body.endswith("\n")
    return [json.loads(line) for line in body.splitlines()]


def test_export_streams_one_run_per_line_as_the_api_shows_it(api, monkeypatch) -> None:
    from agents.api import listing

    monkeypatch.setattr(listing, "EXPORT_CHUNK", 2)  # several chunks, their seams included
    mine = launched(api, "lena", 5)
    theirs = launched(api, "leo", 1)
    Run.objects.filter(pk__in=mine[1:4]).update(created_at=timezone.now() - dt.timedelta(minutes=5))
    lines = export(api("otto"))
    assert [r["id"] for r in lines] == list(Run.objects.order_by("-created_at", "-pk").values_list("pk", flat=True))
    assert lines[0] == api("otto").get(f"/api/runs/{lines[0]['id']}").data
    assert "transitions" not in lines[0]
    assert {r["id"] for r in export(api("lena"))} == set(mine)  # launchers: their own
    assert [r["id"] for r in export(api("otto"), "?launched_by=leo")] == theirs


def test_export_with_transitions(api) -> None:
    [run_id] = launched(api, script=[{"final": "hi"}])
    driver.drive(run_id)
    [line] = export(api("otto"), "?transitions=1")
    seqs = [t["seq"] for t in line["transitions"]]
    assert seqs == sorted(seqs) and len(seqs) == Run.objects.get(pk=run_id).transitions.count() >= 2
    assert line["transitions"] == api("otto").get(f"/api/runs/{run_id}/transitions").data
    assert api("otto").get("/api/runs/export?transitions=yes").data["detail"]["field"] == "transitions"


def test_approvals_come_in_pages_oldest_first_with_the_filters(api) -> None:
    ids = []
    for i in range(5):
        run_id = (
            api("lena" if i % 2 else "leo").post("/api/runs", launch_body(tainted_write(), task=f"task {i}")).data["id"]
        )
        driver.drive(run_id)
        ids.append(Approval.objects.get(run_id=run_id).pk)
    Approval.objects.filter(pk__in=ids[:3]).update(created_at=timezone.now() - dt.timedelta(minutes=1))
    expected = list(Approval.objects.order_by("created_at", "pk").values_list("pk", flat=True))
    assert every_page(api("rita"), "/api/approvals?limit=2") == (expected, 3)
    assert every_page(api("rita"), "/api/approvals?status=pending&limit=2")[0] == expected
    assert every_page(api("rita"), "/api/approvals?status=approved")[0] == []
    assert set(every_page(api("rita"), "/api/approvals?launched_by=lena")[0]) == {ids[1], ids[3]}
    assert every_page(api("rita"), "/api/approvals?q=task 4")[0] == [ids[4]]
    assert (
        every_page(api("rita"), "/api/approvals?tool=ledger_write&state=awaiting_approval&agent=scripted")[0]
        == expected
    )
    assert set(every_page(api("lena"), "/api/approvals")[0]) == {ids[1], ids[3]}  # launchers: their runs'


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_page_reads_the_same_few_queries_and_the_same_json_as_each_run(
    api, users, django_assert_max_num_queries
) -> None:
    from agents.actions.approvals import approval_decide

    two = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two sign"}
    voted = api("lena").post("/api/runs", launch_body(tainted_write(), policy={"rules": [two]})).data["id"]
    driver.drive(voted)
    approval_decide(approval_id=Approval.objects.get(run_id=voted).pk, user=users["rita"], decision="approve")
    ask = {**two, "approvals": 1}  # an untainted write a rule asks about: it may be granted
    script = [{"call": {"tool": "ledger_write", "args": {"entry": "x"}}}, {"final": "ok"}]
    granted = api("lena").post("/api/runs", launch_body(script, policy={"rules": [ask]})).data["id"]
    driver.drive(granted)
    approval_decide(
        approval_id=Approval.objects.get(run_id=granted).pk, user=users["rita"], decision="approve", remember="call"
    )
    driver.drive(granted)
    launched(api, n=8)
    otto = api("otto")
    items = otto.get("/api/runs").data["items"]
    assert items == [otto.get(f"/api/runs/{r['id']}").data for r in items]
    assert next(r for r in items if r["id"] == voted)["pending_approval"]["votes"][0]["by"] == "rita"
    assert next(r for r in items if r["id"] == granted)["grants"][0]["tool"] == "ledger_write"
    # Not two queries a run: the token, the user, the page, its approvals, votes, grants.
    with django_assert_max_num_queries(8):
        assert len(otto.get("/api/runs").data["items"]) == 10
