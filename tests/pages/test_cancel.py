from __future__ import annotations

import pytest

from agents.models import Run, Transition
from tests.helpers import call, client_for, csrf_post, final

pytestmark = pytest.mark.django_db


def test_operator_cancels_with_a_reason(launch, drive, lena, otto) -> None:
    run = launch([call("fetch_fixture", text="x"), call("ledger_write", entry="e"), final()], user=lena)
    drive(run)  # now waiting for a reviewer
    c = client_for(otto)
    page = c.get(f"/runs/{run.pk}/").content.decode()
    assert "Cancel run…" in page and f'action="/runs/{run.pk}/cancel/"' in page
    response = csrf_post(c, f"/runs/{run.pk}/cancel/", {"reason": "wrong invoice batch"})
    assert response.status_code == 302 and response.url == f"/runs/{run.pk}/"
    run.refresh_from_db()
    assert run.state == "cancelled"
    t = Transition.objects.get(run=run, seq=run.version)
    assert (t.kind, t.to_state, t.actor) == ("cancel", "cancelled", "user:otto")
    assert t.payload["reason"] == "cancelled by otto: wrong invoice batch"
    assert run.approvals.get().status == "expired"
    html = c.get(response.url).content.decode()
    assert "cancelled by otto: wrong invoice batch" in html and "Cancel run…" not in html


def test_cancel_without_csrf_token_is_refused(launch, otto) -> None:
    run = launch([final()], user=otto)
    response = client_for(otto).post(f"/runs/{run.pk}/cancel/", {"reason": "x"})
    assert response.status_code == 403
    assert Run.objects.get(pk=run.pk).state == "queued"


# A launcher and a reviewer may read the run, so they are refused; nina may not even
# read it, so for her it does not exist.
@pytest.mark.parametrize(("who", "answer"), [("lena", 403), ("rita", 403), ("nina", 404)])
def test_non_operator_cannot_cancel_and_nothing_is_recorded(request, who, answer, launch, lena) -> None:
    user = request.getfixturevalue(who)
    run = launch([final()], user=lena)
    c = client_for(user)
    assert "Cancel run…" not in c.get(f"/runs/{run.pk}/").content.decode()
    response = csrf_post(c, f"/runs/{run.pk}/cancel/", {"reason": "mine"})
    assert response.status_code == answer
    assert (Run.objects.get(pk=run.pk).state, Transition.objects.filter(run=run).count()) == ("queued", 1)


def test_launcher_gets_403_on_own_run(launch, lena) -> None:
    run = launch([final()], user=lena)
    assert csrf_post(client_for(lena), f"/runs/{run.pk}/cancel/").status_code == 403


def test_cancelling_a_finished_run_changes_nothing(launch, drive, otto) -> None:
    run = drive(launch([final()], user=otto))
    c = client_for(otto)
    response = csrf_post(c, f"/runs/{run.pk}/cancel/", {"reason": "late"}, follow=True)
    assert b"already ended (done)" in response.content
    assert Run.objects.get(pk=run.pk).version == run.version


def test_cancel_refuses_get(launch, otto) -> None:
    run = launch([final()], user=otto)
    assert client_for(otto).get(f"/runs/{run.pk}/cancel/").status_code == 405
