"""`make bench`'s queue-at-volume figures (issue 28): the review queue grouped and
ungrouped with 10,000 pending calls, 5,000 of them near-identical, against the minimal
page; and a batch decision of 200 calls against as many single decisions.

Prints and writes into bench/results.json (key "batch"). The pages are measured as
bench/pages.py measures them (in-process, p50 of 30 requests after 3 warm ones, taking
turns with the minimal page, at a small scale and at the full one for the query counts). The decisions alternate single,
batch, batch, single (200 calls each), so both meet the same database.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import run as base  # noqa: E402 (its setup_django sets the environment)

FULL, SMALL = 10_000, 100  # pending calls; half near-identical, half of other shapes
BATCH = 200
RULE = {"tool": "fail", "then": "ask", "reason": "refunds need a human"}
ARGS = {"order": "A-0", "amount": 25, "currency": "EUR", "reason": "damaged in transit"}


def template() -> Any:
    """One real run waiting on a refund, driven through the store, to clone."""
    from agents.actions.runs import run_launch

    run = run_launch(
        agent=base.bench_profile(), task="refund the damaged order", policy={"rules": [RULE]},
        script=[{"call": {"tool": "fail", "args": ARGS}}, {"final": "done"}],
    )
    done = base.drive(run)
    assert done.state == "awaiting_approval", (done.state, done.error)
    return done


def add_pending(t: Any, count: int) -> float:
    """`count` more pending calls cloned from `t`: every other one near-identical (the
    refund with its own order and amount), the rest of other shapes (a key of their
    own, half of them in pairs), with their group keys worked out as the store would."""
    from django.db import connection

    from agents.models import Approval
    from agents.models.approvals import call_group_key
    from bench import seed

    started = time.perf_counter()
    watermark = Approval.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    seed.clone_runs(t, count)
    with connection.cursor() as cur:
        cur.execute(
            "update agents_approval set args = case when id %% 2 = 0"
            " then jsonb_set(jsonb_set(args, '{order}', to_jsonb('A-' || id)), '{amount}', to_jsonb(id %% 500))"
            " when id %% 4 = 1 then jsonb_build_object('k' || id, id)"
            " else jsonb_build_object('pair' || (id / 8), id) end"
            " where id > %s and status = 'pending'",
            [watermark],
        )
        rows = list(Approval.objects.filter(pk__gt=watermark).values_list("pk", "kind", "tool", "rule", "args"))
        keys = [
            (call_group_key(profile_id=t.profile_id, kind=k, tool=tool, rule=rule, args=args), pk)
            for pk, k, tool, rule, args in rows
        ]
        cur.executemany("update agents_approval set group_key = %s where id = %s", keys)
    seed.settle()
    return time.perf_counter() - started


def measure_pages(client: Any) -> dict[str, Any]:
    from bench import pages

    return pages.measure(client, {"minimal": "/bench/minimal/", "reviews": "/reviews/", "grouped": "/reviews/?group=1"})


def decisions(user: Any) -> dict[str, Any]:
    """Time per call: 200 single decisions, a batch of 200, a batch, 200 singles."""
    from agents.actions.approvals import approval_batch_decide, approval_decide
    from agents.models import Approval

    pending = list(Approval.objects.pending().order_by("pk").values_list("pk", flat=True)[: 4 * BATCH])
    assert len(pending) == 4 * BATCH, len(pending)
    phases: dict[str, list[float]] = {"single": [], "batch": []}
    outcomes: dict[str, int] = {}
    for n, kind in enumerate(("single", "batch", "batch", "single")):
        ids = pending[n * BATCH : (n + 1) * BATCH]
        started = time.perf_counter()
        if kind == "single":
            for approval_id in ids:
                outcome = approval_decide(approval_id=approval_id, user=user, decision="approve").outcome
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
        else:
            for r in approval_batch_decide(approval_ids=ids, user=user, decision="approve"):
                outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        phases[kind].append((time.perf_counter() - started) * 1000 / BATCH)
    single = sum(phases["single"]) / len(phases["single"])
    batch = sum(phases["batch"]) / len(phases["batch"])
    return {
        "calls_per_phase": BATCH, "single_ms_per_call": single, "batch_ms_per_call": batch,
        "ratio_batch_to_single": batch / single, "phases": phases, "outcomes": outcomes,
    }


def batch_bench() -> dict[str, Any]:
    from django.db import connection
    from django.test import Client, override_settings

    from agents.models import Approval
    from bench.workers import reviewer

    user, _ = reviewer()
    client = Client()
    client.force_login(user)
    t = template()
    out: dict[str, Any] = {}
    with override_settings(ROOT_URLCONF="bench.urls"):
        out["seed_small_seconds"] = add_pending(t, SMALL - 1)
        small = measure_pages(client)
        out["seed_full_seconds"] = add_pending(t, FULL - SMALL)
        full = measure_pages(client)
    pending = Approval.objects.pending()
    out["rows"] = {
        "pending": pending.count(),
        "near_identical": pending.filter(group_key=Approval.objects.get(run=t).group_key).count(),
        "entries_grouped": pending.values("group_key").distinct().count(),
    }
    for name, page in full.items():
        page["ratio_p50_to_minimal"] = page["p50_ms"] / full["minimal"]["p50_ms"]
        page["constant_queries"] = page["queries"] == small[name]["queries"]
    out["small"], out["full"] = small, full
    out["decisions"] = decisions(user)
    connection.close()
    return out


def targets(b: dict[str, Any]) -> base.Targets:
    t = base.Targets()
    for name in ("reviews", "grouped"):
        t.check(f"/reviews/{'?group=1' if name == 'grouped' else ''} p50 / minimal p50, 10,000 pending",
                b["full"][name]["ratio_p50_to_minimal"], "<=", 5.0)
    t.check("batch of 200: time per call / a single decision's", b["decisions"]["ratio_batch_to_single"], "<=", 2.0)
    return t


def print_lines(b: dict[str, Any]) -> None:
    rows = b["rows"]
    print(
        f"\nqueue with {rows['pending']:,} pending calls, {rows['near_identical']:,} near-identical "
        f"({rows['entries_grouped']:,} group keys; seeded in {b['seed_full_seconds']:.1f} s)"
    )
    print(f"{'page':>9} {'p50 ms':>7} {'p95 ms':>7} {'x min p50':>9} {'queries':>8} {'small':>6} {'KB':>6}")
    for name, x in b["full"].items():
        print(
            f"{name:>9} {x['p50_ms']:>7.1f} {x['p95_ms']:>7.1f} {x['ratio_p50_to_minimal']:>9.2f} {x['queries']:>8} "
            f"{b['small'][name]['queries']:>6} {x['bytes'] / 1024:>6.0f}"
        )
    d = b["decisions"]
    print(
        f"decisions, {d['calls_per_phase']} calls a phase (single, batch, batch, single): single "
        f"{d['single_ms_per_call']:.2f} ms a call, batch {d['batch_ms_per_call']:.2f} ms a call "
        f"({d['ratio_batch_to_single']:.2f}x); outcomes {d['outcomes']}"
    )


def main() -> None:
    base.setup_django()
    base.truncate()
    started = time.perf_counter()
    b = batch_bench()
    b["seconds"] = time.perf_counter() - started
    b["targets"] = targets(b).rows
    out = ROOT / "bench" / "results.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results["batch"] = b
    out.write_text(json.dumps(results, indent=2))
    print_lines(b)
    print("\ntargets")
    for x in b["targets"]:
        print(f"  {'met   ' if x['met'] else 'MISSED'} {x['target']:<70} measured {x['value']:g}")
    print(f"\nwritten: {out.relative_to(ROOT)} (key \"batch\", {b['seconds']:.0f} s)")


if __name__ == "__main__":
    os.environ.setdefault("AIRLOCK_ALLOW_SCRIPTED", "1")
    main()
