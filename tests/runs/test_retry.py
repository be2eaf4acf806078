"""Retries (docs/retry.md): a failed run forked from its last resting point, from the
run's page, the command and, for many runs at once, through the real worker."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from agents.actions.approvals import approval_decide
from agents.actions.forks import run_retry
from agents.actions.runs import run_launch
from agents.models import AgentProfile, Approval, LedgerEntry, Run
from agents.runs.verify import verify_run
from tests.helpers import (
    call,
    client_for,
    csrf_post,
    final,
    lose_an_unsafe_writes_outcome,
    requires_postgres,
    wait_for,
)
from tests.llm.provider import OPENAI_KEY, FakeProvider, Reply
from tests.llm.shapes import openai_completion
from tests.workers.cluster import Cluster


class Model:
    """The fake provider's answers, from the request alone (so many runs can share it):
    a run's first model call writes its task to the ledger, the next one answers. During
    an `outage` that next call gets a 503 (after the client's retries the run fails),
    as from a provider having a bad hour."""

    def __init__(self, provider: FakeProvider) -> None:
        self.outage = False
        provider.check = self.reply

    def reply(self, body: Any) -> Reply:
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            if self.outage:
                return Reply(503, {"error": {"message": "upstream overloaded", "type": "server_error"}})
            return Reply(body=openai_completion(content="all written"))
        task = next(m["content"] for m in messages if m["role"] == "user")
        return Reply(body=openai_completion(tool_calls=[("call_w", "ledger_write", {"entry": task})]))


@pytest.fixture
def model(openai_env: FakeProvider, defaults: None) -> Model:
    AgentProfile.objects.create(name="writer", provider="openai", model_name="gpt-4.1", tools=["ledger_write"])
    return Model(openai_env)


@pytest.mark.django_db(transaction=True)
def test_a_run_failed_by_a_provider_outage_retries_without_repeating_its_write(model, openai_env, launch, drive) -> None:
    model.outage = True
    parent = drive(launch(None, agent="writer", task="pay invoice 7"))
    assert parent.state == "failed" and parent.error.startswith("model error"), parent.error
    assert LedgerEntry.objects.count() == 1
    asked_before = len(openai_env.requests)
    model.outage = False
    child, point = run_retry(run_id=parent.pk, user=None)
    assert point.used == parent.version - 1  # just before the failed model call
    child = drive(child)
    assert child.state == "done" and child.answer == "all written", child.error
    assert LedgerEntry.objects.count() == 1  # the write was copied, not repeated
    # The model was asked once more, for the step that failed: not for the copied ones.
    assert len(openai_env.requests) == asked_before + 1
    assert openai_env.requests[-1].json["messages"][-1]["role"] == "tool"
    assert verify_run(child) == [] and verify_run(parent) == []


@pytest.mark.django_db(transaction=True)
def test_the_retry_button_forks_the_failed_run_and_goes_to_the_new_run(launch, drive, otto) -> None:
    parent = drive(launch([call("ledger_write", entry="x"), call("echo", text="a")], task="write then stop"))
    assert parent.state == "failed"  # script exhausted
    client = client_for(otto)
    page = client.get(f"/runs/{parent.pk}/").content.decode()
    assert "Retry from the last good step" in page
    response = csrf_post(client, f"/runs/{parent.pk}/retry/")
    child = Run.objects.get(forked_from=parent)
    assert response.status_code == 302 and response["Location"] == f"/runs/{child.pk}/"
    page = client.get(f"/runs/{child.pk}/").content.decode()
    assert f'<details class="forked-history"><summary>from <a href="/runs/{parent.pk}/">run #{parent.pk}</a>, steps 1-{child.fork_seq}' in page
    assert page.count('class="forked-history"') == 1
    assert f"Forked from <a href=\"/runs/{parent.pk}/#t{child.fork_seq}\">run #{parent.pk}</a>" in page
    listed = client.get(f"/runs/{parent.pk}/").content.decode()
    assert f'Forks of this run: <a href="/runs/{child.pk}/">run #{child.pk}</a>' in listed


@pytest.mark.django_db(transaction=True)
def test_who_may_press_retry(launch, drive, lena, leo, rita, otto) -> None:
    parent = drive(launch([call("echo", text="a")], user=leo))
    assert parent.state == "failed"
    # Another launcher cannot read it: answered as if it did not exist.
    assert csrf_post(client_for(lena), f"/runs/{parent.pk}/retry/").status_code == 404
    # A reviewer reads every run but does not fork them.
    assert csrf_post(client_for(rita), f"/runs/{parent.pk}/retry/").status_code == 403
    assert "Retry from the last good step" not in client_for(rita).get(f"/runs/{parent.pk}/").content.decode()
    assert not Run.objects.filter(forked_from=parent).exists()
    # Without the CSRF token the POST is refused.
    assert client_for(otto).post(f"/runs/{parent.pk}/retry/").status_code == 403
    # The launcher who owns it may.
    assert csrf_post(client_for(leo), f"/runs/{parent.pk}/retry/").status_code == 302
    assert Run.objects.get(forked_from=parent).created_by == leo


@pytest.mark.django_db(transaction=True)
def test_a_run_that_did_not_fail_has_no_retry(launch, drive, otto) -> None:
    done = drive(launch([final("done")]))
    assert "Retry from the last good step" not in client_for(otto).get(f"/runs/{done.pk}/").content.decode()
    csrf_post(client_for(otto), f"/runs/{done.pk}/retry/")
    assert not Run.objects.filter(forked_from=done).exists()


@pytest.mark.django_db(transaction=True)
def test_retry_runs_dry_run_lists_runs_and_their_effects_and_changes_nothing(launch, drive, monkeypatch, rita) -> None:
    since = (timezone.now() - dt.timedelta(minutes=1)).isoformat()
    exhausted = drive(launch([call("ledger_write", entry="x"), call("echo", text="y")]))
    budget = drive(launch([call("echo", text="a"), call("echo", text="b")], limits={"max_steps": 2}))
    # A run failed by its reviewer after an unsafe write's outcome became unknown: its
    # retry starts before that write, which it would ask about if proposed again.
    unknown = lose_an_unsafe_writes_outcome(launch, drive, monkeypatch, "wire")
    question = Approval.objects.get(run=unknown, kind="outcome_unknown")
    approval_decide(approval_id=question.pk, user=rita, decision="fail", note="cannot tell")
    assert exhausted.state == budget.state == Run.objects.get(pk=unknown.pk).state == "failed"
    out = io.StringIO()
    call_command("retry_runs", "--agent", "scripted", "--failed-since", since, "--dry-run", stdout=out)
    text = out.getvalue()
    assert f"run {exhausted.pk} (script_exhausted): would retry after step" in text
    assert f"run {budget.pk} (max_steps)" in text
    assert f"run {unknown.pk} (reviewer)" in text and "effects already made: ask ledger_write_unsafe (step" in text
    assert "dry run: 3 run(s) would be retried" in text
    assert not Run.objects.filter(forked_from__isnull=False).exists()
    out = io.StringIO()
    call_command(
        "retry_runs", "--agent", "scripted", "--failed-since", since, "--reason-kind", "max_steps", stdout=out
    )
    assert Run.objects.filter(forked_from__isnull=False).count() == 1
    assert Run.objects.get(forked_from__isnull=False).forked_from_id == budget.pk
    assert "retried 1 of 1 run(s)" in out.getvalue()
    # Run again, the same window finds nothing more: the run was retried already.
    out = io.StringIO()
    call_command("retry_runs", "--agent", "scripted", "--failed-since", since, "--reason-kind", "max_steps", stdout=out)
    assert "retried 0 of 0 run(s)" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_retry_runs_refuses_a_bad_time(defaults) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--failed-since takes an ISO 8601 time"):
        call_command("retry_runs", "--agent", "scripted", "--failed-since", "yesterday")


@pytest.mark.worker
@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_fifty_runs_failed_by_an_outage_all_finish_on_a_bulk_retry_without_a_duplicate_write(
    cluster: Cluster, model: Model, openai_env: FakeProvider, api, otto
) -> None:
    cluster.start_worker(
        "w1", OPENAI_BASE_URL=f"{openai_env.url}/v1", OPENAI_API_KEY=OPENAI_KEY, AIRLOCK_LLM_BACKOFF="0"
    )
    model.outage = True
    ids = [run_launch(agent="writer", task=f"invoice {i}").pk for i in range(50)]
    wait_for(lambda: Run.objects.filter(pk__in=ids, state="failed").count() == 50, timeout=240, what="50 runs failed")
    assert LedgerEntry.objects.count() == 50
    assert {r.error.split(":")[0] for r in Run.objects.filter(pk__in=ids)} == {"model error"}
    model.outage = False
    response = api("otto").post("/api/runs/retry", {"ids": ids})
    assert response.status_code == 200, response.data
    results = response.data["results"]
    assert [r["id"] for r in results] == ids and {r["outcome"] for r in results} == {"retried"}
    forks = [r["run"] for r in results]
    wait_for(lambda: Run.objects.filter(pk__in=forks, state="done").count() == 50, timeout=240, what="50 retries done")
    assert LedgerEntry.objects.count() == 50  # no write repeated
    assert sorted(LedgerEntry.objects.values_list("entry", flat=True)) == sorted(f"invoice {i}" for i in range(50))
    for run in Run.objects.filter(pk__in=ids + forks):
        assert verify_run(run) == [], run.pk
    # A second bulk retry of the same runs is refused, run by run: each was retried.
    again = api("otto").post("/api/runs/retry", {"ids": ids[:3]}).data["results"]
    assert {r["outcome"] for r in again} == {"refused"} and "already retried" in again[0]["detail"]


@pytest.mark.django_db(transaction=True)
def test_who_may_fork_from_a_step_and_where_the_button_is(launch, drive, lena, leo, rita, otto) -> None:
    parent = drive(launch([call("echo", text="a"), final("ok")], user=leo))
    assert parent.state == "done"
    url, seq = f"/runs/{parent.pk}/fork/", parent.transitions.filter(to_state="planning").first().seq
    assert csrf_post(client_for(lena), url, {"from_seq": seq}).status_code == 404
    assert csrf_post(client_for(rita), url, {"from_seq": seq}).status_code == 403
    assert "Fork from here" not in client_for(rita).get(f"/runs/{parent.pk}/").content.decode()
    assert "Fork from here" in client_for(otto).get(f"/runs/{parent.pk}/").content.decode()
    # No step named: nothing forked, and the fork's page says why.
    response = csrf_post(client_for(otto), url, {})
    assert response.status_code == 400 and "name the step to fork from" in response.content.decode()
    assert not Run.objects.filter(forked_from=parent).exists()
    response = csrf_post(client_for(leo), url, {"from_seq": seq, "max_steps": "8"})
    child = Run.objects.get(forked_from=parent)
    assert response.status_code == 302 and response["Location"] == f"/runs/{child.pk}/"
    assert child.fork_seq == seq and child.engine["limits"]["max_steps"] == 8 and child.created_by == leo


@pytest.mark.django_db(transaction=True)
def test_a_live_run_has_no_fork_buttons(launch, drive, otto, pending) -> None:
    waiting = pending()
    page = client_for(otto).get(f"/runs/{waiting.run_id}/").content.decode()
    assert "Fork from here" not in page
    assert 'id="run-limits"' in page and 'data-limit="max_steps"' in page


@pytest.mark.django_db(transaction=True)
def test_fork_from_here_opens_the_forks_page_with_the_retrys_limits_field(launch, drive, otto) -> None:
    parent = drive(launch([call("echo", text="a"), final("ok")], limits={"max_steps": 4}))
    seq = parent.transitions.filter(to_state="planning").first().seq
    client = client_for(otto)
    run_page = client.get(f"/runs/{parent.pk}/").content.decode()
    assert f'<a href="/runs/{parent.pk}/fork/?from_seq={seq}">Fork from here' in run_page
    page = client.get(f"/runs/{parent.pk}/fork/?from_seq={seq}")
    html = page.content.decode()
    assert page.status_code == 200 and f"Fork run #{parent.pk} after step {seq}" in html
    assert 'class="topnav"' in html and f'<input type="hidden" name="from_seq" value="{seq}">' in html
    assert 'name="csrfmiddlewaretoken"' in html
    # The same fields as the retry's: this run's value and what the profile allows.
    assert '<label for="id_max_steps">Steps</label>' in html and "(this run 4, at most 20)" in html
    assert 'max="20" placeholder="4"' in html
    assert not Run.objects.filter(forked_from=parent).exists()  # a GET forks nothing


@pytest.mark.django_db(transaction=True)
def test_a_fork_launched_with_a_raised_step_budget_gets_it(launch, drive, otto) -> None:
    parent = drive(launch([call("echo", text="a"), final("ok")], limits={"max_steps": 4}))
    seq = parent.transitions.filter(to_state="planning").first().seq
    # Without the CSRF token the POST is refused, and nothing is forked.
    assert client_for(otto).post(f"/runs/{parent.pk}/fork/", {"from_seq": seq, "max_steps": "15"}).status_code == 403
    assert not Run.objects.filter(forked_from=parent).exists()
    response = csrf_post(client_for(otto), f"/runs/{parent.pk}/fork/", {"from_seq": seq, "max_steps": "15"})
    child = Run.objects.get(forked_from=parent)
    assert response.status_code == 302 and response["Location"] == f"/runs/{child.pk}/"
    assert child.engine["limits"]["max_steps"] == 15 and child.fork_seq == seq
    # A limit left blank keeps the parent's.
    assert child.engine["limits"]["max_tokens"] == parent.engine["limits"]["max_tokens"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("value", "message"),
    [("500", "max_steps may only tighten the profile&#x27;s 20, not 500"), ("many", "Enter a whole number.")],
)
def test_a_fork_with_a_bad_limit_answers_on_the_forks_page_with_the_fields_message(
    launch, drive, otto, value, message
) -> None:
    parent = drive(launch([call("echo", text="a"), final("ok")]))
    seq = parent.transitions.filter(to_state="planning").first().seq
    response = csrf_post(client_for(otto), f"/runs/{parent.pk}/fork/", {"from_seq": seq, "max_steps": value})
    html = response.content.decode()
    assert response.status_code == 400 and not Run.objects.filter(forked_from=parent).exists()
    assert 'class="topnav"' in html and f"Fork run #{parent.pk} after step {seq}" in html
    assert f'<p class="error" id="max_steps-error">{message}</p>' in html
    assert f'value="{value}"' in html  # what was typed stays, to correct
    assert f'<a href="/runs/{parent.pk}/#t{seq}">Back to run #{parent.pk}</a>' in html


@pytest.mark.django_db(transaction=True)
def test_a_retry_with_a_bad_limit_answers_on_its_page_with_the_fields_message(launch, drive, otto) -> None:
    parent = drive(launch([call("echo", text="x")] * 3, limits={"max_steps": 2}))
    assert parent.state == "failed"
    response = csrf_post(client_for(otto), f"/runs/{parent.pk}/retry/", {"max_steps": "500"})
    html = response.content.decode()
    assert response.status_code == 400 and not Run.objects.filter(forked_from=parent).exists()
    assert f"Retry run #{parent.pk} from the last good step" in html
    assert '<p class="error" id="max_steps-error">max_steps may only tighten the profile&#x27;s 20, not 500</p>' in html
