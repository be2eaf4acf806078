"""Error pages: the site layout, the reason the server knows, a way back; JSON under /api/."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

from tests.helpers import client_for


def test_a_refused_launch_says_only_launchers_start_runs_in_the_layout(rita: User) -> None:
    response = client_for(rita).get("/runs/new/")
    assert response.status_code == 403
    page = response.content.decode()
    assert "only launchers start runs" in page
    assert 'class="topnav"' in page  # the site layout, with its navigation
    assert "Go back" in page


def test_an_unknown_run_is_a_404_page_with_a_way_back(otto: User) -> None:
    response = client_for(otto).get("/runs/999999/", HTTP_REFERER="http://testserver/runs/")
    assert response.status_code == 404
    page = response.content.decode()
    assert "Not found" in page and "no run 999999" in page
    assert 'href="http://testserver/runs/"' in page
    assert 'class="topnav"' in page


def test_a_url_that_matches_nothing_is_the_same_404_page(otto: User) -> None:
    response = client_for(otto).get("/no-such-page/")
    assert response.status_code == 404
    assert "Not found" in response.content.decode()
    assert "tried" not in response.content.decode()


def test_a_stale_form_token_is_explained_not_djangos_default(otto: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(otto)
    response = client.post("/runs/1/cancel/", {"csrfmiddlewaretoken": "stale"})
    assert response.status_code == 403
    page = response.content.decode()
    assert "Form expired" in page and "reload the page" in page
    assert 'class="topnav"' in page
    assert "CSRF verification failed" not in page


def test_a_bad_queue_cursor_is_said_inside_the_queue_page(rita: User) -> None:
    response = client_for(rita).get("/reviews/?after=zzz")
    assert response.status_code == 400
    page = response.content.decode()
    assert "Review queue" in page
    assert "“after=zzz” in the link is not the number of a call" in page and "first page of the queue" in page
    assert '<a href="/reviews/">Back to the first cards</a>' in page


def test_a_bad_cursor_in_the_queue_lists_url_is_the_queue_page_not_bare_text(rita: User) -> None:
    response = client_for(rita).get("/reviews/list/?after=zzz")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "<h1>Review queue</h1>" in page and 'class="topnav"' in page
    assert "“after=zzz” in the link is not the number of a call, so this is the first page of the queue instead." in page
    assert '<a href="/reviews/">Back to the first cards</a>' in page


def test_a_bad_stats_window_is_said_inside_the_stats_page(otto: User) -> None:
    response = client_for(otto).get("/reviews/stats/?days=zzz")
    assert response.status_code == 400
    page = response.content.decode()
    assert "<h1>Review statistics</h1>" in page and 'class="topnav"' in page
    assert ("Invalid window: days must be one of 1, 7, 30, 90, not &#x27;zzz&#x27;,"
            " so these are the last 7 days instead.") in page
    assert 'href="/reviews/stats/?days=30"' in page  # the windows it takes, one click away


def test_api_refusals_stay_json(api) -> None:  # type: ignore[no-untyped-def]
    response = api("otto").get("/api/runs/999999")
    assert response.status_code == 404
    assert response.data["error"]
    response = Client().get("/api/no-such-thing")
    assert response["Content-Type"].startswith("application/json")
