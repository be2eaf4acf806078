"""/reviews/<id>/: one approval in any status, where every notification links (issue 25,
item 3: with 32 pending calls the queue's first page had 25 cards, and the link's card
was not on it)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agents.actions.approvals import approval_decide, approval_expire
from agents.models import Approval
from tests.helpers import call, final, person

pytestmark = pytest.mark.django_db

SCRIPT = [call("ledger_write", entry="pay ACME 100"), final("paid")]
TWO_PEOPLE = {"tool": "ledger_write", "then": "ask", "approvals": 2, "reason": "two people sign the ledger"}


def ids_on(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<article[^>]*data-approval-id="(\d+)"', html)]


def test_a_call_past_the_queues_first_page_has_a_page_with_its_buttons(pending, rita, as_user) -> None:
    approvals = [pending() for _ in range(32)]
    last = approvals[-1]
    client = as_user(rita)
    assert last.pk not in ids_on(client.get("/reviews/").content.decode())  # the queue shows 25

    response = client.get(f"/reviews/{last.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert ids_on(html) == [last.pk]
    assert re.search(rf'<button type="submit" class="approve"[^>]*formaction="/reviews/{last.pk}/approve/"', html)
    assert re.search(rf'<button type="submit" class="reject"[^>]*formaction="/reviews/{last.pk}/reject/"', html)
    assert ">Approve</button>" in html and ">Reject</button>" in html
    assert 'href="/reviews/" id="back-to-queue"' in html
    assert f'href="/runs/{last.run_id}/" id="run-link"' in html
    assert "No votes yet." in html


def test_deciding_on_the_page_comes_back_to_it_with_who_when_and_the_note(pending, rita, as_user) -> None:
    approval = pending()
    client = as_user(rita)
    response = client.decide(approval.pk, "reject", back="approval", note="not to every customer")
    assert response.status_code == 303 and response["Location"] == f"/reviews/{approval.pk}/"
    assert Approval.objects.get(pk=approval.pk).status == "rejected"

    html = client.get(response["Location"]).content.decode()
    assert 'data-status="rejected"' in html
    assert "Rejected by rita via dashboard at" in html and "<time" in html
    assert "not to every customer" in html
    assert ">Approve</button>" not in html and ">Reject</button>" not in html
    assert re.search(r'<tr class="vote">\s*<td class="who">rita</td>\s*<td>reject</td>', html)


def test_the_queue_still_comes_back_to_the_queue(pending, rita, as_user) -> None:
    approval = pending()
    response = as_user(rita).decide(approval.pk, "approve")
    assert response.status_code == 303 and response["Location"] == "/reviews/"


def test_every_vote_is_listed(pending, rita, rob, as_user) -> None:
    approval = pending(SCRIPT, policy={"rules": [TWO_PEOPLE]})
    approval_decide(approval_id=approval.pk, user=rita, decision="approve", note="looks right")
    html = as_user(rob).get(f"/reviews/{approval.pk}/").content.decode()
    assert 'data-status="pending"' in html and ">Approve</button>" in html  # rob may still vote
    assert re.search(r'<td class="who">rita</td>\s*<td>approve</td>.*?<td>looks right</td>', html, re.S)
    approval_decide(approval_id=approval.pk, user=rob, decision="approve")
    html = as_user(rita).get(f"/reviews/{approval.pk}/").content.decode()
    assert 'data-status="approved"' in html
    assert [m for m in re.findall(r'<td class="who">(\w+)</td>', html)] == ["rita", "rob"]


def test_an_expired_call_says_nobody_answered(pending, rita, as_user) -> None:
    approval = pending(SCRIPT, policy={"rules": [{**TWO_PEOPLE, "approvals": 1}], "approval_timeout_seconds": 60})
    assert approval_expire(approval_id=approval.pk, owner="sweeper:test", now=approval.expires_at.timestamp() + 1)
    html = as_user(rita).get(f"/reviews/{approval.pk}/").content.decode()
    assert 'data-status="expired"' in html and "nobody answered in time" in html
    assert ">Approve</button>" not in html


def test_a_denied_call_says_the_run_had_no_approver(launch, drive, rita, as_user) -> None:
    run = drive(launch([*SCRIPT[:1], final("ok")], approver="none", policy={"rules": [{**TWO_PEOPLE, "approvals": 1}]}))
    approval = Approval.objects.get(run=run)
    html = as_user(rita).get(f"/reviews/{approval.pk}/").content.decode()
    assert 'data-status="denied"' in html and "by policy: the run has no approver" in html
    assert ">Approve</button>" not in html


def test_model_text_on_the_page_is_inert(pending, rita, as_user) -> None:
    approval = pending(task="<script>alert(1)</script> <img src=x onerror=alert(2)>")
    html = as_user(rita).get(f"/reviews/{approval.pk}/").content.decode()
    assert "<script>alert(1)" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.parametrize("who", ["leo", "nina"])
def test_someone_who_may_not_see_it_gets_the_404_of_a_missing_one(pending, lena, who, as_user) -> None:
    approval = pending(user=lena)  # lena's run: her own launcher may read it, leo may not
    viewer = person(who, "launcher") if who == "leo" else person(who)
    client = as_user(viewer)
    hidden = client.get(f"/reviews/{approval.pk}/")
    missing = client.get("/reviews/999999999/")
    assert hidden.status_code == missing.status_code == 404

    def same(content: bytes, pk: str) -> bytes:
        # The page's CSRF token is masked afresh in every answer: noise, not a tell.
        content = re.sub(rb'"X-CSRFToken": "[^"]*"', b"", content)
        content = re.sub(rb'name="csrfmiddlewaretoken" value="[^"]*"', b"", content)
        return content.replace(f"no approval {pk}".encode(), b"no approval N")

    assert same(hidden.content, str(approval.pk)) == same(missing.content, "999999999")
    assert as_user(lena).get(f"/reviews/{approval.pk}/").status_code == 200  # read-only: no buttons
    assert ">Approve</button>" not in as_user(lena).get(f"/reviews/{approval.pk}/").content.decode()


@pytest.mark.parametrize("path", ["/reviews/0/", "/reviews/99999999999999999999/"])
def test_ids_no_row_can_have_are_404(rita, as_user, path: str) -> None:
    assert as_user(rita).get(path).status_code == 404


def test_anonymous_is_sent_to_login(pending) -> None:
    from django.test import Client

    approval = pending()
    response = Client().get(f"/reviews/{approval.pk}/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_run_page_links_to_the_calls_page(pending, rita, as_user) -> None:
    approval = pending()
    html = as_user(rita).get(f"/runs/{approval.run_id}/").content.decode()
    assert f'<a href="/reviews/{approval.pk}/" id="run-pending-link">' in html
    assert f'<a href="/reviews/{approval.pk}/" class="approval-link">#{approval.pk}</a>' in html
    timeline: Any = as_user(rita).get(f"/runs/{approval.run_id}/").content.decode()
    assert f'<a class="approval-link" href="/reviews/{approval.pk}/">Approval #{approval.pk}</a> requested' in timeline


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_a_purged_runs_call_says_it_was_purged_with_the_hash_and_the_decision_record(
    pending, drive, rita, as_user
) -> None:
    from agents.engine.fingerprints import args_hash
    from agents.runs.retention import purge

    approval = pending()
    sha = args_hash(approval.args)
    approval_decide(approval_id=approval.pk, user=rita, decision="approve", note="checked the ACME order")
    drive(approval.run)
    assert purge(actor="test", older_than_days=0, only=[approval.run_id]).runs == 1

    html = as_user(rita).get(f"/reviews/{approval.pk}/").content.decode()
    assert 'id="approval-purged"' in html and "Content purged" in html
    assert f'<code id="args-sha256">{sha}</code>' in html and f'<code class="args-sha256">{sha}</code>' in html
    assert "Decision record" in html and "Approved by rita via dashboard" in html
    assert "The arguments were purged with the run" in html
    # Not a "null" where the arguments were, nor an empty task box.
    assert ">null<" not in html and "<pre></pre>" not in html
    assert "checked the ACME order" not in html
    assert "The text was purged with the run" in html  # the untrusted passage, gone too
