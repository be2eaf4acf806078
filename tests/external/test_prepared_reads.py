"""The decision API's hot reads (the token, the run, the identical call with its repeat
count, the call by key) are prepared on the server on PostgreSQL
(agents/lib/prepared.py): they give what the plain reads give, and
AIRLOCK_PREPARED_STATEMENTS=0 sends them plain with the same answers."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from agents import access
from agents.actions import external
from agents.actions.tokens import token_create, token_user
from agents.engine.fingerprints import fingerprint
from agents.lib import rows
from agents.models import Approval, ClientCall, Run, ToolCall
from agents.runs import driver
from tests.helpers import requires_postgres, round_trips

pytestmark = pytest.mark.django_db

NOTE = {"customer": "A", "note": "called back"}
# The statements a round trip prepares, by a piece of each one's text.
HOT = {
    "token": "FROM agents_apitoken a",
    "run locked": "FOR UPDATE OF a",
    "identical call and repeat count": "c.fingerprint = $4 UNION ALL SELECT max((",
    "report's run with its call": "WHERE k.key = $1) AND c0.run_id = a.id",
}
# The journal's own repeat count: a proposal has read it with the identical call.
JOURNAL_COUNT = "SELECT COUNT(*) FROM agents_toolcall WHERE run_id = $1 AND fingerprint = $2"


def fields(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields if f.attname in obj.__dict__}


def plain(query: rows.Joined) -> rows.Joined:
    """The same read, never prepared."""
    return rows.Joined(query.model, query.related, query.where, defer=sorted(query.defer))


def round_trip(api: Any, run_id: int) -> list[dict[str, Any]]:
    """Propose, report, propose the same call again (answered from the first), report
    it again (the first report stands): the answers, less what names the run."""
    lena = api("lena")
    answers = [lena.post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": NOTE})]
    key = answers[0].data["key"]
    answers.append(lena.post(f"/api/runs/{run_id}/calls/{key}/result", {"ok": True, "output": "done"}))
    answers.append(lena.post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": NOTE}))
    answers.append(lena.post(f"/api/runs/{run_id}/calls/{key}/result", {"ok": True, "output": "again"}))
    assert [a.status_code for a in answers] == [200, 200, 200, 200], [a.data for a in answers]
    return [{k: v for k, v in a.data.items() if k != "key"} for a in answers]


def prepared_statements() -> list[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cur.fetchall()]


def forget_prepared() -> None:
    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")


def test_each_prepared_read_gives_what_the_plain_read_gives(api, external_run, lena) -> None:
    run_id = external_run()
    round_trip(api, run_id)
    call = ClientCall.objects.get(run_id=run_id)
    fp = fingerprint("crm_update", NOTE)

    with transaction.atomic():
        for query in (external._lock_query(), external._READ):
            [prepared_run] = query.fetch([run_id, lena.pk, False])
            [plain_run] = plain(query).fetch([run_id, lena.pk, False])
            assert fields(prepared_run) == fields(plain_run) and prepared_run.state == "planning"
            assert fields(prepared_run.profile) == fields(plain_run.profile)
            assert fields(prepared_run.created_by) == fields(plain_run.created_by)
            assert query.fetch([run_id, lena.pk + 1000, False]) == []  # not hers: nothing
    [found] = external._BY_KEY.fetch([run_id, call.key])
    assert fields(found) == fields(plain(external._BY_KEY).fetch([run_id, call.key])[0]) == fields(call)
    [beside] = external._READ_WITH_CALL.fetch([call.key, run_id, lena.pk, False])
    [alone] = external._READ.fetch([run_id, lena.pk, False])
    assert fields(beside.by_key) == fields(call) and fields(beside) == fields(alone)
    [without] = external._READ_WITH_CALL.fetch(["no such key", run_id, lena.pk, False])
    assert without.by_key is None and without.pk == run_id

    run = Run.objects.get(pk=run_id)
    same, ran = external._identical(run, fp)
    assert same is not None and fields(same) == fields(call) and ran == 1
    other = fingerprint("crm_update", {**NOTE, "note": "other"})
    assert external._identical(run, other) == (None, 0)
    sql, _columns = external._identical_query()
    params = [run_id, fp, run_id, fp, run_id, fp]
    assert rows.fetch(sql, params, prepared=True) == rows.fetch(sql, params)

    raw = token_create(user=lena)[1]
    user = token_user(raw)
    assert fields(user) == fields(lena) and user._airlock_token_project is None
    roles = access._roles_of(user)
    access.forget_roles(lena)
    assert roles == access._roles_of(lena)

    journal = driver.StoreJournal(Run.objects.get(pk=run_id))
    ran = ToolCall.objects.filter(run_id=run_id, fingerprint=fp, status__in=("succeeded", "failed")).count()
    assert journal.executed(fp) == ran == 1
    assert journal.executed(fingerprint("crm_update", {**NOTE, "note": "other"})) == 0


@requires_postgres()
def test_a_round_trip_prepares_its_hot_reads_once(settings, api, external_run) -> None:
    assert settings.AIRLOCK_PREPARED_STATEMENTS
    forget_prepared()
    round_trip(api, external_run())
    first = prepared_statements()
    for name, text in HOT.items():
        assert any(text in s for s in first), f"the {name} read was not prepared"
    # The identical-call read holds the same count as a subquery; the journal's own
    # statement (the count alone) must not have run.
    assert not any(s.startswith(JOURNAL_COUNT) for s in first), "the proposal read its repeat count twice"
    round_trip(api, external_run())
    assert sorted(prepared_statements()) == sorted(first)  # reused, none added


@requires_postgres()
def test_turned_off_nothing_is_prepared_and_the_answers_are_the_same(settings, api, external_run) -> None:
    on = round_trip(api, external_run())
    settings.AIRLOCK_PREPARED_STATEMENTS = False
    forget_prepared()
    off_run = external_run()
    off = round_trip(api, off_run)
    assert prepared_statements() == []
    assert off == on
    assert ClientCall.objects.filter(run_id=off_run).count() == 1
    assert list(ToolCall.objects.filter(run_id=off_run).values_list("status", "result")) == [
        ("succeeded", {"ok": True, "result": "done"})
    ]


@requires_postgres()  # a pipeline of prepared statements
@pytest.mark.django_db(transaction=True)  # the proposal's own BEGIN and COMMIT, not a test's savepoints
def test_a_proposal_locks_its_run_and_reads_the_identical_call_in_one_round_trip(api, external_run) -> None:
    """The identical-call read needs only the run's id and the call: it goes in the run
    lock's round trip, a statement of its own that starts once the lock is held."""
    lena = api("lena")
    first = lena.post(f"/api/runs/{external_run()}/calls", {"tool": "crm_update", "args": NOTE})
    assert first.data["verdict"] == "allow"  # the statements are prepared on this connection now
    run_id = external_run()
    with round_trips() as trips:
        answer = lena.post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": NOTE})
    assert (answer.data["verdict"], answer.data["status"]) == ("allow", "approved")
    # The token; BEGIN (psycopg syncs it in a pipeline); the run's lock with the
    # identical-call read; the pickup's and the proposal's commit statements; COMMIT.
    assert trips.count == 6, " | ".join(trips.sent)
    # The identical call is found, under the lock, as before.
    again = lena.post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": NOTE})
    assert again.data["key"] == answer.data["key"] and ClientCall.objects.filter(run_id=run_id).count() == 1


@requires_postgres()  # a pipeline of prepared statements
@pytest.mark.django_db(transaction=True)  # the report's own commit, not a test's savepoints
def test_a_report_and_a_status_read_read_the_run_and_call_in_the_tokens_round_trip(api, external_run) -> None:
    """The run and its call by key are read whoever asks, so a token's status read and
    report send that read in the token's round trip and judge it once the user is
    known: a status read is one round trip, a report two (then its commit)."""
    lena = api("lena")
    warm = external_run()  # the statements are prepared on this connection after it
    key = lena.post(f"/api/runs/{warm}/calls", {"tool": "crm_update", "args": NOTE}).data["key"]
    assert lena.get(f"/api/runs/{warm}/calls/{key}").data["status"] == "approved"
    assert lena.post(f"/api/runs/{warm}/calls/{key}/result", {"ok": True, "output": "done"}).data["status"] == "succeeded"
    run_id = external_run()
    key = lena.post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": NOTE}).data["key"]
    with round_trips() as status_trips:
        status = lena.get(f"/api/runs/{run_id}/calls/{key}")
    with round_trips() as report_trips:
        report = lena.post(f"/api/runs/{run_id}/calls/{key}/result", {"ok": True, "output": "done"})
    assert (status.status_code, status.data["status"]) == (200, "approved")
    assert (report.status_code, report.data["status"]) == (200, "succeeded")
    assert report.data["result"] == {"ok": True, "result": "done"}
    assert status_trips.count == 1, " | ".join(status_trips.sent)
    assert report_trips.count == 2, " | ".join(report_trips.sent)
    assert list(ToolCall.objects.filter(run_id=run_id).values_list("status", "result")) == [
        ("succeeded", {"ok": True, "result": "done"})
    ]


@pytest.mark.parametrize(("who", "refused"), [("leo", 404), ("otto", 403)])
def test_a_call_read_beside_the_token_is_refused_as_a_read_apart(api, external_run, who, refused) -> None:
    """Read before the user is known, a run and its call answer only whoever may drive
    the run: another launcher's token gets the 404 of a run that does not exist, an
    operator's (who may read it) the 403 of one they did not launch, as before."""
    run_id = external_run()
    key = api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": NOTE}).data["key"]
    caller = api(who)
    got = [
        caller.get(f"/api/runs/{run_id}/calls/{key}"),
        caller.post(f"/api/runs/{run_id}/calls/{key}/result", {"ok": True, "output": "x"}),
        caller.get(f"/api/runs/{run_id}/calls/{key}?wait=1"),
    ]
    assert [g.status_code for g in got] == [refused] * 3, [g.data for g in got]
    assert all("crm_update" not in str(g.data) for g in got)
    assert ToolCall.objects.filter(run_id=run_id, status="succeeded").count() == 0


@requires_postgres()  # a pipeline of prepared statements
def test_a_held_calls_status_read_is_one_round_trip_until_a_vote_counts(api, external_run, lena, rita) -> None:
    """A call waiting for people: its approval, who decided, edited and claims it and its
    vote count come beside the token too; its votes are read once one counts. Each
    answer is the one read apart gives (`call_status` without the read ahead)."""
    ask = {"tool": "crm_update", "then": "ask", "reason": "two people read CRM notes", "approvals": 2}
    run_id = external_run(policy={"rules": [ask]})
    client = api("lena")
    held = client.post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": NOTE}).data
    key, approval_id = held["key"], held["approval"]["id"]
    client.get(f"/api/runs/{run_id}/calls/{key}")  # prepares the statements

    def status(trips_expected: int) -> dict[str, Any]:
        with round_trips() as trips:
            answer = client.get(f"/api/runs/{run_id}/calls/{key}")
        assert answer.status_code == 200 and trips.count == trips_expected, " | ".join(trips.sent)
        ahead = external.call_read_ahead(run_id, key, answer=True)
        assert ahead is not None
        read = rows.fetch(*ahead, prepared=True)
        judged = external.call_status(run_id=run_id, key=key, user=lena, read=read).to_dict()
        assert judged == external.call_status(run_id=run_id, key=key, user=lena).to_dict()  # read apart
        assert answer.data["status"] == judged["status"] and answer.data["approval"]["id"] == approval_id
        return dict(answer.data)

    assert status(1)["status"] == "pending"
    Approval.objects.filter(pk=approval_id).update(claimed_by=rita, claimed_until=timezone.now() + dt.timedelta(minutes=5))
    assert status(1)["approval"]["claimed_by"] == "rita"
    assert api("rita").post(f"/api/approvals/{approval_id}/decision", {"decision": "approve"}).status_code == 200
    assert [v["by"] for v in status(2)["approval"]["votes"]] == ["rita"]


def _rows_filtered_out(node: dict[str, Any]) -> int:
    return int(node.get("Rows Removed by Filter", 0)) + sum(_rows_filtered_out(n) for n in node.get("Plans", []))


@requires_postgres()  # the plans are PostgreSQL's
def test_a_proposals_identical_call_read_does_not_walk_the_runs_calls(api, external_run) -> None:
    """A new call (which matches none) looks its identical call up on (run, fingerprint),
    in the calls and in the journal: as one OR, the plan walked every call of the run
    backwards from the newest, each proposal slower by the run's length."""
    run_id = external_run()
    api("lena").post(f"/api/runs/{run_id}/calls", {"tool": "crm_update", "args": NOTE})
    ClientCall.objects.bulk_create(
        ClientCall(run_id=run_id, key=f"{i:064x}", call_id=f"ext_old_{i}", fingerprint=f"{i:032x}", tool="crm_update",
                   args={"n": i}, client=True, verdict="allow")
        for i in range(1, 2001)
    )
    ToolCall.objects.bulk_create(
        # Each ran with other arguments than proposed (a reviewer's edit): another fingerprint.
        ToolCall(run_id=run_id, idempotency_key=f"{i:064x}", fingerprint=f"{i + 5000:032x}", step=i, call_id=f"ext_old_{i}",
                 tool="crm_update", args={"n": i}, status="succeeded")
        for i in range(1, 2001)
    )
    sql, params = external._identical_read(run_id, fingerprint("crm_update", {"new": 1}))
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        [[plan]] = cur.fetchall()
    assert _rows_filtered_out(plan[0]["Plan"]) < 10, plan
    # A call is still found by its own fingerprint, and an edited one through its journal entry's.
    run = Run.objects.get(pk=run_id)
    assert [external._identical(run, f"{n:032x}")[0].call_id for n in (7, 5007)] == ["ext_old_7", "ext_old_7"]
