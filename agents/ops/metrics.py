"""Prometheus metrics read from the database at scrape time, exact whatever process died.

Two sources, both cheap at 100,000 runs and 10,000 pending approvals:

1. Gauges of what is true now, from indexed GROUP BYs: runs in a non-terminal state
   (`run_state_created`), pending approvals and the oldest one (`approval_status_created`).
2. Counters and histograms folded from the append-only transition log into
   `MetricTally` rows. Each scrape folds only the transitions committed since the last
   one (a primary-key range), under a row lock so two scrapers never fold the same
   transition twice. A transition is folded once it is AIRLOCK_METRICS_FOLD_LAG_SECONDS
   old: its id was taken at INSERT, and a commit that had not landed yet when a later id
   was folded would otherwise be skipped for good. The hot path (each transition) pays
   nothing: no extra statement, no shared row to lock.

Histograms come from the durations the transitions record (`duration_ms`), not from
prometheus-client's multiprocess mode: workers run on other hosts than the web server
and are killed at any moment, and the log already holds every duration.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import BigIntegerField, Case, Count, F, IntegerField, Max, Min, Q, Sum, Value, When
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from agents.engine import decisions, states
from agents.models import AgentProfile, Approval, ApprovalClaim, MetricTally, Run, Transition

# -- reason kinds: the one map from a failure's free-text reason to a label ---------------

# First matching prefix wins (the engine's and the store's wording, agents/engine/limits.py,
# planning.py, human.py, driver.poison_reason); anything else is "other".
REASON_PREFIXES: tuple[tuple[str, str], ...] = (
    ("deadline passed", "deadline"),
    ("step budget exhausted", "max_steps"),
    ("cost budget exhausted", "cost"),
    ("token ceiling reached", "tokens"),
    ("too many consecutive tool errors", "consecutive_errors"),
    ("repeated identical call", "repeated_call"),
    ("model error: script exhausted", "script_exhausted"),
    ("model error", "model_error"),
    ("poison run", "poison"),
    ("failed by", "reviewer"),
)
OTHER = "other"
REASON_KINDS: tuple[str, ...] = (*dict.fromkeys(kind for _, kind in REASON_PREFIXES), OTHER)


def reason_kind(reason: str | None) -> str:
    for prefix, kind in REASON_PREFIXES:
        if (reason or "").startswith(prefix):
            return kind
    return OTHER


def _reason_kind_sql(field: str) -> Case:
    """reason_kind() as SQL, from the same table."""
    return Case(*(When(**{f"{field}__startswith": p}, then=Value(k)) for p, k in REASON_PREFIXES), default=Value(OTHER))


# -- histograms ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    name: str  # the tally name, and the metric's after "airlock_"
    labels: tuple[str, ...]
    doc: str
    bounds_ms: tuple[int, ...]

    def bucket_sql(self, field: str) -> Case:
        whens = [When(**{f"{field}__lte": b}, then=Value(i)) for i, b in enumerate(self.bounds_ms)]
        return Case(*whens, default=Value(len(self.bounds_ms)), output_field=IntegerField())

    def bucket(self, ms: int) -> int:
        return next((i for i, b in enumerate(self.bounds_ms) if ms <= b), len(self.bounds_ms))


MODEL_CALL = Histogram(
    "model_call_seconds", ("agent",), "Model call latency, from the model transitions' recorded durations.",
    (100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000),
)
TOOL_CALL = Histogram(
    "tool_call_seconds", ("tool",), "Tool call duration, from the tool transitions' recorded durations.",
    (10, 50, 100, 500, 1_000, 5_000, 10_000, 30_000, 60_000, 300_000),
)
APPROVAL_WAIT = Histogram(
    "approval_wait_seconds", ("tool",), "Time from a call's approval request to a reviewer's decision.",
    (10_000, 30_000, 60_000, 300_000, 900_000, 1_800_000, 3_600_000, 14_400_000, 86_400_000),
)
# By agent and how the question closed: a person's decision (DECISIONS) or its expiry.
EXPIRE = "expire"
DECISION_LABELS: tuple[str, ...] = (*decisions.DECISIONS, EXPIRE)
APPROVAL_DECISION = Histogram(
    "approval_decision_seconds", ("agent", "decision"),
    "Time from a call's approval request to its decision by a person, or to its expiry (decision=expire).",
    APPROVAL_WAIT.bounds_ms,
)
HISTOGRAMS = (MODEL_CALL, TOOL_CALL, APPROVAL_WAIT, APPROVAL_DECISION)

# Tally names of the plain counters.
FINISHED = "runs_finished"  # labels: agent, terminal state
FAILED = "runs_failed"  # labels: agent, reason kind
COST = "cost_micros"  # labels: agent
TOKENS = "tokens"  # labels: agent, direction
MARK = "_folded_through"  # `total`: the last transition id folded
# Counted where they happen (observe_escalation, observe_lapsed_claim), not folded.
ESCALATIONS = "approval_escalations"  # labels: agent
LAPSED_CLAIMS = "claims_lapsed"  # no labels
FOLD_BATCH = 200_000  # transitions per scrape at most, so a first scrape of a big log stays bounded


def _labels(*values: Any) -> str:
    return json.dumps([str(v) for v in values], separators=(",", ":"))


# -- the fold ------------------------------------------------------------------------------


def fold() -> int:
    """Fold transitions committed since the last fold into the tallies; returns how many.

    1. Lock the watermark row (a second scraper waits here, then finds nothing new).
    2. The range: ids above the watermark, up to the first transition younger than the
       lag (or the newest one), at most FOLD_BATCH of them.
    3. Add that range's aggregates to the tallies and move the watermark, in the same
       transaction: a fold is applied entirely or not at all.
    """
    MetricTally.objects.get_or_create(name=MARK, labels="", bucket=-1)
    with transaction.atomic():
        mark = MetricTally.objects.select_for_update().get(name=MARK, labels="", bucket=-1)
        low = mark.total
        cutoff = timezone.now() - dt.timedelta(seconds=settings.AIRLOCK_METRICS_FOLD_LAG_SECONDS)
        newer = Transition.objects.filter(pk__gt=low)
        bounds = newer.aggregate(young=Min("pk", filter=Q(created_at__gte=cutoff)), top=Max("pk"))
        if bounds["top"] is None:
            return 0
        high = bounds["top"] if bounds["young"] is None else bounds["young"] - 1
        high = min(high, low + FOLD_BATCH)
        if high <= low:
            return 0
        rows = Transition.objects.filter(pk__gt=low, pk__lte=high)
        deltas: dict[tuple[str, str, int], list[int]] = defaultdict(lambda: [0, 0])
        for name, labels, bucket, n, total in _aggregates(rows):
            d = deltas[(name, labels, bucket)]
            d[0] += n
            d[1] += total
        for (name, labels, bucket), (n, total) in deltas.items():
            updated = MetricTally.objects.filter(name=name, labels=labels, bucket=bucket).update(
                count=F("count") + n, total=F("total") + total
            )
            if not updated:
                # Nobody else writes tallies while we hold the watermark lock.
                MetricTally.objects.create(name=name, labels=labels, bucket=bucket, count=n, total=total)
        folded = rows.count()
        mark.total = high
        mark.save(update_fields=["total"])
    return folded


def _aggregates(rows: Any) -> Iterator[tuple[str, str, int, int, int]]:
    """(tally name, labels, bucket, count, total) for one range of transitions."""
    agent = F("run__profile__name")
    for r in rows.filter(to_state__in=states.TERMINAL).values("to_state", a=agent).annotate(n=Count("pk")):
        yield FINISHED, _labels(r["a"], r["to_state"]), -1, r["n"], 0
    failed = rows.filter(to_state=states.FAILED).values(k=_reason_kind_sql("payload__reason"), a=agent)
    for r in failed.annotate(n=Count("pk")):
        yield FAILED, _labels(r["a"], r["k"]), -1, r["n"], 0
    tokens = {d: Sum(Cast(KT(f"payload__usage__{d}_tokens"), BigIntegerField())) for d in ("input", "output")}
    models = rows.filter(kind="model").values(a=agent).annotate(n=Count("pk"), cost=Sum("cost_micros"), **tokens)
    for r in models:
        yield COST, _labels(r["a"]), -1, r["n"], r["cost"] or 0
        for d in ("input", "output"):
            yield TOKENS, _labels(r["a"], d), -1, r["n"], r[d] or 0
    for hist, kind, label in ((MODEL_CALL, "model", agent), (TOOL_CALL, "tool", KT("payload__call__tool"))):
        timed = rows.filter(kind=kind)
        if kind == "tool":
            # A replayed result was read from the journal, not run: no duration to count.
            timed = timed.exclude(payload__has_key="replayed")
        grouped = timed.values(b=hist.bucket_sql("duration_ms"), l=label).annotate(n=Count("pk"), ms=Sum("duration_ms"))
        for r in grouped:
            yield hist.name, _labels(r["l"]), r["b"], r["n"], r["ms"] or 0
    yield from _approval_waits(rows.filter(kind__in=("decision", "expiry")))


def _approval_waits(closing: Any) -> Iterator[tuple[str, str, int, int, int]]:
    """The wait of each question a decision or expiry transition closed: its
    approval's request to its decision. They come at a human's pace, so this matches
    them in Python."""
    found = list(closing.values("run_id", "created_at", "kind", call=KT("payload__call_id"), agent=F("run__profile__name")))
    if not found:
        return
    approvals: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    decided = Approval.objects.filter(run_id__in={d["run_id"] for d in found}, decided_at__isnull=False).filter(
        ~Q(decision="") | Q(status=Approval.Status.EXPIRED)
    )
    for a in decided.values("run_id", "call_id", "tool", "created_at", "decided_at", "decision", "status"):
        approvals[(a["run_id"], a["call_id"])].append(a)
    for d in found:
        expiry = d["kind"] == "expiry"
        # The latest approval of that call closed (that way) before its transition.
        candidates = [
            a for a in approvals[(d["run_id"], d["call"])]
            if a["decided_at"] <= d["created_at"] and (a["status"] == Approval.Status.EXPIRED) == expiry
        ]
        if not candidates:
            continue
        a = max(candidates, key=lambda a: a["decided_at"])
        ms = max(0, int((a["decided_at"] - a["created_at"]).total_seconds() * 1000))
        if not expiry:
            yield APPROVAL_WAIT.name, _labels(a["tool"]), APPROVAL_WAIT.bucket(ms), 1, ms
        how = EXPIRE if expiry else a["decision"]
        yield APPROVAL_DECISION.name, _labels(d["agent"], how), APPROVAL_DECISION.bucket(ms), 1, ms


# -- counted where they happen -------------------------------------------------------------


def observe_escalation(agent: str) -> None:
    """One call of `agent`'s escalated (`airlock_approval_escalations_total`). Call it in
    the transaction that sets the approval's `escalated_at`: a rollback takes it back,
    so each escalation counts once whatever process dies."""
    _bump(ESCALATIONS, _labels(agent))


def _bump(name: str, labels: str) -> None:
    updated = MetricTally.objects.filter(name=name, labels=labels, bucket=-1).update(count=F("count") + 1)
    if updated:
        return
    try:
        with transaction.atomic():  # a savepoint: losing the race to create the row is no error
            MetricTally.objects.create(name=name, labels=labels, bucket=-1, count=1)
    except IntegrityError:
        # Another transaction created the row between our UPDATE and INSERT (the INSERT
        # waited for it to commit): add ours to theirs.
        MetricTally.objects.filter(name=name, labels=labels, bucket=-1).update(count=F("count") + 1)


# -- the collector -------------------------------------------------------------------------


class AirlockCollector(Collector):
    """Every metric of `GET /metrics`, computed at scrape time (see the module doc)."""

    def collect(self) -> Iterable[Metric]:
        fold()
        tallies: dict[str, list[MetricTally]] = defaultdict(list)
        for tally in MetricTally.objects.exclude(name=MARK):
            tallies[tally.name].append(tally)
        agents = dict(AgentProfile.objects.values_list("pk", "name"))
        yield self._runs(agents, tallies[FINISHED])
        yield from self._approvals()
        yield self._counter(FINISHED, "Runs that reached a terminal state.", ["agent", "state"], tallies[FINISHED])
        yield self._counter(FAILED, "Runs that failed, by the kind of their reason.", ["agent", "reason_kind"],
                            tallies[FAILED])
        yield self._counter(COST, "Model cost in micro-dollars (calls reporting no usage count 0).", ["agent"],
                            tallies[COST], value="total")
        yield self._counter(TOKENS, "Model tokens, input and output.", ["agent", "direction"], tallies[TOKENS],
                            value="total")
        for hist in HISTOGRAMS:
            yield self._histogram(hist, tallies[hist.name])
        yield self._counter(ESCALATIONS, "Calls escalated to their profile's backup group.", ["agent"],
                            tallies[ESCALATIONS])
        yield self._lapsed_claims()

    def _runs(self, agents: dict[int, str], finished: list[MetricTally]) -> Metric:
        counts: dict[tuple[str, str], int] = {(s, a): 0 for s in states.STATES for a in agents.values()}
        # By profile id, named from the profiles already read: no join over the rows.
        live = Run.objects.filter(state__in=states.ACTIVE).values("state", "profile_id").annotate(n=Count("pk"))
        for r in live:
            counts[(r["state"], agents[r["profile_id"]])] = r["n"]
        for tally in finished:
            agent, state = json.loads(tally.labels)
            counts[(state, agent)] = counts.get((state, agent), 0) + tally.count
        gauge = GaugeMetricFamily("airlock_runs", "Runs by state and agent profile.", labels=["state", "agent"])
        for (state, agent), n in sorted(counts.items()):
            gauge.add_metric([state, agent], n)
        return gauge

    def _approvals(self) -> Iterator[Metric]:
        pending = Approval.objects.pending()
        gauge = GaugeMetricFamily(
            "airlock_approvals_pending", "Calls waiting for a reviewer, by tool and risk.", labels=["tool", "risk"]
        )
        for r in pending.values("tool", "risk").annotate(n=Count("pk")).order_by("tool", "risk"):
            gauge.add_metric([r["tool"], r["risk"]], r["n"])
        yield gauge
        oldest = pending.aggregate(oldest=Min("created_at"))["oldest"]
        age = max(0.0, (timezone.now() - oldest).total_seconds()) if oldest else 0.0
        yield GaugeMetricFamily(
            "airlock_approval_oldest_pending_seconds", "Age of the oldest pending approval (0 when none).", value=age
        )
        by_channel = CounterMetricFamily(
            "airlock_decisions", "Decisions by people, by where they were made and what they decided.",
            labels=["via", "decision"],
        )
        decided = Approval.objects.exclude(via="").values("via", "decision").annotate(n=Count("pk"))
        for r in decided.order_by("via", "decision"):
            by_channel.add_metric([r["via"], r["decision"]], r["n"])
        yield by_channel

    def _lapsed_claims(self) -> Metric:
        """Counted from the claims' own rows, not tallied: a lapse is recorded in several
        places (the next claim, a release, the sweeper, the transition that closes the
        call), and one that nothing recorded yet has lapsed all the same."""
        now = timezone.now()
        lapsed = ApprovalClaim.objects.filter(Q(end="lapsed") | Q(ended_at__isnull=True, until__lte=now)).count()
        counter = CounterMetricFamily(
            f"airlock_{LAPSED_CLAIMS}", "Claims whose time ran out before the claimant decided or let go.", labels=[]
        )
        counter.add_metric([], lapsed)
        return counter

    def _counter(
        self, name: str, doc: str, labels: list[str], tallies: list[MetricTally], *, value: str = "count"
    ) -> Metric:
        counter = CounterMetricFamily(f"airlock_{name}", doc, labels=labels)
        for tally in sorted(tallies, key=lambda t: t.labels):
            counter.add_metric(json.loads(tally.labels), getattr(tally, value))
        return counter

    def _histogram(self, hist: Histogram, tallies: list[MetricTally]) -> Metric:
        by_label: dict[str, dict[int, MetricTally]] = defaultdict(dict)
        for tally in tallies:
            by_label[tally.labels][tally.bucket] = tally
        family = HistogramMetricFamily(f"airlock_{hist.name}", hist.doc, labels=list(hist.labels))
        for labels, buckets in sorted(by_label.items()):
            cumulative, out = 0, []
            for i, bound in enumerate((*hist.bounds_ms, None)):
                cumulative += buckets[i].count if i in buckets else 0
                out.append(("+Inf" if bound is None else f"{bound / 1000:g}", cumulative))
            total_ms = sum(t.total for t in buckets.values())
            family.add_metric(json.loads(labels), out, sum_value=total_ms / 1000)
        return family


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(AirlockCollector())
