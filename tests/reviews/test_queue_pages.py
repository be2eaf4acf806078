"""The queue in pages: a first page of cards, "Show more" by keyset (with htmx and
without), the count of the rest, polls that keep appended cards, constant queries."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.models import Approval
from reviews import cards

pytestmark = pytest.mark.django_db
HTMX = {"HX-Request": "true"}


def ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<article[^>]*data-approval-id="(\d+)"', html)]


def full_cards(html: str) -> list[int]:
    """Cards rendered whole (a stand-in for a card on screen is an empty article)."""
    return [int(i) for i in re.findall(r'<article class="card card-[^"]*"[^>]*data-approval-id="(\d+)"', html)]


def more_form(html: str) -> str:
    found = re.search(r'<form id="queue-more".*?</form>', html, re.S)
    return found.group(0) if found else ""


@pytest.fixture
def five(pending, monkeypatch) -> list[Approval]:
    monkeypatch.setattr(cards, "PAGE", 2)
    return [pending(task=f"task {i}") for i in range(5)]


def test_the_first_page_shows_a_page_of_cards_and_counts_the_rest(five, rita, as_user) -> None:
    html = as_user(rita).get("/reviews/").content.decode()
    assert ids(html) == [five[0].pk, five[1].pk]
    assert "5 calls waiting" in html
    form = more_form(html)
    assert 'method="get" action="/reviews/"' in form and 'hx-get="/reviews/list/"' in form
    assert f'name="after" value="{five[1].pk}"' in form and 'name="loaded" value="2"' in form
    assert '<p class="muted" id="queue-rest">3 more calls waiting after these.</p>' in form
    assert '<button type="submit" aria-describedby="queue-rest">Show 2 more</button>' in form


def test_show_more_with_htmx_answers_the_next_cards_and_the_next_form(five, rita, as_user) -> None:
    client = as_user(rita)
    more = client.get(f"/reviews/list/?more=1&loaded=2&after={five[1].pk}", headers=HTMX).content.decode()
    assert full_cards(more) == [five[2].pk, five[3].pk]
    assert "<html" not in more and "queue-count" not in more  # only what is appended
    form = more_form(more)
    assert f'name="after" value="{five[3].pk}"' in form and 'name="loaded" value="4"' in form
    assert "1 more call waiting after these." in form and "Show 1 more" in form
    last = client.get(f"/reviews/list/?more=1&loaded=4&after={five[3].pk}", headers=HTMX).content.decode()
    assert full_cards(last) == [five[4].pk] and more_form(last) == ""


def test_without_htmx_the_more_form_is_the_page_after_the_cursor(five, rita, as_user) -> None:
    html = as_user(rita).get(f"/reviews/?after={five[1].pk}").content.decode()
    assert "<html" in html and ids(html) == [five[2].pk, five[3].pk]
    assert "5 calls waiting" in html and "1 more call waiting after these." in html
    assert f'name="after" value="{five[3].pk}"' in more_form(html)
    assert '<a href="/reviews/">Back to the first cards</a>' in html
    # The form as a browser without JavaScript sends it: a page of its own, counted afresh.
    sent = as_user(rita).get(f"/reviews/?after={five[1].pk}&more=1&loaded=198").content.decode()
    assert "<html" in sent and ids(sent) == [five[2].pk, five[3].pk] and 'name="loaded" value="2"' in sent
    # That page's poll stays on its cards.
    assert f'hx-get="/reviews/list/?after={five[1].pk}"' in html


def test_the_cursor_follows_the_chosen_order_and_the_filters(five, rita, as_user) -> None:
    now = timezone.now()
    # Expiry order: 3, 1, 4, then the two without an expiry (0 then 2, oldest first).
    for i, minutes in ((3, 5), (1, 10), (4, 20)):
        Approval.objects.filter(pk=five[i].pk).update(expires_at=now + dt.timedelta(minutes=minutes))
    Approval.objects.filter(pk__in=[five[0].pk, five[2].pk]).update(expires_at=None)
    client = as_user(rita)
    html = client.get("/reviews/?sort=expires").content.decode()
    seen = ids(html)
    while form := more_form(html):
        assert 'name="sort" value="expires"' in form
        cursor = re.search(r'name="after" value="(\d+)"', form).group(1)
        html = client.get(f"/reviews/list/?sort=expires&more=1&after={cursor}", headers=HTMX).content.decode()
        seen += ids(html)
    assert seen == [five[3].pk, five[1].pk, five[4].pk, five[0].pk, five[2].pk]
    # A filter travels with the cursor: no card of another tool follows.
    html = client.get(f"/reviews/?tool=echo&after={five[1].pk}").content.decode()
    assert ids(html) == [] and "No pending calls match these filters." in html


def test_a_poll_keeps_the_appended_cards_without_sending_them_again(five, pending, rita, as_user) -> None:
    client = as_user(rita)
    shown = "&".join(f"shown={a.pk}" for a in five[:4])  # a first page and one "more"
    poll = client.get(f"/reviews/list/?{shown}", headers=HTMX).content.decode()
    assert ids(poll) == [a.pk for a in five[:4]] and full_cards(poll) == []  # stand-ins only
    assert f'name="after" value="{five[3].pk}"' in more_form(poll) and "1 more call" in poll
    # Someone else decides the second card; a new call arrives; all five are on screen.
    client.decide(five[1].pk, "approve")
    newer = pending(task="newer")
    shown = "&".join(f"shown={a.pk}" for a in five)
    poll = client.get(f"/reviews/list/?{shown}", headers=HTMX).content.decode()
    assert ids(poll) == [five[0].pk, five[2].pk, five[3].pk, five[4].pk, newer.pk]
    assert full_cards(poll) == [newer.pk] and more_form(poll) == ""
    # The reviewer who decided keeps the decided card, as a stand-in too.
    poll = client.get(f"/reviews/list/?{shown}&keep={five[1].pk}", headers=HTMX).content.decode()
    assert ids(poll)[:2] == [five[0].pk, five[1].pk] and full_cards(poll) == [newer.pk]


def test_past_the_loaded_limit_more_is_a_new_page(five, rita, as_user, monkeypatch) -> None:
    monkeypatch.setattr(cards, "LOADED_MAX", 4)
    more = as_user(rita).get(f"/reviews/list/?more=1&loaded=2&after={five[1].pk}", headers=HTMX).content.decode()
    form = more_form(more)
    assert 'action="/reviews/"' in form and "hx-get" not in form and 'name="more"' not in form


def test_a_bad_cursor_is_a_clear_400(five, rita, as_user, lena) -> None:
    client = as_user(rita)
    # The polled fragment answers its script in a line; the page says it inside itself.
    response = client.get("/reviews/list/?more=1&after=999999", headers=HTMX)
    assert response.status_code == 400 and response.content.decode().startswith("invalid cursor:")
    response = client.get("/reviews/?after=abc")
    assert response.status_code == 400 and "is not an approval id" in response.content.decode()
    assert ids(response.content.decode())[:1] == [five[0].pk]  # the first page, instead
    # A launcher sees only their own runs' approvals: another's id is no cursor for them.
    assert as_user(lena).get(f"/reviews/?after={five[0].pk}").status_code == 400


def test_every_page_of_the_queue_runs_the_same_queries_however_many_cards(pending, rita, as_user, monkeypatch) -> None:
    monkeypatch.setattr(cards, "PAGE", 2)
    client = as_user(rita)
    small = [pending() for _ in range(3)]

    def counts(approvals: list[Approval]) -> list[int]:
        # A poll from a page holding all but the last card: stand-ins only, whatever their number.
        shown = "&".join(f"shown={a.pk}" for a in approvals[:-1])
        urls = [
            ("/reviews/", {}),
            (f"/reviews/?after={approvals[0].pk}", {}),
            (f"/reviews/list/?more=1&loaded=2&after={approvals[1].pk}", HTMX),
            (f"/reviews/list/?{shown}", HTMX),
        ]
        client.get("/reviews/")  # warm the session
        out = []
        for url, headers in urls:
            with CaptureQueriesContext(connection) as captured:
                assert client.get(url, headers=headers).status_code == 200
            out.append(len(captured))
        return out

    before = counts(small)
    monkeypatch.setattr(cards, "PAGE", 5)
    bigger = small + [pending() for _ in range(9)]
    assert counts(bigger) == before
