"""agents/access.py: the one home of who may read a run, which approvals a user sees,
and the login guard of every polled fragment. Pages and API must agree with it."""

from __future__ import annotations

import logging

import pytest
from django.http import Http404
from django.test import Client

from agents import access
from agents.actions.tokens import token_create
from agents.models import Approval
from tests.helpers import person

pytestmark = pytest.mark.django_db


def test_a_run_is_readable_by_its_launcher_and_every_reviewer_operator_and_superuser(people, pending) -> None:
    run_id = pending(user=people["launcher"]).run_id
    for role in ("launcher", "operator", "reviewer", "superuser"):
        assert access.readable_run(people[role], run_id).pk == run_id


def test_another_users_run_answers_exactly_like_a_missing_one(people, pending) -> None:
    other = pending(user=people["other"]).run_id
    with pytest.raises(access.RunHidden) as hidden:
        access.readable_run(people["launcher"], other)
    with pytest.raises(Http404) as missing:
        access.readable_run(people["launcher"], other + 1000)
    assert not isinstance(missing.value, access.RunHidden)
    assert str(hidden.value) == f"no run {other}" and str(missing.value) == f"no run {other + 1000}"
    for impossible in (0, -1, 2**63):  # no query for an id a bigint cannot hold
        with pytest.raises(Http404):
            access.readable_run(people["superuser"], impossible)


def test_pages_and_api_refuse_another_users_run_with_the_same_404_and_log_line(people, pending, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="airlock.access")
    other = pending(user=people["other"]).run_id
    page = Client()
    page.force_login(people["launcher"])
    api = Client(headers={"Authorization": f"Bearer {token_create(user=people['launcher'])[1]}"})
    for client, path in ((page, f"/runs/{other}/"), (api, f"/api/runs/{other}")):
        caplog.clear()
        response = client.get(path)
        assert response.status_code == 404
        lines = [r.getMessage() for r in caplog.records if r.name == "airlock.access"]
        assert lines == [f"denied status=404 method=GET path={path} user=lena (another user's run)"]
    assert api.get(f"/api/runs/{other}").json() == {"error": "not_found", "detail": f"no run {other}"}
    assert api.get(f"/api/runs/{other + 1000}").json() == {"error": "not_found", "detail": f"no run {other + 1000}"}
    caplog.clear()
    assert page.get(f"/runs/{other + 1000}/").status_code == 404
    assert not [r for r in caplog.records if r.name == "airlock.access"]  # a missing run is no denial


def test_visible_approvals_are_the_same_set_in_the_queue_and_the_api(people, pending, tokens) -> None:
    own = pending(user=people["launcher"])
    other = pending(user=people["other"])
    assert set(access.visible_approvals(people["launcher"])) == {own}
    assert set(access.visible_approvals(people["reviewer"])) == {own, other}
    assert not access.visible_approvals(people["superuser"]).exclude(pk__in=[own.pk, other.pk]).exists()
    for role in ("launcher", "operator", "reviewer", "superuser"):
        expected = {a.pk for a in access.visible_approvals(people[role]).filter(status="pending")}
        listed = Client(headers={"Authorization": f"Bearer {tokens[role]}"}).get("/api/approvals?status=pending")
        assert {a["id"] for a in listed.json()["items"]} == expected, role
        page = Client()
        page.force_login(people[role])
        html = page.get("/reviews/").content.decode()
        shown = {a.pk for a in Approval.objects.all() if f'data-approval-id="{a.pk}"' in html}
        assert shown == expected, role


def test_a_user_with_no_role_sees_no_approvals(defaults) -> None:
    assert not access.visible_approvals(person("nobody")).exists()


def test_the_timeline_poller_sends_an_ended_session_to_the_login_page(people, pending) -> None:
    run_id = pending(user=people["launcher"]).run_id
    poll = f"/runs/{run_id}/?live=1&after=5"
    headers = {"HX-Request": "true", "HX-Current-URL": f"http://testserver/runs/{run_id}/"}
    response = Client().get(poll, headers=headers)
    # Not the login page swapped into the timeline: the whole page goes to log in and back.
    assert response.status_code == 200 and response.content == b""
    assert response.headers["HX-Redirect"] == f"/login/?next=/runs/{run_id}/"
    plain = Client().get(f"/runs/{run_id}/")
    assert plain.status_code == 302 and plain.url == f"/login/?next=/runs/{run_id}/"
    logged_in = Client()
    logged_in.force_login(people["launcher"])
    assert 'id="poller"' in logged_in.get(poll, headers=headers).content.decode()
