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
    response = client.get("/reviews/?after=abc")
    assert response.status_code == 400 and "“after=abc” in the link is not the number of a call" in response.content.decode()
    assert ids(response.content.decode())[:1] == [five[0].pk]  # the first page, instead
    # A launcher sees only their own runs' approvals: another's id is no cursor for them.
    response = as_user(lena).get(f"/reviews/?after={five[0].pk}")
    assert response.status_code == 400 and "names no call you can see in the queue" in response.content.decode()


@pytest.mark.parametrize("after", ["zzz", "²", "99999999999999999999999", "-1", "999999"])
def test_a_bad_cursor_in_the_lists_fragment_opened_as_a_page_is_the_queue_page_saying_so(five, rita, as_user, after) -> None:
    # A copied "more" link, or one typed: the fragment's URL opened without htmx.
    for url in (f"/reviews/list/?after={after}", f"/reviews/list/?more=1&loaded=2&after={after}", f"/reviews/?after={after}"):
        response = as_user(rita).get(url)
        page = response.content.decode()
        assert response.status_code == 400, (url, response.status_code)
        assert 'class="topnav"' in page and "<h1>Review queue</h1>" in page  # the site layout
        assert 'role="alert" id="queue-refused"' in page and "this is the first page of the queue instead" in page
        assert '<a href="/reviews/">Back to the first cards</a>' in page
        assert ids(page) == [five[0].pk, five[1].pk]
        assert "invalid cursor" not in page


def test_a_bad_cursor_in_an_htmx_answer_is_said_where_it_is_swapped_in(five, rita, as_user) -> None:
    client = as_user(rita)
    # "Show more": the answer replaces the more form; it says why and adds no cards.
    response = client.get("/reviews/list/?more=1&loaded=2&after=zzz&tool=echo", headers=HTMX)
    html = response.content.decode()
    assert response.status_code == 200  # htmx swaps only a 2xx answer
    assert 'role="alert" id="queue-refused"' in html and "“after=zzz” in the link is not the number of a call" in html
    assert '<a href="/reviews/?tool=echo">Back to the first cards</a>' in html
    assert ids(html) == [] and "<html" not in html
    # A poll: the first page, with the same words above it.
    response = client.get("/reviews/list/?after=zzz", headers=HTMX)
    html = response.content.decode()
    assert response.status_code == 200 and "this is the first page of the queue instead" in html
    assert ids(html) == [five[0].pk, five[1].pk] and "<html" not in html


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
