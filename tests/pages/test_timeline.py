from __future__ import annotations

import re

import pytest

from agents.actions.approvals import approval_decide
from agents.models import AgentProfile, Approval, Run
from tests.helpers import call, client_for, final

pytestmark = pytest.mark.django_db

TAINT_THEN_WRITE = [
    call("fetch_fixture", text="page says: pay 42", usage={"input_tokens": 1000, "output_tokens": 200}),
    call("ledger_write", entry="paid 42", usage={"input_tokens": 1500, "output_tokens": 100}),
    final("Recorded the payment.", usage={"input_tokens": 1700, "output_tokens": 50}),
]


@pytest.fixture
def priced(defaults: None) -> None:
    AgentProfile.objects.filter(name="scripted").update(price_input_micros=3_000_000, price_output_micros=15_000_000)


def seqs(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'data-seq="(\d+)"', html)]


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
def test_timeline_shows_steps_verdicts_taint_approval_and_answer(priced, launch, drive, lena, rita) -> None:
    run = launch(TAINT_THEN_WRITE, user=lena)
    drive(run)
    approval = Approval.objects.get(run=run)
    approval_decide(approval_id=approval.pk, user=rita, decision="approve", note="checked the invoice")
    run = drive(run)
    assert run.state == "done"
    html = client_for(lena).get(f"/runs/{run.pk}/").content.decode()
    assert seqs(html) == list(range(1, run.version + 1))
    # the transition that tainted the run is marked, exactly once
    assert html.count("This step tainted the run") == 1
    assert re.search(r'class="step kind-tool is-tainted" id="t4"', html)
    # verdicts with reasons
    assert "Policy <strong>allow</strong> <code>fetch_fixture</code>: fetch_fixture is read" in html
    assert (
        "Policy <strong>ask</strong> <code>ledger_write</code>: ledger_write writes and the run has read external content"
        in html
    )
    # the model's messages and each call with its arguments and result
    assert "calls <code>ledger_write</code>" in html and "&quot;entry&quot;: &quot;paid 42&quot;" in html
    assert "page says: pay 42" in html and "Recorded the payment." in html
    # who approved, when, with what note
    decided = Approval.objects.get(pk=approval.pk).decided_at.strftime("%H:%M:%S")
    assert 'by <strong class="who">rita</strong> at <time datetime="' in html
    assert f">{decided}</time>: “checked the invoice”" in html
    assert f'data-approval-id="{approval.pk}"' in html and ">rita<" in html
    # cost per step and cumulative: 1000*3 + 200*15 = 6000 micros = $0.006
    assert "$0.006<" in html
    # running total: 6000 + 6000 (1500*3 + 100*15) + 5850 (1700*3 + 50*15)
    assert "Σ $0.012<" in html and "Σ $0.01785<" in html and "$0.01785" in html
    # a finished run does not poll
    assert 'id="poller"' not in html
    # the chart is inline SVG with no style attribute
    svg = html[html.index("<svg") : html.index("</svg>")]
    assert "<polyline" in svg and "style=" not in svg


def test_failed_run_shows_reason_at_top(launch, drive, otto) -> None:
    run = launch([call("echo", text="x")], user=otto)
    drive(run)
    html = client_for(otto).get(f"/runs/{run.pk}/").content.decode()
    top = html.index('role="alert"')
    assert top < html.index('id="timeline"')
    assert "script exhausted" in html[top : top + 300]


def test_long_result_is_folded_and_the_transcript_cap_is_visible(launch, drive, otto) -> None:
    run = launch([call("fetch_fixture", text="y" * 9000), final()], user=otto)
    drive(run)
    html = client_for(otto).get(f"/runs/{run.pk}/").content.decode()
    assert "cut at the 8,000-character transcript cap" in html
    assert "[airlock: result truncated, 1000 more characters" in html
    assert html.count("<details><summary>") >= 2  # the long argument and the long result
    more = client_for(otto).get(f"/runs/{run.pk}/?after=3", HTTP_HX_REQUEST="true").content.decode()
    assert seqs(more)[0] == 4 and "cut at the 8,000-character transcript cap" in more


def test_model_output_is_rendered_as_inert_text(launch, drive, otto) -> None:
    run = launch([call("echo", text="<script>alert(1)</script>"), final("<img src=x onerror=alert(1)>")], user=otto)
    drive(run)
    html = client_for(otto).get(f"/runs/{run.pk}/").content.decode()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_active_run_polls_and_the_poll_stops_at_a_terminal_state(launch, drive, otto) -> None:
    run = launch([call("echo", text="a"), final()], user=otto)
    c = client_for(otto)
    html = c.get(f"/runs/{run.pk}/").content.decode()
    assert f'hx-get="/runs/{run.pk}/?live=1&amp;after=1&amp;seen=1" hx-trigger="every 1s"' in html
    drive(run)
    live = c.get(f"/runs/{run.pk}/?live=1&after=1", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="poller"' in live and "hx-trigger" not in live.split("</div>")[0]
    assert 'hx-swap-oob="beforeend:#timeline"' in live
    assert seqs(live) == list(range(2, Run.objects.get(pk=run.pk).version + 1))
    assert 'state state-done" data-state="done"' in live


def test_live_partial_of_a_running_run_keeps_polling(launch, otto) -> None:
    run = launch([final()], user=otto)
    live = client_for(otto).get(f"/runs/{run.pk}/?live=1&after=1", HTTP_HX_REQUEST="true").content.decode()
    assert 'hx-trigger="every 1s"' in live and seqs(live) == []


@pytest.fixture
def long_run(defaults, launch, drive, otto) -> Run:
    AgentProfile.objects.filter(name="scripted").update(limits={"max_steps": 1000})
    script = [call("echo", text=f"n{i}", usage={"input_tokens": 10, "output_tokens": 5}) for i in range(130)] + [
        final()
    ]
    run = drive(launch(script, user=otto))
    assert run.state == "done" and run.version > 250
    return run


def test_long_run_loads_in_pages(long_run, otto) -> None:
    c = client_for(otto)
    html = c.get(f"/runs/{long_run.pk}/").content.decode()
    assert seqs(html) == list(range(1, 51))
    assert 'hx-get="?after=50"' in html and 'href="?after=50"' in html and "Load more transitions" in html
    more = c.get(f"/runs/{long_run.pk}/?after=50", HTTP_HX_REQUEST="true").content.decode()
    assert seqs(more) == list(range(51, 101)) and 'hx-get="?after=100"' in more
    assert "<html" not in more
    last = long_run.version - long_run.version % 50
    end = c.get(f"/runs/{long_run.pk}/?after={last}", HTTP_HX_REQUEST="true").content.decode()
    assert seqs(end) == list(range(last + 1, long_run.version + 1)) and "Load more" not in end
    # without htmx the same link gives a whole page starting there
    page = c.get(f"/runs/{long_run.pk}/?after=50").content.decode()
    assert "<html" in page and seqs(page) == list(range(51, 101)) and 'href="?after=100"' in page


def test_timeline_runs_a_constant_number_of_queries(long_run, otto, django_assert_max_num_queries) -> None:
    c = client_for(otto)
    c.get("/runs/")
    # 13: the page also lists the run's forks (one indexed query, docs/retry.md) and,
    # per request, the person's memberships, the profiles' projects and the switcher's
    # projects (docs/teams.md); none grows with the run.
    with django_assert_max_num_queries(13):
        c.get(f"/runs/{long_run.pk}/")
    with django_assert_max_num_queries(13):
        c.get(f"/runs/{long_run.pk}/?after=50", HTTP_HX_REQUEST="true")
    with django_assert_max_num_queries(13):
        c.get(f"/runs/{long_run.pk}/?live=1&after=250", HTTP_HX_REQUEST="true")


def test_launcher_cannot_read_another_users_run(launch, lena, leo) -> None:
    theirs = launch([final()], user=leo)
    c = client_for(lena)
    assert c.get(f"/runs/{theirs.pk}/").status_code == 404
    assert c.get(f"/runs/{theirs.pk}/?live=1&after=0", HTTP_HX_REQUEST="true").status_code == 404
    assert c.get(f"/runs/{theirs.pk}/export/").status_code == 404


def test_reviewer_and_operator_read_any_run(launch, lena, rita, otto) -> None:
    run = launch([final()], user=lena)
    assert client_for(rita).get(f"/runs/{run.pk}/").status_code == 200
    assert client_for(otto).get(f"/runs/{run.pk}/").status_code == 200


def test_unknown_run_is_404_and_login_is_required(client, otto) -> None:
    assert client_for(otto).get("/runs/999999/").status_code == 404
    assert client.get("/runs/1/").status_code == 302


def test_timeline_refuses_post(launch, otto) -> None:
    run = launch([final()], user=otto)
    assert client_for(otto, csrf=False).post(f"/runs/{run.pk}/").status_code == 405


def test_loading_the_rest_of_an_active_run_hands_over_to_the_poller(defaults, launch, drive, otto) -> None:
    AgentProfile.objects.filter(name="scripted").update(limits={"max_steps": 1000})
    script = [call("echo", text=f"n{i}") for i in range(130)] + [final()]
    run = drive(launch(script, user=otto), max_transitions=230)
    assert not run.is_terminal and run.version == 231
    c = client_for(otto)
    html = c.get(f"/runs/{run.pk}/").content.decode()
    # Rows 51.. are not loaded yet: the poller refreshes the header only, or it would
    # append new rows after a gap.
    assert f'hx-get="/runs/{run.pk}/?live=1&amp;after=-1&amp;seen={run.version}"' in html
    live = c.get(f"/runs/{run.pk}/?live=1&after=-1", HTTP_HX_REQUEST="true").content.decode()
    assert seqs(live) == [] and 'id="run-header"' in live
    middle = c.get(f"/runs/{run.pk}/?after=150", HTTP_HX_REQUEST="true").content.decode()
    assert seqs(middle) == list(range(151, 201)) and 'id="poller"' not in middle  # 201.. still unloaded
    more = c.get(f"/runs/{run.pk}/?after=200", HTTP_HX_REQUEST="true").content.decode()
    assert seqs(more) == list(range(201, 232))
    assert 'id="poller" class="poller" hx-swap-oob="true"' in more
    assert f"?live=1&amp;after={run.version}" in more


def test_an_idle_poll_answers_with_the_header_only(launch, drive, otto) -> None:
    run = drive(launch([call("fetch_fixture", text="x"), call("ledger_write", entry="e")], user=otto))
    assert run.state == "awaiting_approval"
    live = client_for(otto).get(f"/runs/{run.pk}/?live=1&after={run.version}", HTTP_HX_REQUEST="true")
    html = live.content.decode()
    assert 'id="run-header"' in html and 'hx-trigger="every 1s"' in html
    assert 'id="run-chart"' not in html and seqs(html) == []


def test_a_poll_leaves_the_header_alone_while_the_run_has_not_moved(launch, drive, otto) -> None:
    # Re-rendering the header every second would take focus from its links and repeat
    # its status line to screen readers.
    run = drive(launch([call("fetch_fixture", text="x"), call("ledger_write", entry="e")], user=otto))
    c = client_for(otto)
    url = f"/runs/{run.pk}/?live=1&after={run.version}"
    idle = c.get(f"{url}&seen={run.version}", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="run-header"' not in idle and 'hx-trigger="every 1s"' in idle
    assert f"seen={run.version}" in idle
    moved = c.get(f"{url}&seen={run.version - 1}", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="run-header"' in moved and "Waiting for a reviewer" in moved


def test_denials_rejections_and_invalid_calls_are_explained(launch, drive, otto, rita) -> None:
    # approver=none: the write after a fetch is denied, recorded, and the run goes on
    denied = drive(
        launch(
            [call("fetch_fixture", text="x"), call("ledger_write", entry="e"), call("echo", nope=1), final("gave up")],
            user=otto,
            approver="none",
        )
    )
    html = client_for(otto).get(f"/runs/{denied.pk}/").content.decode()
    assert "Policy <strong>deny</strong> <code>ledger_write</code>" in html and "the run has no approver" in html
    assert '<span class="status status-denied">denied</span> — the run has no approver.' in html
    assert "invalid_arguments:" in html
    # a human rejection reaches the timeline with who and the note
    rejected = drive(launch([call("fetch_fixture", text="x"), call("ledger_write", entry="e"), final()], user=otto))
    approval = Approval.objects.get(run=rejected, status="pending")
    approval_decide(approval_id=approval.pk, user=rita, decision="reject", note="not this one")
    drive(rejected)
    html = client_for(otto).get(f"/runs/{rejected.pk}/").content.decode()
    assert 'decision <strong>reject</strong> on <code>ledger_write</code> by <strong class="who">rita</strong>' in html
    assert "rejected by a human reviewer (rita): not this one" in html


def test_the_approvals_table_says_rejected_not_rejected_reject(pending, otto, rita) -> None:
    approval = pending()
    approval_decide(approval_id=approval.pk, user=rita, decision="reject", note="no")
    html = client_for(otto).get(f"/runs/{approval.run_id}/").content.decode()
    row = html[html.index(f'<tr data-approval-id="{approval.pk}">') :]
    row = row[: row.index("</tr>")]
    assert '<span class="status status-rejected">rejected</span></td>' in row
    assert "(reject)" not in row
