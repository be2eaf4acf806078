"""Long answers and tasks on pages (issue 34, item 11): a 2.4 MB answer made a 4.8 MB
timeline. The timeline shows at most 10,000 characters of a task, an answer or a
message, with a link to the whole text at /runs/<id>/task.txt, answer.txt or
messages/<index>.txt, which need the same access as the run's page."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils.html import escape

from agents.models import Message
from tests.helpers import call, client_for, final

pytestmark = pytest.mark.django_db

ANSWER = ("The whole answer, line after line. <b>bold?</b>\n" * 50_000)[:2_400_000]
TASK = "Summarise everything. " * 4_000  # 88,000 characters
PAGE_TEXT_MAX = 10_000  # agents.web.timeline.PAGE_TEXT_MAX, as the page says it


@pytest.fixture
def long_run(launch, drive, lena):
    run = drive(launch([call("echo", text="x" * 30_000), final(ANSWER)], task=TASK, user=lena))
    assert run.state == "done" and run.answer == ANSWER
    return run


def test_a_2_4_mb_answer_makes_a_small_timeline_with_links_to_the_whole_text(long_run, lena) -> None:
    page = client_for(lena).get(f"/runs/{long_run.pk}/")
    assert page.status_code == 200
    assert len(page.content) < 200_000, len(page.content)
    html = page.content.decode()
    assert f"Cut at 10,000 of {len(ANSWER):,} characters" in html
    assert f"Cut at 10,000 of {len(TASK):,} characters" in html
    assert f'href="/runs/{long_run.pk}/answer.txt"' in html and f'href="/runs/{long_run.pk}/task.txt"' in html
    final_message = Message.objects.get(run=long_run, role="assistant", content=ANSWER)
    task_message = Message.objects.get(run=long_run, role="user")
    assert f'href="/runs/{long_run.pk}/messages/{final_message.index}.txt"' in html
    assert f'href="/runs/{long_run.pk}/messages/{task_message.index}.txt"' in html
    assert escape(ANSWER[:PAGE_TEXT_MAX]) in html and "<b>bold?</b>" not in html


def test_the_whole_text_is_plain_text_behind_the_links(long_run, lena) -> None:
    client = client_for(lena)
    answer = client.get(f"/runs/{long_run.pk}/answer.txt")
    assert answer.status_code == 200 and answer.content.decode() == ANSWER
    assert answer["Content-Type"] == "text/plain; charset=utf-8" and answer["X-Content-Type-Options"] == "nosniff"
    assert client.get(f"/runs/{long_run.pk}/task.txt").content.decode() == TASK
    index = Message.objects.get(run=long_run, role="assistant", content=ANSWER).index
    assert client.get(f"/runs/{long_run.pk}/messages/{index}.txt").content.decode() == ANSWER
    assert client.get(f"/runs/{long_run.pk}/messages/999.txt").status_code == 404
    assert client.get(f"/runs/{long_run.pk}/messages/{'9' * 30}.txt").status_code == 404


def test_the_whole_text_needs_the_same_access_as_the_run_page(long_run, leo, otto, rita) -> None:
    urls = [f"/runs/{long_run.pk}/answer.txt", f"/runs/{long_run.pk}/task.txt", f"/runs/{long_run.pk}/messages/0.txt"]
    for url in urls:
        assert client_for(leo).get(url).status_code == 404  # another launcher's run: as if missing
        assert client_for(otto).get(url).status_code == 200
        assert client_for(rita).get(url).status_code == 200
        anonymous = Client().get(url)
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
        assert client_for(otto, csrf=False).post(url).status_code == 405


def test_a_run_without_an_answer_has_no_answer_text(launch, lena) -> None:
    run = launch([final("later")], user=lena)
    client = client_for(lena)
    assert client.get(f"/runs/{run.pk}/answer.txt").status_code == 404
    assert client.get(f"/runs/{run.pk}/task.txt").content.decode() == "test task"


def test_short_texts_are_shown_whole_without_a_link(launch, drive, lena) -> None:
    run = drive(launch([final("short answer")], user=lena))
    html = client_for(lena).get(f"/runs/{run.pk}/").content.decode()
    assert "short answer" in html and "Cut at" not in html and "answer.txt" not in html


def test_the_runs_list_stays_small_with_long_tasks(launch, lena) -> None:
    for _ in range(20):
        launch([final("x")], task=TASK, user=lena)
    page = client_for(lena).get("/runs/")
    assert page.status_code == 200 and len(page.content) < 200_000, len(page.content)
