"""The review card beyond yes/no: edit then approve, the vote counter, separated
duties, the time left to answer and the "expires soonest" order; and the timeline's
record of each."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from django.utils import timezone

from agents.actions.approvals import approval_decide, approval_expire
from agents.models import Approval, LedgerEntry, Run
from tests.helpers import call, final, person

pytestmark = pytest.mark.django_db

TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign the ledger"}
BIG = {"tool": "ledger_write", "when": {"arg": "entry", "op": "matches", "value": "1000"}, "then": "deny",
       "reason": "no four-figure entries"}
SCRIPT = [call("ledger_write", entry="pay ACME 100"), final("paid")]


def ask(pending, *rules: dict[str, Any], **policy: Any) -> Approval:
    return pending(SCRIPT, policy={"rules": list(rules) or [TWO_PEOPLE], **policy})


def card_html(client, approval: Approval, query: str = "") -> str:
    page = client.get(f"/reviews/{query}").content.decode()
    match = re.search(rf'<article[^>]*data-approval-id="{approval.pk}".*?</article>', page, re.S)
    assert match, f"no card for approval {approval.pk}"
    return match.group(0)


# -- edit, then approve ------------------------------------------------------------------


def test_the_card_offers_an_editor_with_the_arguments(pending, rita, as_user) -> None:
    approval = ask(pending, {**TWO_PEOPLE, "approvals": 1})
    html = card_html(as_user(rita), approval)
    assert ">Edit arguments</button>" in html and ">Approve with these arguments</button>" in html
    # Closed, the editor's field is disabled: a plain Approve sends no arguments.
    assert re.search(r'<textarea name="args"[^>]* disabled>', html)
    assert "&quot;entry&quot;: &quot;pay ACME 100&quot;" in html


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_approving_with_edited_arguments_runs_the_edited_call_once(pending, rita, as_user, drive) -> None:
    approval = ask(pending, {**TWO_PEOPLE, "approvals": 1})
    client = as_user(rita)
    body = {"args": json.dumps({"entry": "pay ACME 90"}), "note": "the invoice says 90"}
    response = client.decide(approval.pk, "approve", htmx=True, **body)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Approved" in html and "Edited by <strong class=\"who\">rita</strong>" in html and "pay ACME 90" in html
    assert client.decide(approval.pk, "approve", htmx=True, **body).status_code == 200  # a double click
    run = drive(Run.objects.get(pk=approval.run_id))
    assert [e.entry for e in LedgerEntry.objects.filter(run=run)] == ["pay ACME 90"]

    timeline = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Arguments edited by <strong class=\"who\">rita</strong>: “the invoice says 90”" in timeline
    assert '<span class="diff-del">-   &quot;entry&quot;: &quot;pay ACME 100&quot;</span>' in timeline
    assert '<span class="diff-add">+   &quot;entry&quot;: &quot;pay ACME 90&quot;</span>' in timeline


@pytest.mark.parametrize(
    "typed,why",
    [
        ("{not json", "Not approved: the arguments are not valid JSON"),
        ('["a list"]', "Not approved: the arguments must be a JSON object"),
        ('{"entry": "x", "extra": 1}', "Not approved: invalid_arguments: (root): Additional properties"),
        ('{"entry": "pay 1000"}', "Not approved: the edited call is denied: no four-figure entries (rule: no four"),
    ],
)
def test_a_refused_edit_comes_back_with_the_editor_open_and_why(pending, rita, as_user, typed, why) -> None:
    approval = ask(pending, BIG, {**TWO_PEOPLE, "approvals": 1})
    response = as_user(rita).decide(approval.pk, "approve", htmx=True, args=typed)
    assert response.status_code == 200
    html = response.content.decode()
    assert why in html
    assert re.search(r'<textarea name="args"[^>]*>', html).group(0).endswith('spellcheck="false">')  # enabled
    assert json.dumps(typed)[1:-1].replace('"', "&quot;").replace("\\&quot;", "&quot;") in html
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_a_refused_edit_without_htmx_redirects_with_the_reason(pending, rita, as_user) -> None:
    approval = ask(pending, BIG, {**TWO_PEOPLE, "approvals": 1})
    client = as_user(rita)
    response = client.decide(approval.pk, "approve", args='{"entry": "pay 1000"}')
    assert response.status_code == 303
    assert "no four-figure entries" in client.get(response["Location"]).content.decode()


# -- votes --------------------------------------------------------------------------------


def test_the_card_counts_votes_and_tells_a_voter_they_voted(pending, rita, rob, as_user) -> None:
    approval = ask(pending)
    assert "0 of 2 approvals" in card_html(as_user(rob), approval)
    response = as_user(rita).decide(approval.pk, "approve", htmx=True)
    html = response.content.decode()
    assert "Your vote is recorded: 1 of 2 approvals." in html
    assert "You already voted (approve); waiting for 1 more approval from other reviewers." in html

    mine = card_html(as_user(rita), approval)
    assert '<strong class="count">1 of 2 approvals</strong>: <span class="voter">rita</span> (approve)' in mine
    assert f'id="approval-{approval.pk}-quorum"' in mine
    assert ">Approve</button>" not in mine and "You already voted" in mine
    theirs = card_html(as_user(rob), approval)
    assert "1 of 2 approvals" in theirs and ">Approve</button>" in theirs and "You already voted" not in theirs

    assert as_user(rob).decide(approval.pk, "approve", htmx=True).status_code == 200
    assert Approval.objects.get(pk=approval.pk).status == "approved"


def test_the_poll_sends_the_counter_of_a_card_the_page_keeps(pending, rita, rob, as_user) -> None:
    approval = ask(pending)
    approval_decide(approval_id=approval.pk, user=rob, decision="approve")
    listed = as_user(rita).get(f"/reviews/list/?shown={approval.pk}", headers={"HX-Request": "true"})
    html = listed.content.decode()
    assert f'<article class="card" id="approval-{approval.pk}" data-approval-id="{approval.pk}" hx-preserve="true"></article>' in html
    assert re.search(
        rf'<p class="quorum" id="approval-{approval.pk}-quorum" hx-swap-oob="true"><strong class="count">1 of 2 approvals',
        html,
    )


def test_voting_twice_from_the_card_changes_nothing(pending, rita, as_user) -> None:
    approval = ask(pending)
    client = as_user(rita)
    client.decide(approval.pk, "approve", htmx=True)
    again = client.decide(approval.pk, "reject", htmx=True).content.decode()
    assert "You had already voted on this call: nothing changed." in again
    assert Approval.objects.get(pk=approval.pk).status == "pending"


# -- separation of duties ---------------------------------------------------------------


def test_the_launcher_sees_no_buttons_and_why(pending, rob, as_user) -> None:
    boss = person("boss", "reviewer", "launcher")
    approval = ask(pending, {**TWO_PEOPLE, "approvals": 1}, separate_duties=True)
    Run.objects.filter(pk=approval.run_id).update(created_by=boss)
    html = card_html(as_user(boss), approval)
    assert "You launched this run and its policy separates duties: another reviewer must decide." in html
    assert "<button" not in html
    response = as_user(boss).decide(approval.pk, "approve")
    assert response.status_code == 403 and Approval.objects.get(pk=approval.pk).status == "pending"
    # Posted without htmx (the approval's page without JS): the error page, not bare text.
    page = response.content.decode()
    assert response["Content-Type"].startswith("text/html") and 'class="topnav"' in page
    assert "another reviewer must decide" in page and "Go back" in page
    # With htmx, the line reviews.js puts into the card's form.
    response = as_user(boss).decide(approval.pk, "approve", htmx=True)
    assert response.status_code == 403 and response["Content-Type"].startswith("text/plain")
    assert ">Approve</button>" in card_html(as_user(rob), approval)


# -- expiry -------------------------------------------------------------------------------


def test_the_card_shows_the_time_left_and_marks_the_last_fifth(pending, rita, as_user) -> None:
    approval = ask(pending, approval_timeout_seconds=600)
    html = card_html(as_user(rita), approval)
    assert re.search(r'class="expires" data-until="\d+" data-total="600">expires in <time[^>]*>9 min</time>', html)
    now = timezone.now()
    Approval.objects.filter(pk=approval.pk).update(
        created_at=now - dt.timedelta(seconds=500), expires_at=now + dt.timedelta(seconds=100)
    )
    assert 'class="expires expiring"' in card_html(as_user(rita), approval)


def test_the_queue_sorts_by_expires_soonest(pending, rita, as_user) -> None:
    later = ask(pending, approval_timeout_seconds=600)
    sooner = ask(pending, approval_timeout_seconds=60)
    never = ask(pending)

    def order(query: str) -> list[int]:
        page = as_user(rita).get(f"/reviews/{query}").content.decode()
        return [int(i) for i in re.findall(r'<article[^>]*data-approval-id="(\d+)"', page)]

    assert order("") == [later.pk, sooner.pk, never.pk]
    assert order("?sort=expires") == [sooner.pk, later.pk, never.pk]
    assert 'value="expires" selected' in as_user(rita).get("/reviews/?sort=expires").content.decode()


def test_an_expired_approval_is_named_so_on_the_timeline(pending, rita, as_user, drive) -> None:
    approval = ask(pending, approval_timeout_seconds=60)
    assert approval_expire(approval_id=approval.pk, owner="sweeper:test", now=approval.expires_at.timestamp() + 1)
    late = as_user(rita).decide(approval.pk, "approve", htmx=True).content.decode()
    assert "this call is expired (nobody answered in time)" in late
    run = drive(Run.objects.get(pk=approval.run_id))
    page = as_user(rita).get(f"/runs/{run.pk}/").content.decode()
    assert "Approval expired: no reviewer answered within 60 s; the agent was told and goes on." in page
    assert '<span class="status status-expired">expired</span>' in page and "nobody (expired)" in page
    assert "status-rejected" not in page


def test_a_two_person_decision_names_both_voters_on_the_timeline(pending, rita, rob, as_user, drive) -> None:
    approval = ask(pending)
    approval_decide(approval_id=approval.pk, user=rita, decision="approve", note="checked the invoice")
    page = as_user(rob).get(f"/runs/{approval.run_id}/").content.decode()
    assert "needing 2 votes" in page and "Votes so far: <strong class=\"who\">rita</strong> approve" in page
    approval_decide(approval_id=approval.pk, user=rob, decision="approve")
    page = as_user(rob).get(f"/runs/{approval.run_id}/").content.decode()
    assert ('Votes: <strong class="who">rita</strong> approve (“checked the invoice”), '
            '<strong class="who">rob</strong> approve') in page


def test_a_decided_card_is_worded_as_decided(pending, rita, as_user) -> None:
    approval = pending()
    assert "(exactly what will run)" in card_html(as_user(rita), approval)
    html = as_user(rita).decide(approval.pk, "reject", htmx=True).content.decode()
    assert '<strong class="verdict">Rejected</strong> by <strong class="who">rita</strong>' in html
    assert '<strong class="count">0 of 1 approvals</strong>: <span class="voter">rita</span> (reject)' in html
    assert "exactly what will run" not in html
    assert "Arguments <span class=\"muted\">(as the agent proposed them; not run)</span>" in html
