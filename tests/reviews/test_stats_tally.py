"""The review statistics' daily tallies (agents/ops/review_tally.py): the page read from
them agrees with the exact computation on a varied history (counts equal, percentiles
within the buckets' stated error), a fold counts each call once however often or
concurrently it runs, and a call closed after a fold still shows."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from agents.models import AgentProfile, Approval, ApprovalClaim, ReviewTally, ReviewTiming
from agents.ops import review_tally
from reviews import stats
from reviews.stats import fatigue as stats_fatigue
from reviews.stats import tallied as stats_tallied
from reviews.stats.timing import BucketOf, Timing
from tests.helpers import at_once, client_for, person, requires_postgres
from tests.reviews import rows

DAY = 86400.0
# The exact figures the tallies are checked against: in the database where it can
# (PostgreSQL's one scan), else in Python, as the page itself computes them there.
EXACT_IN_DATABASE = connection.vendor == "postgresql"


def varied(rita: Any, rob: Any, *, now: dt.datetime) -> list[Approval]:
    """Two agents, three rules and none, two reviewers, approvals, rejections and
    expiries, some escalated, waits from 0.2 s to 3 h, closed over the last 40 days
    (today and both edges of each window included)."""
    runs = {"scripted": rows.a_run("scripted"), "demo": rows.a_run("demo")}
    out = []
    waits = [0.2, 3, 7.5, 12, 45, 60, 61, 300, 900, 3600, 10800]
    for i, (agent, rule, who, status) in enumerate(itertools.islice(itertools.cycle(itertools.product(
        ("scripted", "demo"), (None, 1, 2, 3), (rita, rob), ("approved", "approved", "rejected", "expired")
    )), 260)):
        out.append(rows.approval(
            runs[agent], status=status, by=who, wait=waits[i % len(waits)] * (1 + (i % 5) / 10),
            closed_ago=(i * 15_551) % int(40 * DAY) + 30, rule=None if rule is None else rows.profile_rule(rule),
            escalated_ago=5 * DAY if i % 9 == 0 else None, now=now,
        ))
    return out


def _counts(figures: stats.Stats) -> Any:
    return (
        figures.overall.n,
        sorted((a, t.n) for a, t in figures.agents),
        [(r.agent, r.origin, r.index, r.approved, r.rejected, r.expired, r.timing.n) for r in figures.rules],
        [(r.name, r.approved, r.rejected) for r in figures.reviewers],
        [(b.start, b.timing.n) for b in figures.chart.buckets],
    )


def _timings(figures: stats.Stats) -> list[Timing]:
    return [
        figures.overall, *(t for _, t in figures.agents), *(r.timing for r in figures.rules),
        *(b.timing for b in figures.chart.buckets),
    ]


def _close(bucketed: Timing, exact: Timing) -> bool:
    rel = review_tally.MAX_ERROR + 1e-9
    return all(
        (b is None and e is None) or (b is not None and e is not None and b == pytest.approx(e, rel=rel))
        for b, e in ((bucketed.p50, exact.p50), (bucketed.p95, exact.p95))
    )


@pytest.mark.django_db
@pytest.mark.parametrize("days", [7, 30, 90])
def test_the_tallies_and_the_exact_figures_agree_on_a_varied_history(rita: Any, rob: Any, days: int) -> None:
    now = timezone.now()
    history = varied(rita, rob, now=now)
    assert review_tally.approvals_tally(batch=37) == len(history)
    tallied = stats.stats(rita, days=days, now=now)
    exact = stats.stats(rita, days=days, now=now, in_database=EXACT_IN_DATABASE)
    assert tallied.bucketed and not exact.bucketed
    assert _counts(tallied) == _counts(exact)
    assert exact.overall.n > 20
    pairs = list(zip(_timings(tallied), _timings(exact), strict=True))
    assert all(_close(b, e) for b, e in pairs), [(b, e) for b, e in pairs if not _close(b, e)]
    # The error is really there to state: the buckets do not answer exactly.
    assert any(b.p50 != e.p50 for b, e in pairs if e.p50 is not None)


@pytest.mark.django_db
@pytest.mark.parametrize("days", [7, 90])
def test_read_at_the_present_todays_tally_and_the_exact_figures_agree(rita: Any, rob: Any, days: int) -> None:
    """With no `now` given, today is read from its tally too (it holds only calls closed
    before now) and from the calls closed since the fold."""
    history = varied(rita, rob, now=timezone.now())
    run = rows.a_run("demo")
    history.append(rows.approval(run, by=rita, wait=3, closed_ago=rows.today_ago(90)))  # today, before the fold
    assert review_tally.approvals_tally(batch=37) == len(history)
    rows.approval(run, by=rob, wait=5, closed_ago=rows.today_ago(60))  # today, after the fold
    today = timezone.now().astimezone(dt.UTC).date()
    assert ReviewTally.objects.filter(day=today).exists()
    tallied = stats.stats(rita, days=days)
    exact = stats.stats(rita, days=days, in_database=EXACT_IN_DATABASE)
    assert tallied.bucketed and not exact.bucketed
    assert _counts(tallied) == _counts(exact)
    pairs = list(zip(_timings(tallied), _timings(exact), strict=True))
    assert all(_close(b, e) for b, e in pairs), [(b, e) for b, e in pairs if not _close(b, e)]


@pytest.mark.django_db
def test_folding_twice_counts_nothing_twice(rita: Any, rob: Any) -> None:
    history = varied(rita, rob, now=timezone.now())
    rows.approval(rows.a_run("scripted"), status="pending")  # never folded
    assert review_tally.approvals_tally() == len(history)
    assert review_tally.approvals_tally() == 0
    assert ReviewTally.objects.aggregate(n=Sum("n"))["n"] == len(history)
    people = sum(1 for a in history if a.status in ("approved", "rejected"))
    assert ReviewTiming.objects.aggregate(n=Sum("n"))["n"] == people
    assert not Approval.objects.exclude(status="pending").filter(tallied=False).exists()


@pytest.mark.django_db(transaction=True)
@requires_postgres()
def test_concurrent_folds_count_each_call_once(defaults: None) -> None:
    rita, rob = person("rita", "reviewer"), person("rob", "reviewer")
    history = varied(rita, rob, now=timezone.now())
    folded = at_once(lambda _: review_tally.approvals_tally(batch=11), range(4))
    assert sum(folded) == len(history)
    assert ReviewTally.objects.aggregate(n=Sum("n"))["n"] == len(history)
    people = sum(1 for a in history if a.status in ("approved", "rejected"))
    assert ReviewTiming.objects.aggregate(n=Sum("n"))["n"] == people


@pytest.mark.django_db
def test_a_call_closed_after_the_fold_shows_before_the_next(rita: Any, rob: Any) -> None:
    now = timezone.now()
    varied(rita, rob, now=now)
    review_tally.approvals_tally()
    before = stats.stats(rita, days=30, now=now)
    run = rows.a_run("demo")
    # One decided today, one committed late into a day already folded.
    rows.approval(run, by=rob, wait=5, closed_ago=60, now=now)
    rows.approval(run, by=rob, wait=5, closed_ago=3 * DAY, now=now, status="rejected")
    after = stats.stats(rita, days=30, now=now)
    assert after.bucketed and after.overall.n == before.overall.n + 2
    rob_before = next(r for r in before.reviewers if r.name == "rob")
    rob_after = next(r for r in after.reviewers if r.name == "rob")
    assert (rob_after.approved, rob_after.rejected) == (rob_before.approved + 1, rob_before.rejected + 1)
    assert review_tally.approvals_tally() == 2
    assert _counts(stats.stats(rita, days=30, now=now)) == _counts(after)


@pytest.mark.django_db
def test_the_page_says_its_percentiles_come_from_buckets(rita: Any, rob: Any) -> None:
    varied(rita, rob, now=timezone.now())
    assert 'id="bucketed"' not in client_for(rita).get("/reviews/stats/?days=30").content.decode()
    review_tally.approvals_tally()
    html = client_for(rita).get("/reviews/stats/?days=30").content.decode()
    assert "each within 4.4% of the exact value" in html
    # One day is charted by the hour: exact.
    assert 'id="bucketed"' not in client_for(rita).get("/reviews/stats/?days=1").content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize("field", ["reviewer_group", "backup_group"])
def test_a_reviewer_of_one_agent_reads_only_its_tallies(rita: Any, rob: Any, root: Any, field: str) -> None:
    """A member of one agent's reviewer group, or of its backup group (its escalated
    calls alone), reads only those tallies, and they agree with the exact figures."""
    Group.objects.get_or_create(name="demo-team")
    AgentProfile.objects.filter(name="demo").update(**{field: "demo-team"})
    dora = person("dora", "demo-team")
    now = timezone.now()
    varied(rita, rob, now=now)
    review_tally.approvals_tally()
    tallied = stats.stats(dora, days=30, now=now)
    exact = stats.stats(dora, days=30, now=now, in_database=EXACT_IN_DATABASE)
    assert tallied.bucketed and _counts(tallied) == _counts(exact)
    assert [a for a, _ in tallied.agents] == ["demo"]
    assert 0 < tallied.overall.n < stats.stats(root, days=30, now=now).overall.n  # root sees every call


def test_a_percentile_from_buckets_interpolates_between_ranks() -> None:
    assert review_tally.percentile({}, 0.5) is None
    b = review_tally.bucket_of(10.0)
    assert review_tally.percentile({b: 3}, 0.5) == review_tally.bucket_seconds(b)
    assert review_tally.bucket_seconds(b) == pytest.approx(10.0, rel=review_tally.MAX_ERROR)
    low, high = review_tally.bucket_of(10.0), review_tally.bucket_of(40.0)
    mid = review_tally.percentile({low: 1, high: 1}, 0.5)
    assert mid == pytest.approx((review_tally.bucket_seconds(low) + review_tally.bucket_seconds(high)) / 2)


@pytest.mark.django_db
def test_a_decision_after_a_cached_read_shows_on_the_next_load(rita: Any, rob: Any) -> None:
    """The days before yesterday are read once per version of the tallies and cached:
    a call decided after that read shows on the next load, whether it closed today or
    late into a cached day, before the fold and after it, counted once."""
    varied(rita, rob, now=timezone.now())
    review_tally.approvals_tally()
    first = stats.stats(rita, days=30)
    assert first.bucketed and _counts(stats.stats(rita, days=30)) == _counts(first)  # the cached read
    run = rows.a_run("demo")
    rows.approval(run, by=rob, wait=5, closed_ago=rows.today_ago(60))
    rows.approval(run, by=rob, wait=5, closed_ago=5 * DAY, status="rejected")  # into a cached day
    after = stats.stats(rita, days=30)
    assert after.overall.n == first.overall.n + 2
    rob_before = next(r for r in first.reviewers if r.name == "rob")
    rob_after = next(r for r in after.reviewers if r.name == "rob")
    assert (rob_after.approved, rob_after.rejected) == (rob_before.approved + 1, rob_before.rejected + 1)
    before_fold = review_tally.version()
    assert review_tally.approvals_tally() == 2
    folded = stats.stats(rita, days=30)
    assert _counts(folded) == _counts(after)
    assert _counts(folded) == _counts(stats.stats(rita, days=30, in_database=EXACT_IN_DATABASE))
    assert review_tally.version() != before_fold  # a past day changed: the cached sums were stale


@pytest.mark.django_db
@pytest.mark.parametrize("days", [7, 90])
def test_the_cached_past_days_agree_with_the_exact_figures(rita: Any, rob: Any, days: int) -> None:
    """Read twice (the second from the cache) and for another scope (its own entry),
    the figures are the exact ones; folding only today's calls leaves the version."""
    Group.objects.get_or_create(name="demo-reviewers")
    AgentProfile.objects.filter(name="demo").update(reviewer_group="demo-reviewers")
    dora = person("dora", "demo-reviewers")
    varied(rita, rob, now=timezone.now())
    review_tally.approvals_tally()
    version = review_tally.version()
    rows.approval(rows.a_run("demo"), by=rob, wait=5, closed_ago=rows.today_ago(60))
    assert review_tally.approvals_tally() == 1
    assert review_tally.version() == version  # today's call: the past days are as cached
    for user in (rita, rita, dora, dora):
        tallied = stats.stats(user, days=days)
        exact = stats.stats(user, days=days, in_database=EXACT_IN_DATABASE)
        assert tallied.bucketed and _counts(tallied) == _counts(exact)
        pairs = list(zip(_timings(tallied), _timings(exact), strict=True))
        assert all(_close(b, e) for b, e in pairs), [(b, e) for b, e in pairs if not _close(b, e)]
    assert [a for a, _ in stats.stats(dora, days=days).agents] == ["demo"]


def _events_exact(days: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Escalations per agent and lapsed claims per claimant over the last `days`, counted
    here row by row."""
    now = timezone.now()
    since = now - dt.timedelta(days=days)
    esc: dict[str, int] = {}
    for a in Approval.objects.filter(escalated_at__gte=since, escalated_at__lte=now).select_related("run__profile"):
        esc[a.run.profile.name] = esc.get(a.run.profile.name, 0) + 1
    lapsed: dict[str, int] = {}
    for c in ApprovalClaim.objects.select_related("user"):
        if (c.end == "lapsed" and c.ended_at is not None and since <= c.ended_at <= now) or (
            c.ended_at is None and since <= c.until < now
        ):
            lapsed[c.user.username] = lapsed.get(c.user.username, 0) + 1
    return sorted(esc.items()), sorted(lapsed.items())


@pytest.mark.django_db
@pytest.mark.parametrize("days", [7, 90])
def test_cached_escalations_and_lapsed_claims_are_right_and_new_ones_show(rita: Any, rob: Any, days: int) -> None:
    """Once the fold has written a version, a viewer who sees every call reads the whole
    days before yesterday's escalations and lapsed claims from the cache: the same as
    counted row by row, read twice, and one escalated or lapsing since shows next."""
    history = varied(rita, rob, now=timezone.now())
    for i, a in enumerate(history[:60]):
        ago = (i * 37_811) % int(40 * DAY) + 30
        if i % 3:
            rows.claim(a, rita if i % 2 else rob, until_ago=ago, end="lapsed", ended_ago=ago)
        else:
            rows.claim(a, rob, until_ago=ago, end="released", ended_ago=ago + 5)
    review_tally.approvals_tally()
    assert review_tally.version()  # the late calls folded: the events are cached
    for _ in range(2):
        figures = stats.stats(rita, days=days)
        assert (figures.escalations, figures.lapsed) == _events_exact(days)
    assert figures.escalated and figures.lapsed_total
    waiting = rows.approval(rows.a_run("demo"), status="pending", wait=500, escalated_ago=100)
    rows.claim(waiting, rob, until_ago=30)  # ran out, nothing recorded it yet
    after = stats.stats(rita, days=days)
    assert (after.escalations, after.lapsed) == _events_exact(days)
    assert after.escalated == figures.escalated + 1 and after.lapsed_total == figures.lapsed_total + 1


@pytest.mark.django_db
@pytest.mark.parametrize("scan", [stats_fatigue.FATIGUE_SCAN, 3])
def test_calls_not_folded_yet_count_whether_read_once_or_counted_apart(
    rita: Any, rob: Any, scan: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page reads the calls closed since the fold once, for the window and the
    fatigue streaks; past FATIGUE_SCAN of them (no sweeper yet) the window counts them
    in the database instead. Either way the figures are the exact ones."""
    varied(rita, rob, now=timezone.now())
    review_tally.approvals_tally()
    run = rows.a_run("demo")
    for i in range(6):
        rows.approval(run, by=rob if i % 2 else rita, wait=5 + i, closed_ago=60 + i * 2 * DAY,
                      status="rejected" if i % 3 == 0 else "approved")
    monkeypatch.setattr(stats_fatigue, "FATIGUE_SCAN", scan)
    tallied = stats.stats(rita, days=30)
    exact = stats.stats(rita, days=30, in_database=EXACT_IN_DATABASE)
    assert tallied.bucketed and _counts(tallied) == _counts(exact)


@pytest.mark.django_db
@pytest.mark.parametrize("days", [7, 30])
def test_the_partial_first_day_is_cut_from_its_kept_calls_and_a_late_one_shows(
    rita: Any, rob: Any, days: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the fold has written a version, a viewer who sees every call has the window's
    partial first day cut from that day's folded calls, kept between loads: the exact
    counts, at two starts in the day and read twice; a call closed late into that day
    shows before the fold (not folded yet) and after it (a new version)."""
    kept: list[dt.date] = []
    past_calls = stats_tallied._past_calls
    monkeypatch.setattr(stats_tallied, "_past_calls", lambda v, p, day: kept.append(day) or past_calls(v, p, day))
    now = timezone.now()
    varied(rita, rob, now=now)
    run = rows.a_run("demo")
    rows.approval(run, by=rob, wait=8, closed_ago=days * DAY - 1, now=now)  # the window's first second
    rows.approval(run, by=rita, wait=9, closed_ago=days * DAY + 60, now=now, status="rejected")  # just before it
    review_tally.approvals_tally()
    assert review_tally.version()
    for at in (now, now, now - dt.timedelta(minutes=61)):
        tallied = stats.stats(rita, days=days, now=at)
        exact = stats.stats(rita, days=days, now=at, in_database=EXACT_IN_DATABASE)
        assert tallied.bucketed and _counts(tallied) == _counts(exact)
    assert len(kept) == 3
    before = stats.stats(rita, days=days, now=now)
    rows.approval(run, by=rob, wait=5, closed_ago=days * DAY - 30, now=now, status="rejected")  # late, not folded
    late = stats.stats(rita, days=days, now=now)
    assert late.overall.n == before.overall.n + 1
    assert _counts(late) == _counts(stats.stats(rita, days=days, now=now, in_database=EXACT_IN_DATABASE))
    assert review_tally.approvals_tally() == 1
    assert _counts(stats.stats(rita, days=days, now=now)) == _counts(late)
    assert len(kept) == 6


@pytest.mark.django_db
@requires_postgres()
def test_the_databases_wait_bucket_is_the_folds() -> None:
    """The exact part's bucket, worked out in PostgreSQL (BucketOf), is the one the
    fold gives the same wait (review_tally.bucket_of), at and around bucket edges."""
    run = rows.a_run("demo")
    waits = [0.0004, 0.001, 0.2, 1, 2, 3, 7.5, 8, 59.999999, 60, 64, 90.509668, 3600, 4096, 10800, 86400, 40 * DAY]
    made = {rows.approval(run, wait=w).pk: w for w in waits}
    found = dict(Approval.objects.filter(pk__in=made).annotate(b=BucketOf()).values_list("pk", "b"))
    assert found == {pk: review_tally.bucket_of(w) for pk, w in made.items()}
