"""`make bench`, the review statistics: /reviews/stats/ over 1M transitions and 100k
decided approvals, against the minimal page measured beside it (target: p50 within 5x).

One real run (an always-ask call decided by a reviewer, padded to 10 transitions) is
cloned in SQL (bench/seed.py) with its transitions and its approval, the clones spread
over the last 90 days; one UPDATE then gives the approvals a spread of waits, reviewers,
rules and outcomes (deterministic in the id), and an INSERT ... SELECT some lapsed
claims. Adds "stats" to bench/results.json and prints its lines.
BENCH_STATS_APPROVALS sets the size (default 100,000; 0 skips it).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run as base  # noqa: E402  (bench/run.py: environment, Django set-up)

TRANSITIONS_PER_RUN = 10
REVIEWERS = 5
WINDOWS = (7, 90)
TARGET = 5.0


def template() -> Any:
    """A finished run whose one approval a reviewer approved, TRANSITIONS_PER_RUN long."""
    from agents.actions.approvals import approval_decide
    from agents.actions.runs import run_launch
    from agents.models import Approval
    from bench.workers import profile, reviewer

    asking = profile("bench-stats", always_ask_tools=["ledger_write"])
    user, _ = reviewer()
    # Each bench_result call is two transitions; the asked call, its decision and the
    # final answer make the rest.
    script = [*base.script_of(3)[:-1], {"call": {"tool": "ledger_write", "args": {"entry": "refund 12"}}}, {"final": "done"}]
    run = base.drive(run_launch(agent=asking, task="bench stats", script=script))
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(approval_id=approval.pk, user=user, decision="approve")
    run = base.drive(run)
    assert run.state == "done", (run.state, run.error)
    return run


def vary(reviewers: list[int]) -> None:
    """Waits of 5 s to 2 h, five reviewers, four profile rules and no rule, one call in
    seven rejected, one in twenty expired, one in fifty edited; 1% escalated and 5%
    with a claim that lapsed."""
    from django.db import connection

    ids = "ARRAY[" + ",".join(str(int(i)) for i in reviewers) + "]"
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE agents_approval a SET
              decided_at = a.created_at + interval '1 second' * (5 + (a.id * 7919) % 7200),
              status = CASE WHEN a.id % 20 = 0 THEN 'expired' WHEN a.id % 7 = 0 THEN 'rejected' ELSE 'approved' END,
              decision = CASE WHEN a.id % 20 = 0 THEN '' WHEN a.id % 7 = 0 THEN 'reject' ELSE 'approve' END,
              decided_by_id = CASE WHEN a.id % 20 = 0 THEN NULL ELSE ({ids})[1 + a.id % {len(reviewers)}] END,
              via = CASE WHEN a.id % 20 = 0 THEN '' ELSE 'dashboard' END,
              round = CASE WHEN a.id % 50 = 0 THEN 1 ELSE 0 END,
              rule = CASE WHEN a.id % 5 = 0 THEN NULL ELSE jsonb_build_object(
                'tool', 'ledger_write', 'then', 'ask', 'reason', 'bench rule', 'origin', 'profile', 'index', 1 + a.id % 4) END,
              escalated_at = CASE WHEN a.id % 100 = 0 THEN a.created_at + interval '60 seconds' END
            """
        )
        cur.execute(
            f"""
            INSERT INTO agents_approvalclaim (approval_id, user_id, claimed_at, until, ended_at, "end")
            SELECT a.id, ({ids})[1 + a.id % {len(reviewers)}], a.created_at, a.created_at + interval '10 minutes',
                   a.created_at + interval '10 minutes', 'lapsed'
            FROM agents_approval a WHERE a.id % 20 = 3
            """
        )


def _stats_urls() -> dict[Any, str]:
    return {days: f"/reviews/stats/?days={days}" for days in WINDOWS}


def stats_bench(approvals: int) -> dict[str, Any]:
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.test import Client, override_settings

    from agents.models import Approval, ApprovalClaim, Transition
    from agents.ops import review_tally
    from bench import pages, seed
    from bench.workers import reviewer

    out: dict[str, Any] = {}
    started = time.perf_counter()
    t = template()
    per_run = Transition.objects.filter(run=t).count()
    spacing_ms = int(90 * 86_400_000 / approvals)  # the clones spread over 90 days
    seed.clone_runs(t, approvals - 1, parts=("transitions", "approvals"), spacing_ms=spacing_ms)
    people = [reviewer()[0].pk]
    for i in range(1, REVIEWERS):
        user, _ = User.objects.get_or_create(username=f"bench-reviewer-{i}")
        user.groups.add(Group.objects.get(name="reviewer"))
        people.append(user.pk)
    vary(people)
    seed.settle()
    with connection.cursor() as cur:
        cur.execute("vacuum (analyze) agents_approvalclaim")
    out["seed_seconds"] = time.perf_counter() - started
    user, _ = reviewer()
    client = Client()
    client.force_login(user)
    # Before any fold the page computes every figure from the approvals (the exact path,
    # as before the tallies): measured beside the minimal page for the ratio it had.
    # Fewer requests than the other pages: the 90-day exact page takes seconds each.
    timed, warm = pages.TIMED, pages.WARM
    pages.TIMED, pages.WARM = 5, 1
    with override_settings(ROOT_URLCONF="bench.urls"):
        measured = pages.measure(client, {"minimal": "/bench/minimal/", **_stats_urls()})
        out["exact_minimal"] = measured.pop("minimal")
        for days in WINDOWS:
            page = out[f"exact_{days}d"] = measured[days]
            page["ratio_p50_to_minimal"] = page["p50_ms"] / out["exact_minimal"]["p50_ms"]
    pages.TIMED, pages.WARM = timed, warm
    # The sweeper folds the closed calls into the daily tallies as they close; here the
    # whole seeded history at once. A few calls then close after that fold, as between
    # two sweeps, so the page reads those exactly.
    started = time.perf_counter()
    out["folded"] = review_tally.approvals_tally()
    out["fold_seconds"] = time.perf_counter() - started
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE agents_approval SET tallied = false WHERE id % 2000 = 1"
        )
        cur.execute("vacuum (analyze) agents_approval")
        cur.execute("vacuum (analyze) agents_reviewtally")
        cur.execute("vacuum (analyze) agents_reviewtiming")
    out["rows"] = {
        "transitions": Transition.objects.count(),
        "transitions_per_run": per_run,
        "decided_approvals": Approval.objects.exclude(status="pending").count(),
        "claims": ApprovalClaim.objects.count(),
    }
    with override_settings(ROOT_URLCONF="bench.urls"):
        measured = pages.measure(client, {"minimal": "/bench/minimal/", **_stats_urls()})
        out["minimal"] = measured.pop("minimal")
        for days in WINDOWS:
            page = out[f"stats_{days}d"] = measured[days]
            page["ratio_p50_to_minimal"] = page["p50_ms"] / out["minimal"]["p50_ms"]
    connection.close()
    return out


def print_stats(r: dict[str, Any]) -> None:
    rows = r["rows"]
    print(
        f"\nreview stats with {rows['transitions']:,} transitions, {rows['decided_approvals']:,} decided approvals, "
        f"{rows['claims']:,} claims (seeded in {r['seed_seconds']:.1f} s)"
    )
    print(f"  folded {r['folded']:,} closed calls into the daily tallies in {r['fold_seconds']:.1f} s")
    print(f"  before the fold (every figure exact): minimal page p50 {r['exact_minimal']['p50_ms']:.1f} ms")
    for days in WINDOWS:
        x = r[f"exact_{days}d"]
        print(f"    ?days={days}: p50 {x['p50_ms']:.1f} ms, {x['ratio_p50_to_minimal']:.2f}x the minimal page")
    print(f"  minimal page p50 {r['minimal']['p50_ms']:.1f} ms")
    for days in WINDOWS:
        x = r[f"stats_{days}d"]
        print(
            f"  /reviews/stats/?days={days}: p50 {x['p50_ms']:.1f} ms, p95 {x['p95_ms']:.1f} ms, {x['queries']} queries, "
            f"{x['ratio_p50_to_minimal']:.2f}x the minimal page"
        )
    t = base.Targets()
    for days in WINDOWS:
        t.check(f"/reviews/stats/?days={days} p50 / minimal page p50", r[f"stats_{days}d"]["ratio_p50_to_minimal"], "<=", TARGET)
    r["targets"] = t.rows
    for x in t.rows:
        print(f"  {'met   ' if x['met'] else 'MISSED'} {x['target']:<70} measured {x['value']:g}")


def main() -> None:
    approvals = int(os.environ.get("BENCH_STATS_APPROVALS", "100000"))
    if approvals <= 0:
        print("review stats bench skipped (BENCH_STATS_APPROVALS=0)")
        return
    base.setup_django()
    base.truncate()
    from django.db import connection

    with connection.cursor() as cur:  # the tallies and streaks hang off profiles, which truncate() keeps
        cur.execute("truncate agents_reviewtally, agents_reviewtiming, agents_reviewstreak")
    r = stats_bench(approvals)
    print_stats(r)
    out = ROOT / "bench" / "results.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results["stats"] = r
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
