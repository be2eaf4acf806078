"""Approval fatigue on /reviews/stats/: a streak of calls approved unchanged offers a
draft of a narrower allow rule, as a shadow rule to backtest first; an edit, a reject or
an expiry ends a streak; irreversible calls never get a draft; nothing is applied."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from django.conf import settings as conf
from django.contrib.auth.models import Group
from django.utils import timezone

from agents import access
from agents.engine import drafts, policy
from agents.engine.conditions import holds
from agents.models import AgentProfile, Approval, ReviewStreak
from agents.ops import review_tally
from reviews import stats
from reviews.stats.fatigue import _walked
from reviews.stats.figures import Streak
from tests.helpers import client_for, person
from tests.reviews import rows

pytestmark = pytest.mark.django_db

RULE = rows.profile_rule(1)


def streaks(user: Any) -> list[Streak]:
    return stats.stats(user, days=7).fatigue


def test_twenty_unchanged_approvals_show_a_draft(defaults: None, rita: Any) -> None:
    rows.streak(rows.a_run(), 20, by=rita, rule=RULE)
    [s] = streaks(rita)
    assert (s.agent.name, s.tool, s.origin, s.index, s.length) == ("scripted", "ledger_write", "profile", 1, 20)
    assert s.draft == {
        "tool": "ledger_write",
        "when": {"all": [
            {"arg": "amount", "op": "gte", "value": 10},
            {"arg": "amount", "op": "lte", "value": 29},
            {"arg": "entry", "op": "eq", "value": "refund"},
        ]},
        "then": "allow",
        "reason": "drafted from 20 calls approved unchanged in a row; review before use",
        "mode": "shadow",
    }
    html = client_for(rita).get("/reviews/stats/").content.decode()
    assert "the last 20 ledger_write calls that rule 1 of the profile asked about were approved unchanged" in html
    assert "&quot;mode&quot;: &quot;shadow&quot;" in html
    # A reviewer is not an administrator: the backtest is named, not linked.
    assert "Backtest this draft" not in html and "Try these rules" in html


def test_nineteen_are_not_a_streak(defaults: None, rita: Any) -> None:
    rows.streak(rows.a_run(), 19, by=rita, rule=RULE)
    assert streaks(rita) == []


@pytest.mark.parametrize("breaker", [{"edited": True}, {"status": "rejected"}, {"status": "expired"}])
def test_an_edit_a_reject_or_an_expiry_in_between_starts_the_count_again(
    defaults: None, rita: Any, breaker: dict[str, Any]
) -> None:
    run = rows.a_run()
    rows.streak(run, 15, by=rita, rule=RULE, start_ago=20000)
    rows.approval(run, by=rita, rule=RULE, closed_ago=10000, **breaker)
    later = rows.streak(run, 15, by=rita, rule=RULE, start_ago=9000)
    assert streaks(rita) == []  # 30 approvals, but the last 15 in a row
    rows.streak(run, 5, by=rita, rule=RULE, start_ago=8000 - 60 * 15)
    [s] = streaks(rita)
    assert s.length == 20
    assert len(later) == 15


def test_calls_of_another_rule_or_tool_keep_their_own_count(defaults: None, rita: Any) -> None:
    run = rows.a_run()
    rows.streak(run, 20, by=rita, rule=RULE, start_ago=20000)
    rows.approval(run, by=rita, rule=rows.profile_rule(2), status="rejected", closed_ago=100)
    rows.approval(run, by=rita, tool="echo", status="rejected", closed_ago=100)
    assert [(s.index, s.length) for s in streaks(rita)] == [(1, 20)]


def test_an_irreversible_tools_streak_shows_no_draft(defaults: None, rita: Any) -> None:
    rows.streak(rows.a_run(), 20, by=rita, tool="wire_money", risk="irreversible")
    [s] = streaks(rita)
    assert s.draft is None and s.origin is None
    assert "irreversible" in s.refusal
    html = client_for(rita).get("/reviews/stats/").content.decode()
    assert "the last 20 wire_money calls no rule asked about were approved unchanged" in html
    assert 'class="draft"' not in html and "irreversible calls are approved one at a time" in html


def test_calls_that_needed_two_votes_show_no_draft(defaults: None, rita: Any) -> None:
    rows.streak(rows.a_run(), 20, by=rita, rule=RULE, required=2)
    [s] = streaks(rita)
    assert s.draft is None and "several votes" in s.refusal


def test_launch_rules_are_left_out(defaults: None, rita: Any) -> None:
    launch = {**RULE, "origin": "launch"}
    rows.streak(rows.a_run(), 20, by=rita, rule=launch)
    assert streaks(rita) == []


def test_the_streak_length_follows_the_setting(defaults: None, rita: Any, settings: Any) -> None:
    settings.AIRLOCK_FATIGUE_STREAK = 5
    rows.streak(rows.a_run(), 5, by=rita, rule=RULE)
    [s] = streaks(rita)
    assert s.length == 5 and s.draft is not None


def test_the_backtest_link_opens_try_these_rules_on_the_draft_in_shadow_mode(defaults: None, root: Any) -> None:
    profile = AgentProfile.objects.get(name="scripted")
    profile.rules = [{"tool": "ledger_write", "then": "ask", "reason": "every write asks"}]
    profile.save()
    rows.streak(rows.a_run(), 20, by=root, rule=RULE)
    html = client_for(root).get("/reviews/stats/").content.decode()
    assert "Backtest this draft as a shadow rule" in html
    [s] = streaks(root)
    # Before the rule that asked: first match wins, so there it would have decided.
    offered = json.loads(parse_qs(urlparse(s.backtest_url).query)["policy"][0])
    assert offered == {"rules": [s.draft, profile.rules[0]]}
    page = client_for(root).get(s.backtest_url)
    assert page.status_code == 200
    form = page.context["form"]
    assert form.initial["policy"] == offered and form.initial["policy"]["rules"][0]["mode"] == "shadow"
    assert "&quot;mode&quot;: &quot;shadow&quot;" in page.content.decode()
    # Offered, never applied: the profile is as it was.
    profile.refresh_from_db()
    assert profile.rules == [{"tool": "ledger_write", "then": "ask", "reason": "every write asks"}]


def test_a_bad_offered_policy_opens_the_form_on_the_profiles_own(defaults: None, root: Any) -> None:
    profile = AgentProfile.objects.get(name="scripted")
    page = client_for(root).get(f"/admin/agents/agentprofile/{profile.pk}/backtest/?policy=%7Bnot+json")
    assert page.status_code == 200
    assert page.context["form"].initial["policy"]["rules"] == profile.rules


# -- the draft itself (pure) -------------------------------------------------------------


def test_a_draft_bounds_numbers_texts_and_booleans_and_allows_every_call_it_came_from() -> None:
    calls = [
        {"amount": 12.5, "currency": "EUR", "notify": True, "order": {"id": "A1", "total": 40}},
        {"amount": 3, "currency": "USD", "notify": True, "order": {"id": "B7", "total": 90}},
    ]
    draft = drafts.narrower_allow("refund", calls, reason="r")
    assert draft is not None
    assert draft["when"]["all"] == [
        {"arg": "amount", "op": "gte", "value": 3},
        {"arg": "amount", "op": "lte", "value": 12.5},
        {"arg": "currency", "op": "in", "value": ["EUR", "USD"]},
        {"arg": "notify", "op": "eq", "value": True},
        {"arg": "order.id", "op": "in", "value": ["A1", "B7"]},
        {"arg": "order.total", "op": "gte", "value": 40},
        {"arg": "order.total", "op": "lte", "value": 90},
    ]
    assert all(holds(draft["when"], c) for c in calls)
    assert not holds(draft["when"], {**calls[0], "amount": 500})
    assert not holds(draft["when"], {**calls[0], "currency": "GBP"})
    assert policy.validate_rule(draft, field="x") == draft


def test_keys_that_cannot_be_bounded_are_left_out_and_nothing_bounded_is_no_draft() -> None:
    many = [{"text": f"note {i}", "tags": [i], "amount": i} for i in range(12)]
    draft = drafts.narrower_allow("echo", many, reason="r")
    assert draft is not None and draft["when"] == {"all": [
        {"arg": "amount", "op": "gte", "value": 0}, {"arg": "amount", "op": "lte", "value": 11}
    ]}
    assert drafts.narrower_allow("echo", [{"text": f"t{i}"} for i in range(12)], reason="r") is None
    assert drafts.narrower_allow("echo", [{"a": 1}, "not an object"], reason="r") is None
    assert drafts.narrower_allow("echo", [], reason="r") is None
    # A key only some calls had bounds nothing: a call without it must not slip through.
    partial = drafts.narrower_allow("echo", [{"a": 1, "b": 2}, {"a": 1}], reason="r")
    assert partial is not None and partial["when"] == {"arg": "a", "op": "eq", "value": 1}


def test_backtesting_the_draft_reports_how_it_agrees_with_reviewers(defaults: None, rita: Any, pending: Any) -> None:
    """Step one of draft -> shadow rule -> rule: the proposal's shadow rule judged on the
    recorded calls, decided by nothing, counted against what reviewers did."""
    from agents.actions.approvals import approval_decide
    from agents.runs import backtest
    from tests.helpers import call, final

    profile = AgentProfile.objects.get(name="scripted")
    profile.always_ask_tools = ["ledger_write"]
    profile.save()
    answers = {"refund 5": "approve", "refund 9": "approve", "refund 7": "reject", "refund 40": "approve"}
    for entry, decision in answers.items():
        asked = pending([call("ledger_write", entry=entry), final()])
        approval_decide(approval_id=asked.pk, user=rita, decision=decision)
    draft = drafts.narrower_allow("ledger_write", [{"entry": e} for e in ("refund 5", "refund 9", "refund 7")], reason="r")
    report = backtest.backtest(profile, {"rules": [draft]})
    assert report.calls == 4 and report.changes == {}
    # Matched: 5 and 9 approved (agreed), 7 rejected (disagreed); 40 is outside the draft.
    assert [(a.rule, a.agreed, a.disagreed, a.undecided) for a in report.shadow] == [(1, 2, 1, 0)]
    assert report.to_dict()["shadow"] == [{"rule": 1, "agreed": 2, "disagreed": 1, "undecided": 0}]


# -- the streaks folded ahead (the sweeper's fold) ---------------------------------------


def shown(user: Any) -> list[tuple[Any, ...]]:
    return [(s.agent.name, s.tool, s.origin, s.index, s.length, s.draft, s.refusal) for s in streaks(user)]


def walked(user: Any) -> list[tuple[Any, ...]]:
    """The streaks walked from the calls themselves, as before the fold."""
    found = _walked(access.visible_approvals(user), list(AgentProfile.objects.order_by("name")),
                          now=timezone.now(), needed=conf.AIRLOCK_FATIGUE_STREAK)
    return [(s.agent.name, s.tool, s.origin, s.index, s.length, s.draft, s.refusal) for s in found]


def test_folded_in_small_batches_the_streaks_shown_are_the_walked_ones(defaults: None, rita: Any, settings: Any) -> None:
    settings.AIRLOCK_FATIGUE_STREAK = 5
    run, other = rows.a_run(), rows.a_run("scripted")
    rows.streak(run, 8, by=rita, rule=RULE, start_ago=40000)
    rows.approval(run, by=rita, rule=RULE, status="rejected", closed_ago=39000)
    rows.streak(run, 7, by=rita, rule=RULE, start_ago=38000)  # rule 1: 7 after the reject
    rows.streak(run, 6, by=rita, rule=rows.profile_rule(2), start_ago=37000)
    rows.approval(run, by=rita, rule=rows.profile_rule(2), edited=True, closed_ago=30000)  # rule 2: broken
    rows.streak(other, 9, by=rita, tool="wire_money", risk="irreversible", start_ago=36000)  # no rule
    rows.streak(other, 3, by=rita, tool="echo", start_ago=20000)  # too short
    expected = walked(rita)
    assert [x[4] for x in expected] == [9, 7]
    assert shown(rita) == expected  # nothing folded yet: the calls since the fold are all of them
    assert review_tally.approvals_tally(batch=4) == 35
    assert shown(rita) == expected
    assert ReviewStreak.objects.get(tool="ledger_write", index=1).length == 7
    assert ReviewStreak.objects.get(tool="ledger_write", index=2).length == 0
    assert not ReviewStreak.objects.filter(tool="echo", length__gt=3).exists()


def test_an_edit_closed_after_the_fold_ends_the_streak_at_once(defaults: None, rita: Any) -> None:
    run = rows.a_run()
    rows.streak(run, 20, by=rita, rule=RULE, start_ago=20000)
    review_tally.approvals_tally()
    assert [s.length for s in streaks(rita)] == [20]
    rows.approval(run, by=rita, rule=RULE, edited=True, closed_ago=60)
    assert streaks(rita) == []  # not folded yet, read with the folded streak
    review_tally.approvals_tally()
    assert streaks(rita) == []
    rows.streak(run, 20, by=rita, rule=RULE, start_ago=50)
    review_tally.approvals_tally()
    assert [s.length for s in streaks(rita)] == [20]


def test_a_reject_closed_late_leaves_only_the_calls_after_it(defaults: None, rita: Any, settings: Any) -> None:
    """A decision committed after newer ones were folded: placed by when it was decided."""
    settings.AIRLOCK_FATIGUE_STREAK = 5
    run = rows.a_run()
    calls = rows.streak(run, 25, by=rita, rule=RULE, start_ago=20000)
    review_tally.approvals_tally()
    late = rows.approval(run, by=rita, rule=RULE, status="rejected", closed_ago=20000 - 60 * 9.5)
    assert [s.length for s in streaks(rita)] == [15] == [x[4] for x in walked(rita)]
    review_tally.approvals_tally()
    assert ReviewStreak.objects.get().length == 15 and ReviewStreak.objects.get().broken_id == late.pk
    [s] = streaks(rita)
    # The draft is made from the calls after the reject only.
    assert s.draft is not None and {"arg": "amount", "op": "gte", "value": 20} in s.draft["when"]["all"]
    assert Approval.objects.filter(pk__in=[c.pk for c in calls], tallied=True).count() == 25


def test_a_folded_streak_stays_after_its_runs_are_purged(defaults: None, rita: Any, settings: Any) -> None:
    settings.AIRLOCK_FATIGUE_STREAK = 5
    old, new = rows.a_run(), rows.a_run()
    rows.streak(old, 10, by=rita, rule=RULE, start_ago=20000)
    rows.streak(new, 5, by=rita, rule=RULE, start_ago=10000)
    review_tally.approvals_tally()
    Approval.objects.filter(run=old).delete()  # what a purge leaves of the older run
    [s] = streaks(rita)
    assert s.length == 15


def test_a_reviewer_of_one_agent_sees_only_its_folded_streaks(defaults: None, rita: Any) -> None:
    Group.objects.get_or_create(name="demo-reviewers")
    AgentProfile.objects.filter(name="demo").update(reviewer_group="demo-reviewers")
    dora = person("dora", "demo-reviewers")
    rows.streak(rows.a_run("scripted"), 20, by=rita, rule=RULE)
    rows.streak(rows.a_run("demo"), 21, by=rita, rule=RULE)
    review_tally.approvals_tally()
    # Rita reviews the other profiles now, Dora this one.
    assert [(s.agent.name, s.length) for s in streaks(rita)] == [("scripted", 20)]
    assert [(s.agent.name, s.length) for s in streaks(dora)] == [("demo", 21)]
