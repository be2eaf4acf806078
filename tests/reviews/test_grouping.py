"""The grouped queue (`/reviews/?group=1`): which calls form a group, what a group card
shows once and per row, hostile values kept inert, the cap on rows, and a group's
batch form with and without htmx."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User

from agents.actions.approvals import approval_decide
from agents.actions.runs import run_launch
from agents.models import AgentProfile, Approval, Transition
from agents.models.approvals import call_group_key
from agents.runs import driver
from reviews import groups
from tests.helpers import CsrfClient

pytestmark = pytest.mark.django_db

# `fail` takes any arguments: a read tool, asked for by this rule, so its calls wait.
REFUND = {"tool": "fail", "then": "ask", "reason": "refunds need a human"}
OTHER = {"tool": "fail", "when": {"arg": "amount", "op": "gt", "value": 1000}, "then": "ask", "reason": "big refund"}


def waiting(args: dict[str, Any], *, rules: list[dict[str, Any]] | None = None, agent: str = "scripted",
            user: User | None = None, task: str = "refund the order") -> Approval:
    run = run_launch(
        agent=agent, task=task, user=user, script=[{"call": {"tool": "fail", "args": args}}, {"final": "ok"}],
        policy={"rules": rules or [REFUND]},
    )
    driver.drive(run.pk)
    return Approval.objects.pending().get(run=run)


def refunds(n: int, **kw: Any) -> list[Approval]:
    return [waiting({"order": f"A-{i}", "amount": 10 + i, "currency": "EUR"}, **kw) for i in range(n)]


def grouped(client: CsrfClient, query: str = "") -> str:
    response = client.get(f"/reviews/?group=1{query}")
    assert response.status_code == 200
    return response.content.decode()


def group_html(html: str) -> list[str]:
    return re.findall(r'<article class="card group.*?</article>', html, re.S)


# -- what forms a group --------------------------------------------------------------


def test_calls_with_the_same_agent_tool_rule_and_keys_share_a_key_and_others_do_not(defaults) -> None:
    base = {"profile_id": 1, "kind": "policy", "tool": "fail", "rule": {"origin": "launch", "index": 1, "x": 1}}
    key = call_group_key(**base, args={"order": "A-1", "amount": 10})
    assert key == call_group_key(**base, args={"amount": 99, "order": "B-7"})  # other values, same keys
    different = [
        # Launch rules are each run's own: rule 1 of two launch policies may differ.
        {**base, "rule": {"origin": "launch", "index": 1, "x": 2}, "args": {"order": "A-1", "amount": 10}},
        {**base, "args": {"order": "A-1"}},
        {**base, "args": {"order": "A-1", "amount": 10, "note": ""}},
        {**base, "profile_id": 2, "args": {"order": "A-1", "amount": 10}},
        {**base, "tool": "echo", "args": {"order": "A-1", "amount": 10}},
        {**base, "rule": {"origin": "profile", "index": 1}, "args": {"order": "A-1", "amount": 10}},
        {**base, "rule": {"origin": "launch", "index": 2}, "args": {"order": "A-1", "amount": 10}},
        {**base, "rule": None, "args": {"order": "A-1", "amount": 10}},
    ]
    assert len({key, *(call_group_key(**d) for d in different)}) == 1 + len(different)
    assert call_group_key(**{**base, "kind": "outcome_unknown"}, args={}) == ""


def test_written_approvals_carry_the_key_of_their_profile_tool_rule_and_shape(defaults) -> None:
    a, b = refunds(2)
    c = waiting({"order": "A-9", "amount": 5})  # one key fewer
    d = waiting({"order": "A-8", "amount": 5000, "currency": "EUR"}, rules=[OTHER, REFUND])  # another rule
    assert a.group_key == b.group_key != "" and len({a.group_key, c.group_key, d.group_key}) == 3
    assert a.group_key == call_group_key(
        profile_id=AgentProfile.objects.get(name="scripted").pk, kind="policy", tool="fail", rule=a.rule, args=a.args
    )


def test_an_edited_call_leaves_its_group(defaults, rita) -> None:
    a, b, c = refunds(3)
    approval_decide(approval_id=a.pk, user=rita, decision="approve", args={"order": "A-0", "amount": 1, "currency": "EUR"},
                    args_hash=a.args_hash)
    # The edit decided it (one vote needed): make a pending edit with a two-person rule instead.
    two = {**REFUND, "approvals": 2}
    d, e = refunds(2, rules=[two])
    approval_decide(approval_id=d.pk, user=rita, decision="approve", args={"order": "X", "amount": 1, "currency": "EUR"},
                    args_hash=d.args_hash)
    d.refresh_from_db()
    assert d.is_pending and d.group_key == "" and Approval.objects.get(pk=e.pk).group_key != ""


# -- the group card ------------------------------------------------------------------


def test_a_group_card_shows_the_count_the_shared_fields_once_and_a_row_per_call(defaults, rita, as_user) -> None:
    calls = refunds(3)
    lone = waiting({"order": "Z-1"})
    html = grouped(as_user(rita))
    [card] = group_html(html)
    assert "3 similar calls" in card and "<code class=\"tool\">fail</code>" in card
    assert "refunds need a human" in card and "rule 1 of the launch policy" in card
    # currency is the same in all three: said once, above the table, not a column.
    assert re.search(r"<dt><code>currency</code></dt><dd><span class=\"value\">EUR</span>", card)
    assert card.count(">EUR<") == 1
    header = re.search(r"<thead>(.*?)</thead>", card, re.S).group(1)
    assert "<code>order</code>" in header and "<code>amount</code>" in header and "currency" not in header
    rows = re.findall(r'<tr data-approval-id="(\d+)">(.*?)</tr>', card, re.S)
    assert [int(pk) for pk, _ in rows] == [a.pk for a in calls]  # oldest first
    for (pk, row), a in zip(rows, calls, strict=True):
        assert f'href="/reviews/{pk}/"' in row
        assert f'name="ids" value="{pk}"' in row and f'name="seen" value="{pk}:{a.args_hash}"' in row
        assert f">{a.args['order']}<" in row and f">{a.args['amount']}<" in row
        assert "<time" in row
    # The call alone is its ordinary card, with its own buttons, beside the group.
    assert f'id="approval-{lone.pk}"' in html and f'data-approval-id="{lone.pk}"' in html
    assert html.index('id="group-') < html.index(f'id="approval-{lone.pk}"')  # the group's oldest call is older


def test_the_toggle_is_kept_in_the_url_and_ungrouped_shows_cards(defaults, rita, as_user) -> None:
    refunds(2)
    client = as_user(rita)
    plain = client.get("/reviews/").content.decode()
    assert not group_html(plain) and 'name="group" value="1">' in plain
    html = grouped(client, "&tool=fail")
    assert 'name="group" value="1" checked' in html
    # The group's form carries the filters (and the toggle) through a decision.
    [card] = group_html(html)
    assert '<input type="hidden" name="tool" value="fail">' in card
    assert '<input type="hidden" name="group" value="1">' in card


@pytest.mark.parametrize(
    "query, said, is_grouped",
    [
        ("?group=zzz", "group takes 1 (similar calls together) or 0.", False),
        ("?group=1&page=abc", "page takes a page number (1, 2, ...), so this is the first page.", True),
        ("?group=1&page=0", "page takes a page number (1, 2, ...), so this is the first page.", True),
        ("?group=1&page=%C2%B2", "page takes a page number (1, 2, ...), so this is the first page.", True),
    ],
)
def test_a_bad_group_or_page_in_the_link_is_said_above_the_queue(defaults, rita, as_user, query, said, is_grouped) -> None:
    refunds(2)
    response = as_user(rita).get(f"/reviews/{query}")
    assert response.status_code == 200
    html = response.content.decode()
    notice = re.search(r'<div class="notice filter-ignored" role="alert">.*?</div>', html, re.S)
    assert notice and said in notice.group(0)
    assert bool(group_html(html)) == is_grouped  # the view it could show: ungrouped, or the first page


def test_the_toggles_spellings_group_or_not(defaults, rita, as_user) -> None:
    refunds(2)
    client = as_user(rita)
    for on in ("1", "true", "on", "ON"):
        assert group_html(client.get(f"/reviews/?group={on}").content.decode()), on
    for off in ("0", "false", "off", ""):
        html = client.get(f"/reviews/?group={off}").content.decode()
        assert not group_html(html) and "filter-ignored" not in html, off


def test_hostile_and_long_values_are_inert_and_cut_with_the_full_value_behind_a_toggle(defaults, rita, as_user) -> None:
    hostile = '<img src=x onerror="alert(1)">'
    long = "refund " + "x" * 300 + "<b>end</b>"
    waiting({"order": hostile, "note": long, "currency": "<script>alert(2)</script>"})
    waiting({"order": "A-2", "note": "short", "currency": "<script>alert(2)</script>"})
    html = grouped(as_user(rita))
    [card] = group_html(html)
    assert "<img src=x" not in card and "<script>alert" not in card and "<b>end</b>" not in card
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in card
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in card  # the same in both: said once
    [cut] = re.findall(r'<details class="long-value"><summary>(.*?)</summary><pre>(.*?)</pre></details>', card, re.S)
    assert cut[0].endswith("…") and len(cut[0]) == groups.VALUE_CHARS
    assert cut[1] == "refund " + "x" * 300 + "&lt;b&gt;end&lt;/b&gt;"


def test_a_big_group_shows_the_oldest_rows_up_to_the_cap_and_counts_the_rest(defaults, rita, as_user, monkeypatch) -> None:
    monkeypatch.setattr(groups, "GROUP_ROWS", 4)
    calls = refunds(7)
    [card] = group_html(grouped(as_user(rita)))
    assert "7 similar calls" in card and "and 3 more not shown" in card
    shown = [int(pk) for pk in re.findall(r'<tr data-approval-id="(\d+)">', card)]
    assert shown == [a.pk for a in calls[:4]]
    assert card.count('name="ids"') == 4 and 'aria-label="Select all 4 shown"' in card


def test_groups_are_paginated_and_each_page_reads_a_constant_number_of_queries(
    defaults, rita, as_user, monkeypatch, django_assert_max_num_queries
) -> None:
    monkeypatch.setattr(groups, "PAGE", 2)
    for n in range(3):  # three groups of two: each with its own shape
        for i in range(2):
            waiting({"order": f"A-{n}-{i}", f"k{n}": 1})
    client = as_user(rita)
    first = grouped(client)
    assert len(group_html(first)) == 2 and "page=2" in first and "Next groups" in first
    second = grouped(client, "&page=2")
    assert len(group_html(second)) == 1 and "Previous groups" in second and "Next groups" not in second
    assert set(re.findall(r'id="group-(\w+)"', first)).isdisjoint(re.findall(r'id="group-(\w+)"', second))


def test_a_group_page_reads_as_many_queries_whatever_the_number_of_rows_its_groups_show(defaults, rita, as_user) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    refunds(2)
    waiting({"alone": 1})
    client = as_user(rita)

    def queries() -> int:
        grouped(client)  # warm: the session and the user's caches as on any later visit
        with CaptureQueriesContext(connection) as captured:
            html = grouped(client)
        assert len(group_html(html)) == 1
        return len(captured)

    few = queries()
    refunds(6)  # the same group, now eight rows
    assert queries() == few


# A group's rows are read as cards read their calls while the group fits GROUP_ROWS,
# and as values (groups.CALL_COLUMNS) past it: each row must say the same either way.
ROW_PATHS = pytest.mark.parametrize("cap", [groups.GROUP_ROWS, 1], ids=["with-cards", "past-the-cap"])


@ROW_PATHS
def test_the_launchers_own_calls_are_not_selectable_where_duties_are_separated(
    defaults, lena, as_user, monkeypatch, cap
) -> None:
    from django.contrib.auth.models import Group

    monkeypatch.setattr(groups, "GROUP_ROWS", cap)
    lena.groups.add(Group.objects.get(name="reviewer"))
    rules = [REFUND]
    for i in range(2):
        run = run_launch(agent="scripted", task="t", user=lena, policy={"rules": rules, "separate_duties": True},
                         script=[{"call": {"tool": "fail", "args": {"order": f"A-{i}"}}}, {"final": "ok"}])
        driver.drive(run.pk)
    [card] = group_html(grouped(as_user(lena)))
    assert card.count(">yours<") == min(2, cap) and "Approve selected" not in card
    assert 'name="ids"' not in card


@ROW_PATHS
def test_a_row_of_a_call_needing_two_votes_counts_them_and_says_the_viewers(defaults, rita, rob, as_user,
                                                                             monkeypatch, cap) -> None:
    monkeypatch.setattr(groups, "GROUP_ROWS", cap)
    two = {**REFUND, "approvals": 2}
    first, second = refunds(2, rules=[two])
    assert approval_decide(approval_id=first.pk, user=rob, decision="approve").outcome == "voted"
    assert approval_decide(approval_id=first.pk, user=rita, decision="approve").outcome == "decided"
    approval_decide(approval_id=second.pk, user=rob, decision="approve")
    third = refunds(1, rules=[two])[0]  # the group is two calls again
    [card] = group_html(grouped(as_user(rob)))
    rows = dict(re.findall(r'<tr data-approval-id="(\d+)">(.*?)</tr>', card, re.S))
    assert list(rows) == [str(second.pk), str(third.pk)][:cap]
    assert "1 of 2 approvals" in rows[str(second.pk)] and "you voted approve" in rows[str(second.pk)]
    assert 'name="ids"' not in rows[str(second.pk)]  # rob voted: his row is not his to pick again
    if cap > 1:
        assert "0 of 2 approvals" in rows[str(third.pk)] and f'value="{third.pk}"' in rows[str(third.pk)]


def test_a_launcher_sees_groups_of_their_own_runs_only_and_no_form(defaults, lena, leo, as_user) -> None:
    refunds(2, user=lena)
    refunds(2, user=leo)
    [card] = group_html(grouped(as_user(lena)))
    assert "2 similar calls" in card and 'name="ids"' not in card and "Approve selected" not in card


# -- the group's batch form ----------------------------------------------------------


def post_batch(client: CsrfClient, ids: list[Approval], shown: list[Approval], decision: str = "approve", *,
               htmx: bool = False, **extra: Any) -> Any:
    data = {
        "decision": decision, "note": extra.pop("note", "checked"), "group_key": shown[0].group_key, "group": "1",
        "ids": [str(a.pk) for a in ids], "seen": [f"{a.pk}:{a.args_hash}" for a in shown], **extra,
    }
    headers = {"X-CSRFToken": client.token(), **({"HX-Request": "true"} if htmx else {})}
    return client.post("/reviews/decisions/", data, headers=headers)


def test_without_htmx_a_batch_redirects_to_the_grouped_queue_which_says_what_happened(defaults, rita, as_user) -> None:
    a, b, c = refunds(3)
    client = as_user(rita)
    response = post_batch(client, [a, b], [a, b, c])
    assert response.status_code == 303 and response["Location"] == "/reviews/?group=1"
    for x, status in ((a, "approved"), (b, "approved"), (c, "pending")):
        x.refresh_from_db()
        assert x.status == status and (x.note == "checked" or status == "pending")
    assert {x.via for x in Approval.objects.filter(pk__in=[a.pk, b.pk])} == {"dashboard"}
    page = client.get(response["Location"]).content.decode()
    assert "Approve selected: 2 decided." in page
    assert f"#{a.pk} decided: approved" in page and f"#{b.pk} decided: approved" in page
    # The third call waits, now alone: its own card with its buttons.
    assert f'id="approval-{c.pk}"' in page and not group_html(page)


def test_with_htmx_the_group_comes_back_under_the_per_call_results(defaults, rita, rob, as_user) -> None:
    a, b, c, d = refunds(4)
    approval_decide(approval_id=b.pk, user=rob, decision="reject")
    response = post_batch(as_user(rita), [a, b], [a, b, c, d], "reject", htmx=True, note="duplicate")
    assert response.status_code == 200 and response["HX-Trigger"]
    html = response.content.decode()
    assert "Reject selected: 1 decided, 1 already decided." in html
    assert re.search(rf"#{a.pk}</a> <strong>decided</strong>: rejected", html)
    assert re.search(rf"#{b.pk}</a> <strong>already decided</strong>: rejected by rob", html)
    # What is left of the group: the two still waiting.
    [card] = group_html(html)
    assert "2 similar calls" in card
    assert [int(pk) for pk in re.findall(r'<tr data-approval-id="(\d+)">', card)] == [c.pk, d.pk]
    assert Approval.objects.get(pk=a.pk).note == "duplicate"


def test_a_row_whose_call_changed_since_it_was_shown_is_refused(defaults, rita, as_user) -> None:
    a, b = refunds(2)
    client = as_user(rita)
    stale = f"{a.pk}:{'0' * 64}"  # the hash of a call other than the one that waits now
    headers = {"X-CSRFToken": client.token(), "HX-Request": "true"}
    response = client.post("/reviews/decisions/", {
        "decision": "approve", "group_key": a.group_key, "ids": [a.pk, b.pk],
        "seen": [stale, f"{b.pk}:{b.args_hash}"]}, headers=headers)
    html = response.content.decode()
    assert re.search(rf"#{a.pk}</a> <strong>refused</strong>: call_changed", html)
    assert Approval.objects.get(pk=a.pk).status == "pending" and Approval.objects.get(pk=b.pk).status == "approved"


def test_a_checked_id_the_page_did_not_show_is_refused(defaults, rita, as_user) -> None:
    a, b, c = refunds(3)
    client = as_user(rita)
    headers = {"X-CSRFToken": client.token(), "HX-Request": "true"}
    response = client.post("/reviews/decisions/", {
        "decision": "approve", "group_key": a.group_key, "ids": [a.pk, c.pk], "seen": [f"{a.pk}:{a.args_hash}"]},
        headers=headers)
    assert re.search(rf"#{c.pk}</a> <strong>refused</strong>: not found", response.content.decode())
    assert Approval.objects.get(pk=a.pk).status == "approved" and Approval.objects.get(pk=c.pk).status == "pending"


def test_nothing_checked_decides_nothing_and_says_so(defaults, rita, as_user) -> None:
    a, b = refunds(2)
    before = Transition.objects.count()
    response = post_batch(as_user(rita), [], [a, b], htmx=True)
    assert "Nothing was decided: check the calls to decide first." in response.content.decode()
    assert Transition.objects.count() == before


@pytest.mark.parametrize("who", ["otto", "lena", "nina"])
def test_only_reviewers_may_post_a_batch(defaults, people, nina, as_user, who) -> None:
    a, b = refunds(2)
    user = {"otto": people["operator"], "lena": people["launcher"], "nina": nina}[who]
    response = post_batch(as_user(user), [a, b], [a, b])
    assert response.status_code == 403
    assert Approval.objects.filter(pk__in=[a.pk, b.pk], status="pending").count() == 2


def test_a_batch_needs_csrf_and_post(defaults, rita) -> None:
    a, b = refunds(2)
    client = CsrfClient()
    client.force_login(rita)
    assert client.post("/reviews/decisions/", {"decision": "approve", "ids": [a.pk]}).status_code == 403
    assert client.get("/reviews/decisions/").status_code == 405
    assert Approval.objects.get(pk=a.pk).status == "pending"


def test_the_short_walk_and_the_full_count_find_the_same_entries_in_the_same_order(defaults, rita, monkeypatch) -> None:
    """Entries are found by walking the oldest calls (groups._entries); past WALK calls
    of one group they are counted in full instead. Both must give the same page."""
    refunds(4)
    lone = waiting({"order": "Z"})
    refunds(2, rules=[{**REFUND, "reason": "another rule"}])
    pending = groups.pending_calls(rita, groups.Filters())
    walked = groups._entries(pending, 0, 10)
    monkeypatch.setattr(groups, "WALK", 1)  # the walk gives up at once: the full count answers
    counted = groups._entries(pending, 0, 10)
    assert [(e["entry"], e["n"]) for e in walked] == [(e["entry"], e["n"]) for e in counted]
    assert [e["n"] for e in walked] == [4, 1, 2] and walked[1]["one"] == lone.pk
    assert [e["entry"] for e in groups._entries(pending, 1, 2)] == [e["entry"] for e in walked[1:3]]
