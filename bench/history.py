"""History rules (issue 49): a proposed call judged under five history rules against the
same call under none, at 100,000 recorded calls in the rules' scope, side by side in one
run. `make bench` runs it; it adds the section "history" to bench/results.json and prints
one line. Target: p50 with the rules <= 1.3x p50 without.

What is timed is one proposal through the decision API's function
(`external.call_propose`: read and lock the run, judge, commit), the path every external
call and every gateway call takes, for a client tool the policy lets through. The two
arms alternate call by call, on two profiles of one project that differ only in their
rules; the 100,000 calls (one hour of a busy caller's refunds over 20,000 orders and
5,000 customers) are journal rows of the ruled profile, written straight into the table.
BENCH_HISTORY_CALLS sets their number, BENCH_HISTORY_SAMPLES the proposals per arm.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run as airlock_bench  # noqa: E402  (bench/run.py: environment, Django set-up)

CALLS = int(os.environ.get("BENCH_HISTORY_CALLS", "100000"))
SAMPLES = int(os.environ.get("BENCH_HISTORY_SAMPLES", "300"))
PER_RUN = 10  # proposals per run (a run's steps are limited)
REFUND = {
    "name": "issue_refund",
    "description": "Refund part of an order",
    "schema": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "customer": {"type": "string"}, "amount": {"type": "number"}},
        "required": ["order_id", "customer", "amount"],
    },
    "risk": "write",
    "returns": "internal",
    "retry_safety": "unsafe",
}
# The four examples, and a fifth over the project's orders: none holds for the
# timed calls (new orders and customers, no export), so both arms take the same path
# and differ only by the judgement's reads.
RULES = [
    {"tool": "issue_refund", "then": "ask", "reason": "a third refund of one order in a day",
     "history": {"within": "24h", "scope": "profile", "same": ["order_id"], "calls_over": 2}},
    {"tool": "issue_refund", "then": "ask", "reason": "over 500 EUR to one customer this week",
     "history": {"within": "7d", "scope": "project", "same": ["customer"], "sum_over": {"amount": 500}}},
    {"tool": "issue_refund", "then": "ask", "reason": "a refund after reading a customer export",
     "history": {"scope": "run", "after": ["export_customers", "crm__*"]}},
    {"tool": "*", "then": "deny", "reason": "runaway client",
     "history": {"within": "1h", "scope": "caller", "calls_over": 200, "of": ["export_customers"]}},
    {"tool": "issue_refund", "then": "ask", "reason": "over 1,000 EUR for one order in a day",
     "history": {"within": "24h", "scope": "project", "same": ["order_id"], "sum_over": {"amount": 1000}}},
]


def seed(profile: Any, user: Any, calls: int) -> None:
    """`calls` journal rows of `profile`'s runs (100 calls a run) in the last hour."""
    from django.db import connection

    from agents.actions.runs import run_launch
    from agents.models import Run

    runs = max(1, calls // 100)
    template = run_launch(agent=profile, task="seed", user=user)
    # Copies of one launched run (every column but the id), marked as seed runs.
    columns = [f.column for f in Run._meta.concrete_fields if f.column != "id"]
    values = ["'seed'" if c == "task" else "'done'" if c == "state" else c for c in columns]
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO agents_run ({', '.join(columns)}) SELECT {', '.join(values)}"
            " FROM agents_run, generate_series(1, %s) WHERE id = %s",
            [runs, template.pk],
        )
        cur.execute(
            "INSERT INTO agents_toolcall (run_id, idempotency_key, fingerprint, step, call_id, tool, args, status,"
            " result, result_chars, result_truncated, attempts, created_at, finished_at)"
            " SELECT r.id, md5(r.id || ':' || g), md5(g::text), g, 'c' || g, 'issue_refund',"
            " jsonb_build_object('order_id', 'o' || (random() * 20000)::int, 'customer', 'c' || (random() * 5000)::int,"
            " 'amount', (random() * 100)::int), 'succeeded', '{\"ok\": true}', 12, false, 1,"
            " now() - random() * interval '55 minutes', now()"
            " FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM agents_run WHERE task = 'seed'"
            " AND profile_id = %s) r, generate_series(1, %s) g WHERE r.n <= %s",
            [profile.pk, min(100, calls), runs],
        )
        cur.execute("ANALYZE agents_toolcall")
        cur.execute("ANALYZE agents_run")


def history_bench(calls: int = CALLS, samples: int = SAMPLES) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from agents.actions import external
    from agents.actions.runs import run_launch
    from agents.models import AgentProfile, Project, ToolCall

    airlock_bench.truncate()
    user, _ = get_user_model().objects.get_or_create(username="bench-history", defaults={"is_superuser": True})
    project, _ = Project.objects.get_or_create(slug="bench-history", defaults={"name": "Bench history"})
    arms = {}
    for name, rules in (("none", []), ("five", RULES)):
        arms[name], _ = AgentProfile.objects.update_or_create(
            name=f"bench-history-{name}",
            defaults={"provider": "external", "client_tools": [REFUND], "tools": ["issue_refund"], "rules": rules,
                      "project": project, "limits": {"max_steps": 2 * PER_RUN + 5}},
        )
    seed(arms["five"], user, calls)
    seeded = ToolCall.objects.filter(run__profile=arms["five"]).count()
    times: dict[str, list[float]] = {"none": [], "five": []}
    runs: dict[str, Any] = {}
    for i in range(samples):
        for name in ("none", "five") if i % 2 == 0 else ("five", "none"):
            if i % PER_RUN == 0:
                runs[name] = run_launch(agent=arms[name], task="refunds", user=user).pk
            args = {"order_id": f"new-{name}-{i}", "customer": f"new-{name}-{i}", "amount": 5}
            start = time.perf_counter()
            answer = external.call_propose(run_id=runs[name], tool="issue_refund", args=args, user=user)
            times[name].append(time.perf_counter() - start)
            assert answer.verdict == "allow", answer.reason
            external.call_report(run_id=runs[name], key=answer.key, ok=True, output="refunded", user=user)
    p50 = {k: statistics.median(v) * 1000 for k, v in times.items()}
    p90 = {k: statistics.quantiles(v, n=10)[-1] * 1000 for k, v in times.items()}
    return {
        "recorded_calls": seeded,
        "samples": samples,
        "rules": len(RULES),
        "p50_ms_none": round(p50["none"], 3),
        "p50_ms_five": round(p50["five"], 3),
        "p90_ms_none": round(p90["none"], 3),
        "p90_ms_five": round(p90["five"], 3),
        "p50_ratio": round(p50["five"] / p50["none"], 3),
        "target_ratio": 1.3,
    }


def print_history(h: dict[str, Any]) -> None:
    print(
        f"\nhistory rules ({h['recorded_calls']:,} recorded calls in scope, {h['samples']} proposals per arm): "
        f"p50 {h['p50_ms_five']:.2f} ms under {h['rules']} history rules vs {h['p50_ms_none']:.2f} ms under none "
        f"= {h['p50_ratio']:.2f}x (target <= {h['target_ratio']}x); p90 {h['p90_ms_five']:.2f} vs {h['p90_ms_none']:.2f} ms"
    )


def main() -> None:
    airlock_bench.setup_django()
    out = ROOT / "bench" / "results.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results["history"] = history_bench()
    out.write_text(json.dumps(results, indent=2))
    print_history(results["history"])


if __name__ == "__main__":
    main()
