"""Two decision POSTs fired at once from the review page by script, around the button's
disabling: the server, not the page, makes sure the call runs once."""

from __future__ import annotations

import pytest

from agents.models import Approval, LedgerEntry, Transition
from agents.runs import driver
from tests.helpers import PASSWORD as PW

pytestmark = [pytest.mark.e2e, pytest.mark.reliability, pytest.mark.django_db(transaction=True)]

TWO_POSTS = """async ([first, second]) => {
  // The token the page itself carries (htmx sends it from the body's hx-headers).
  const token = JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRFToken"];
  const post = (url) => fetch(url, {
    method: "POST",
    headers: {"X-CSRFToken": token, "HX-Request": "true", "Content-Type": "application/x-www-form-urlencoded"},
    body: "note=",
    credentials: "same-origin",
  }).then(async (r) => ({status: r.status, body: await r.text()}));
  return await Promise.all([post(first), post(second)]);
}"""


@pytest.mark.parametrize("second", ["approve", "reject"])
def test_two_simultaneous_posts_from_the_page_run_the_call_once(new_page, login, people, pending, second) -> None:
    approval = pending(user=people["other"])
    page, _watch = new_page()
    login(page, "rita", PW)
    page.goto("/reviews/")
    page.locator(f'[data-approval-id="{approval.pk}"]').wait_for()

    urls = [f"/reviews/{approval.pk}/approve/", f"/reviews/{approval.pk}/{second}/"]
    answers = page.evaluate(TWO_POSTS, urls)

    assert [a["status"] for a in answers] == [200, 200], answers
    approval.refresh_from_db()
    assert approval.status in ("approved", "rejected") and approval.decided_by.username == "rita"
    # One answer is recorded; the other is told it came too late (or that it was already given).
    late = [a for a in answers if "not recorded" in a["body"] or "already answered" in a["body"]]
    assert len(late) == 1, [a["body"][:300] for a in answers]
    assert Transition.objects.filter(run=approval.run, from_state="awaiting_approval").count() == 1
    assert Approval.objects.filter(run=approval.run).count() == 1

    run = driver.drive(approval.run_id)
    assert run.state == "done"
    assert LedgerEntry.objects.filter(run=run).count() == (1 if approval.decision == "approve" else 0)
