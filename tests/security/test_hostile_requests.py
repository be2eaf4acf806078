"""Hostile query strings, ids and headers on the pages: a 4xx or a normal page, never a
500; an open redirect through the login form's `next` is refused; a forged log line in
a path stays one escaped line."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

pytestmark = [pytest.mark.reliability, pytest.mark.django_db]

HUGE = "9" * 30
ODD = ["-1", "0", HUGE, f"-{HUGE}", "1e400", "nan", "%00", "\x00", "1.2.3", "' OR 1=1 --", "<script>", "\u202e", "²"]


def hostile_urls(run_id: int, approval_id: int) -> list[str]:
    urls = [f"/runs/{HUGE}/", f"/runs/{HUGE}/export/", f"/reviews/{HUGE}/approve/", f"/reviews/{HUGE}/"]
    for v in ODD:
        urls += [
            f"/runs/?before={v}",
            f"/runs/?after={v}",
            f"/runs/?before={v}.{v}",
            f"/runs/?after=1700000000000000.{v}",
            f"/runs/?before={HUGE}.1",
            f"/runs/?state={v}&agent={v}&tainted={v}&q={v}",
            f"/runs/?since={v}&until={v}",
            f"/runs/{run_id}/?after={v}",
            f"/runs/{run_id}/?after={v}&live=1",
            f"/reviews/?agent={v}&tool={v}&risk={v}",
            f"/reviews/list/?keep={v}&shown={v}",
            # The API's lists (through the session): a 400 naming the field, never a 500.
            f"/api/runs?state={v}&agent={v}&launched_by={v}&q={v}",
            f"/api/runs?since={v}&until={v}&after={v}&limit={v}",
            f"/api/runs/export?since={v}&until={v}&transitions={v}&launched_by={v}",
            f"/api/approvals?status={v}&tool={v}&q={v}&after={v}&limit={v}",
        ]
    return urls


def test_hostile_query_strings_and_ids_never_make_a_500(people, pending) -> None:
    approval = pending(user=people["other"])
    client = Client(raise_request_exception=False)
    client.force_login(people["superuser"])
    failures = []
    for url in hostile_urls(approval.run_id, approval.pk):
        status = client.get(url).status_code
        if status >= 500:
            failures.append((url, status))
    for url in [f"/reviews/{HUGE}/approve/", f"/runs/{HUGE}/cancel/"]:
        status = client.post(url, {"note": "x"}).status_code
        if status >= 500:
            failures.append((url, status))
    assert failures == []


@pytest.mark.parametrize(
    "target", ["https://evil.example/", "//evil.example/", "/\\evil.example", "javascript:alert(1)"]
)
def test_the_login_form_does_not_redirect_off_site(people, target) -> None:
    client = Client()
    response = client.post(f"/login/?next={target}", {"username": "root", "password": "correct horse battery"})
    assert response.status_code == 302
    assert response["Location"] == "/"


def test_a_forged_log_line_in_a_path_stays_one_escaped_line(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="airlock.access")
    forged = "denied status=403 method=POST path=/forged user=root"
    # The admin sends an anonymous visitor to its login form from any path under /admin/;
    # a carriage return or an escape sequence must not reach the log as such.
    response = Client().get("/admin/x%0D" + forged.replace(" ", "%20") + "%1B[2K/")
    assert response.status_code == 302
    lines = [r.getMessage() for r in caplog.records if r.name == "airlock.access"]
    assert len(lines) == 1, lines
    assert "\r" not in lines[0] and "\x1b" not in lines[0], lines
    assert "path=/admin/x\\r" + forged in lines[0]
