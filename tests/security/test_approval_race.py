"""Fifty reviewers answer one call at the same instant over HTTP: one decision, one effect.

The requests go through a live server (Django's threaded WSGI server: one thread and
one database connection per request) with bearer tokens, released together by a barrier.
"""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from agents.actions.tokens import token_create
from agents.models import Approval, LedgerEntry, Run, Transition
from agents.runs import driver
from tests.helpers import at_once, person, requires_postgres

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True), requires_postgres()]

THREADS = 50


def reviewers(n: int) -> list[tuple[User, str]]:
    out = []
    for i in range(n):
        user = person(f"reviewer{i:02d}", "reviewer")
        out.append((user, token_create(user=user)[1]))
    return out


def race(url: str, approval: Approval, answers: list[tuple[str, str]]) -> list[tuple[int, Any]]:
    """POST every (token, decision) at once; returns (status, json) in the same order."""

    def answer(i: int) -> tuple[int, Any]:
        token, decision = answers[i]
        with httpx.Client(base_url=url, timeout=60) as client:
            r = client.post(
                f"/api/approvals/{approval.pk}/decision",
                json={"decision": decision, "note": f"answer {i}"},
                headers={"Authorization": f"Bearer {token}"},
            )
            return r.status_code, r.json()

    return at_once(answer, range(len(answers)))


def exits_from_waiting(run: Run) -> int:
    return Transition.objects.filter(run=run, from_state="awaiting_approval").count()


def test_fifty_simultaneous_approvals_record_one_decision_and_one_ledger_row(wide_server, pending, defaults) -> None:
    approval = pending()
    people = reviewers(THREADS)
    results = race(wide_server, approval, [(token, "approve") for _user, token in people])

    statuses = [s for s, _ in results]
    assert statuses == [200] * THREADS, sorted(set(statuses))
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decision == "approve"
    winner = approval.decided_by.get_username()
    # Every answer, winner's and losers', is the one recorded decision, unchanged.
    shown = {(b["status"], b["decided_by"], b["note"], b["decided_at"]) for _, b in results}
    assert len(shown) == 1, shown
    assert shown.pop()[:3] == ("approved", winner, approval.note)
    assert Approval.objects.filter(run=approval.run).count() == 1
    assert exits_from_waiting(approval.run) == 1

    run = driver.drive(approval.run_id)
    assert run.state == "done", run.error
    assert LedgerEntry.objects.filter(run=run).count() == 1
    assert exits_from_waiting(run) == 1


def test_forty_approvals_and_ten_rejections_at_once_one_wins_the_rest_agree_or_get_409(
    wide_server, pending, defaults
) -> None:
    approval = pending()
    people = reviewers(THREADS)
    decisions = ["approve"] * 40 + ["reject"] * 10
    random.Random(9).shuffle(decisions)
    answers = [(token, d) for (_user, token), d in zip(people, decisions, strict=True)]
    results = race(wide_server, approval, answers)

    approval.refresh_from_db()
    won = approval.decision
    assert won in ("approve", "reject") and approval.status == {"approve": "approved", "reject": "rejected"}[won]
    winner = approval.decided_by.get_username()
    for (status, body), decision in zip(results, decisions, strict=True):
        if decision == won:
            assert status == 200, body
            assert (body["status"], body["decided_by"]) == (approval.status, winner)
        else:
            assert status == 409, body
            assert body["error"] == "already_decided"
            assert body["detail"]["approval"]["decided_by"] == winner
    assert sum(1 for s, _ in results if s == 200) == decisions.count(won)
    assert sum(1 for s, _ in results if s == 409) == THREADS - decisions.count(won)
    assert exits_from_waiting(approval.run) == 1

    run = driver.drive(approval.run_id)
    assert run.state == "done", run.error
    assert LedgerEntry.objects.filter(run=run).count() == (1 if won == "approve" else 0)
    assert exits_from_waiting(run) == 1
    print(f"race: {won} won ({winner}); 200={decisions.count(won)} 409={THREADS - decisions.count(won)}")


def test_fifty_reviewers_clicking_approve_in_their_browsers_at_once_run_the_call_once(wide_server, pending) -> None:
    """The same race through the review page's form POST: sessions and CSRF tokens."""
    from django.test import Client
    from django.utils.crypto import get_random_string

    approval = pending()
    sessions = []
    for i in range(THREADS):
        client = Client()
        client.force_login(person(f"clicker{i:02d}", "reviewer"))
        sessions.append(client.cookies["sessionid"].value)
    def click(i: int) -> tuple[int, str]:
        secret = get_random_string(32)
        cookies = {"sessionid": sessions[i], "csrftoken": secret}
        with httpx.Client(base_url=wide_server, timeout=60, cookies=cookies) as client:
            r = client.post(
                f"/reviews/{approval.pk}/approve/",
                data={"note": f"click {i}"},
                headers={"X-CSRFToken": secret, "HX-Request": "true", "Referer": wide_server + "/reviews/"},
            )
            return r.status_code, r.text

    results = at_once(click, range(THREADS))
    assert [s for s, _ in results] == [200] * THREADS, sorted({s for s, _ in results})
    approval.refresh_from_db()
    winner = approval.decided_by.get_username()
    told = [body for _, body in results if f"{winner} decided first" in body]
    assert len(told) == THREADS - 1  # every loser's card names the winner
    assert exits_from_waiting(approval.run) == 1
    run = driver.drive(approval.run_id)
    assert run.state == "done" and LedgerEntry.objects.filter(run=run).count() == 1
