"""The queue's claim filters (Mine, Unclaimed) and text search, kept in every URL the
page makes (polls, "more", decisions, claims); bad values are said, never a 500."""

from __future__ import annotations

import datetime as dt
import re
from urllib.parse import quote

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.actions.approvals import approval_decide
from agents.actions.claims import approval_claim
from agents.models import Approval
from reviews import cards
from tests.helpers import tainted_write

pytestmark = pytest.mark.django_db
HTMX = {"HX-Request": "true"}


def shown(client, query: str, *, path: str = "/reviews/") -> set[int]:
    response = client.get(f"{path}{query}", headers=HTMX if path != "/reviews/" else {})
    assert response.status_code == 200, response.content[:300]
    return {int(i) for i in re.findall(r'<article[^>]*data-approval-id="(\d+)"', response.content.decode())}


@pytest.fixture
def three(pending, rita, rob) -> dict[str, Approval]:
    """Rita's claim, rob's claim, and a call nobody claimed."""
    made = {
        "ritas": pending(tainted_write("refund 10 EUR to customer 1042")),
        "robs": pending(tainted_write("refund 99 EUR to IBAN XX00 ATTACKER")),
        "free": pending(tainted_write("a note: 50%_off"), task="Answer the SHIPPING question"),
    }
    approval_claim(approval_id=made["ritas"].pk, user=rita)
    approval_claim(approval_id=made["robs"].pk, user=rob)
    return made


def test_mine_and_unclaimed(three, rita, rob, as_user) -> None:
    client = as_user(rita)
    assert shown(client, "") == {a.pk for a in three.values()}
    assert shown(client, "?claimed=me") == {three["ritas"].pk}
    assert shown(client, "?claimed=none") == {three["free"].pk}
    assert shown(as_user(rob), "?claimed=me") == {three["robs"].pk}
    # A lapsed claim is no claim: rob's call is unclaimed again, and no longer his.
    Approval.objects.filter(pk=three["robs"].pk).update(claimed_until=timezone.now() - dt.timedelta(seconds=1))
    assert shown(client, "?claimed=none") == {three["robs"].pk, three["free"].pk}
    assert shown(as_user(rob), "?claimed=me") == set()
    # The list the page polls filters the same way.
    assert shown(client, "?claimed=me", path="/reviews/list/") == {three["ritas"].pk}


def test_search_looks_in_the_task_the_tool_and_the_arguments(three, rita, as_user) -> None:
    client = as_user(rita)
    every = {a.pk for a in three.values()}
    assert shown(client, "?q=shipping") == {three["free"].pk}  # the task, in any case
    assert shown(client, "?q=LEDGER_W") == every  # the tool
    assert shown(client, "?q=iban+xx00") == {three["robs"].pk}  # argument text
    assert shown(client, "?q=customer+1042") == {three["ritas"].pk}
    assert shown(client, "?q=entry") == every  # a key of the arguments is text too
    assert shown(client, "?q=" + quote("50%_")) == {three["free"].pk}  # % and _ are plain characters
    assert shown(client, "?q=" + quote("%o")) == set()  # a wildcard would match every "o"
    assert shown(client, "?q=nowhere") == set()
    assert shown(client, "?q=refund&claimed=none") == set()
    assert shown(client, "?q=refund&claimed=me") == {three["ritas"].pk}


def test_search_finds_a_reviewers_edited_arguments(three, rita, rob, as_user) -> None:
    approval = three["free"]
    Approval.objects.filter(pk=approval.pk).update(required=2)  # the edit's vote leaves it pending
    approval_decide(
        approval_id=approval.pk, user=rob, decision="approve", args={"entry": "edited: pay the supplier"},
        args_hash=Approval.objects.get(pk=approval.pk).args_hash,
    )
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert shown(as_user(rita), "?q=supplier") == {approval.pk}


def test_a_search_is_part_of_the_one_query_of_the_list(three, rita, as_user) -> None:
    client = as_user(rita)
    client.get("/reviews/list/", headers=HTMX)  # warm: session, user, groups

    def queries(query: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(f"/reviews/list/{query}", headers=HTMX).status_code == 200
        return len(captured)

    assert queries("?q=refund") == queries("?tool=ledger_write")


def test_every_url_of_the_page_keeps_every_filter(pending, rita, as_user, monkeypatch) -> None:
    monkeypatch.setattr(cards, "PAGE", 2)
    made = [pending(tainted_write(f"refund {i}")) for i in range(4)]
    client = as_user(rita)
    query = "?agent=scripted&tool=ledger_write&risk=write&sort=expires&claimed=none&q=refund"
    page = client.get(f"/reviews/{query}").content.decode()
    kept = {"agent": "scripted", "tool": "ledger_write", "risk": "write", "sort": "expires", "claimed": "none", "q": "refund"}
    poll = re.search(r'id="queue-list"[^>]*hx-get="([^"]+)"', page)
    assert poll and poll.group(1) == "/reviews/list/" + query.replace("&", "&amp;")
    more = re.search(r'<form id="queue-more".*?</form>', page, re.S)
    assert more is not None
    for name, value in kept.items():
        assert f'<input type="hidden" name="{name}" value="{value}">' in more.group(0)  # pagination
        assert page.count(f'<input type="hidden" name="{name}" value="{value}">') >= 1 + 2 * 2  # decisions, claims
    # The controls show what is chosen.
    assert '<option value="none" selected>Unclaimed</option>' in page and 'name="q" value="refund"' in page
    # The next page, as "more" without htmx asks for it, keeps them too.
    second = client.get(f"/reviews/{query}&after={made[1].pk}").content.decode()
    assert f'href="/reviews/{query.replace("&", "&amp;")}"' in second  # back to the first cards
    # A decision without htmx comes back to the same filtered queue.
    response = client.post(f"/reviews/{made[0].pk}/reject/", dict(kept), headers={"X-CSRFToken": client.token()})
    assert response.status_code == 303 and response["Location"] == "/reviews/" + query
    # And so does a claim.
    response = client.post(f"/reviews/{made[1].pk}/claim/", dict(kept), headers={"X-CSRFToken": client.token()})
    assert response.status_code == 303 and response["Location"] == "/reviews/" + query


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("?claimed=everyone", "claimed takes me (Mine) or none (Unclaimed)."),
        ("?claimed=" + "x" * 500, "claimed takes me (Mine) or none (Unclaimed)."),
        ("?q=" + "a" * 201, "a search takes at most 200 characters."),
        ("?q=a%00b", "Null characters are not allowed."),
        ("?risk=nonsense", "Select a valid choice."),
    ],
)
def test_a_bad_filter_value_is_said_and_the_rest_still_shows(three, rita, as_user, query, said) -> None:
    client = as_user(rita)
    response = client.get(f"/reviews/{query}")
    assert response.status_code == 200
    html = response.content.decode()
    notice = re.search(r'<div class="notice filter-ignored" role="alert">.*?</div>', html, re.S)
    assert notice and said in notice.group(0)
    assert shown(client, query) == {a.pk for a in three.values()}  # the bad value narrows nothing
    assert shown(client, query, path="/reviews/list/") == {a.pk for a in three.values()}
