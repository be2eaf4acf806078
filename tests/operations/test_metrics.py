"""GET /metrics: the Prometheus text format, parsed with prometheus-client's own parser
and checked against the database after a mix of runs; the bearer token guards it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from agents.actions.approvals import approval_decide
from agents.actions.runs import run_cancel
from agents.engine import states
from agents.models import AgentProfile, Approval, Run, Transition
from agents.ops import metrics
from tests.helpers import call, final, person, tainted_write

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-0123456789"
USAGE = {"input_tokens": 120, "output_tokens": 30}


def scrape(client: Client | None = None) -> dict[str, Any]:
    answer = (client or Client()).get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert answer.status_code == 200, answer.content[:300]
    assert answer["Content-Type"].startswith("text/plain; version=")
    return {f.name: f for f in text_string_to_metric_families(answer.content.decode())}


def samples(families: dict[str, Any], family: str, sample: str | None = None) -> dict[tuple[str, ...], float]:
    """{label values (sorted by label name): value} of one sample name of a family."""
    return {
        tuple(v for _, v in sorted(s.labels.items())): s.value
        for s in families[family].samples
        if s.name == (sample or family)
    }


@pytest.fixture
def mix(launch: Callable[..., Run], drive: Callable[..., Run], defaults: None) -> dict[str, Run]:
    """Runs in every state, with usage, prices, tool calls, failures and a decision."""
    AgentProfile.objects.create(
        name="priced", provider="scripted", price_input_micros=3_000_000, price_output_micros=15_000_000
    )
    rita = person("rita", "reviewer")
    otto = person("otto", "operator")
    runs = {
        "done": drive(launch([call("echo", USAGE, text="hi"), final("ok", USAGE)], agent="priced")),
        "max_steps": drive(launch([call("echo", text="a"), call("echo", text="b"), final()], limits={"max_steps": 2})),
        "exhausted": drive(launch([call("echo", USAGE, text="only one")], agent="priced")),
        "errors": drive(launch([call("fail", message=str(i)) for i in range(5)] + [final()])),
        "waiting": drive(launch(tainted_write())),
        "decided": drive(launch(tainted_write(entry="approved write"))),
        "queued": launch([final()]),
    }
    cancelled = drive(launch([call("sleep", seconds=0.01), final()]), max_transitions=2)
    run_cancel(run_id=cancelled.pk, user=otto)
    runs["cancelled"] = cancelled
    pending = Approval.objects.get(run=runs["decided"], status="pending")
    approval_decide(approval_id=pending.pk, user=rita, decision="approve")
    runs["decided"] = drive(runs["decided"])
    for run in runs.values():
        run.refresh_from_db()
    assert runs["done"].state == "done" and runs["decided"].state == "done"
    assert runs["max_steps"].state == runs["exhausted"].state == runs["errors"].state == "failed"
    assert runs["waiting"].state == "awaiting_approval" and runs["cancelled"].state == "cancelled"
    return runs


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
@override_settings(AIRLOCK_METRICS_TOKEN=TOKEN, AIRLOCK_METRICS_FOLD_LAG_SECONDS=0)
def test_every_metric_matches_the_database_after_a_mix_of_runs(mix: dict[str, Run]) -> None:
    families = scrape()

    by_state = Counter((r.state, r.profile.name) for r in Run.objects.select_related("profile"))
    runs = samples(families, "airlock_runs")
    assert {k: v for k, v in runs.items() if v} == {(agent, state): n for (state, agent), n in by_state.items()}
    assert runs[("priced", "planning")] == 0  # every state of every agent, zeros included

    pending = Counter(Approval.objects.filter(status="pending").values_list("tool", "risk"))
    assert samples(families, "airlock_approvals_pending") == {(risk, tool): n for (tool, risk), n in pending.items()}
    assert samples(families, "airlock_approval_oldest_pending_seconds")[()] > 0

    failed = Counter((r.profile.name, metrics.reason_kind(r.error)) for r in Run.objects.filter(state="failed"))
    assert samples(families, "airlock_runs_failed", "airlock_runs_failed_total") == failed
    assert set(failed) == {("scripted", "max_steps"), ("priced", "script_exhausted"), ("scripted", "consecutive_errors")}
    finished = Counter(
        (r.profile.name, r.state) for r in Run.objects.filter(state__in=states.TERMINAL).select_related("profile")
    )
    assert samples(families, "airlock_runs_finished", "airlock_runs_finished_total") == finished

    cost = samples(families, "airlock_cost_micros", "airlock_cost_micros_total")
    assert cost[("priced",)] == Run.objects.filter(profile__name="priced").aggregate(c=Sum("cost_micros"))["c"] > 0
    tokens = samples(families, "airlock_tokens", "airlock_tokens_total")
    assert tokens[("priced", "input")] == 3 * 120 and tokens[("priced", "output")] == 3 * 30
    assert tokens[("priced", "input")] + tokens[("priced", "output")] == Run.objects.filter(
        profile__name="priced"
    ).aggregate(t=Sum("tokens"))["t"]

    model_calls = Counter(Transition.objects.filter(kind="model").values_list("run__profile__name", flat=True))
    counts = samples(families, "airlock_model_call_seconds", "airlock_model_call_seconds_count")
    assert counts == {(agent,): n for agent, n in model_calls.items()}
    tool_calls = Counter(Transition.objects.filter(kind="tool").values_list("payload__call__tool", flat=True))
    assert samples(families, "airlock_tool_call_seconds", "airlock_tool_call_seconds_count") == {
        (tool,): n for tool, n in tool_calls.items()
    }
    buckets = samples(families, "airlock_tool_call_seconds", "airlock_tool_call_seconds_bucket")
    assert buckets[("+Inf", "echo")] == tool_calls["echo"]  # cumulative up to +Inf
    waits = samples(families, "airlock_approval_wait_seconds", "airlock_approval_wait_seconds_count")
    assert waits == {("ledger_write",): 1}


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
@override_settings(AIRLOCK_METRICS_TOKEN=TOKEN, AIRLOCK_METRICS_FOLD_LAG_SECONDS=0)
def test_a_second_scrape_counts_each_transition_once(mix: dict[str, Run], drive: Callable[..., Run]) -> None:
    first = samples(scrape(), "airlock_runs_finished", "airlock_runs_finished_total")
    assert samples(scrape(), "airlock_runs_finished", "airlock_runs_finished_total") == first
    rita = Approval.objects.get(run=mix["decided"]).decided_by
    approval_decide(approval_id=Approval.objects.get(run=mix["waiting"], status="pending").pk, user=rita,
                    decision="reject")
    drive(mix["waiting"])
    after = samples(scrape(), "airlock_runs_finished", "airlock_runs_finished_total")
    assert after == {**first, ("scripted", "done"): first[("scripted", "done")] + 1}


@pytest.mark.django_db(transaction=True)  # its tools write from the tool thread
@override_settings(AIRLOCK_METRICS_TOKEN=TOKEN, AIRLOCK_METRICS_FOLD_LAG_SECONDS=3600)
def test_transitions_younger_than_the_lag_wait_for_a_later_scrape(mix: dict[str, Run]) -> None:
    families = scrape()
    assert samples(families, "airlock_runs_finished", "airlock_runs_finished_total") == {}
    # The gauges of what is true now do not wait.
    assert samples(families, "airlock_runs")[("scripted", "awaiting_approval")] == 1
    with override_settings(AIRLOCK_METRICS_FOLD_LAG_SECONDS=0):
        assert samples(scrape(), "airlock_runs_finished", "airlock_runs_finished_total")


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("deadline passed (900 s after launch)", "deadline"),
        ("step budget exhausted (20 of max_steps 20)", "max_steps"),
        ("cost budget exhausted (5 of max_cost_micros 5 micro-dollars)", "cost"),
        ("token ceiling reached (9 of max_tokens 9)", "tokens"),
        ("too many consecutive tool errors (3 of max_consecutive_errors 3)", "consecutive_errors"),
        ("repeated identical call: echo with the same arguments already ran 1 time(s)", "repeated_call"),
        ("model error: script exhausted", "script_exhausted"),
        ("model error: openai: gave up after 3 attempt(s): 503", "model_error"),
        ("poison run: 3 worker leases in a row ended without progress", "poison"),
        ("failed by rita after outcome unknown: never sent", "reviewer"),
        ("something new", "other"),
        (None, "other"),
    ],
)
def test_reasons_map_to_a_small_fixed_set_of_kinds(reason: str | None, kind: str) -> None:
    assert metrics.reason_kind(reason) == kind
    assert kind in metrics.REASON_KINDS


def test_without_a_token_configured_the_endpoint_does_not_exist() -> None:
    with override_settings(AIRLOCK_METRICS_TOKEN=""):
        assert Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 404


@override_settings(AIRLOCK_METRICS_TOKEN=TOKEN)
@pytest.mark.parametrize(
    ("header", "status"),
    [(None, 401), ("Basic " + TOKEN, 401), ("Bearer ", 401), ("Bearer wrong-token", 403), ("Bearer " + TOKEN[:-1], 403)],
)
def test_a_missing_or_wrong_token_is_refused(header: str | None, status: int, caplog: Any) -> None:
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    answer = Client().get("/metrics", **extra)
    assert answer.status_code == status
    assert b"airlock_" not in answer.content
    assert f"denied status={status} method=GET path=/metrics" in caplog.text


@override_settings(AIRLOCK_METRICS_TOKEN=TOKEN)
def test_a_logged_in_session_is_not_a_token(defaults: None) -> None:
    client = Client()
    client.force_login(person("admin", superuser=True))
    assert client.get("/metrics").status_code == 401
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probes_need_no_login_and_take_only_get(path: str) -> None:
    client = Client()
    assert client.get(path).status_code == 200
    assert client.head(path).status_code == 200
    refused = client.post(path)
    assert refused.status_code == 405 and refused["Allow"] == "GET, HEAD"
    # Only the exact paths are answered by the probes: a neighbour is no page at all.
    assert client.get(f"{path}/").status_code == 404


@override_settings(SECURE_SSL_REDIRECT=True, ALLOWED_HOSTS=["airlock.example.com"])
def test_probes_answer_a_load_balancer_asking_by_address_over_http() -> None:
    # Behind TLS (AIRLOCK_HTTPS=1) a page redirects to https and a foreign Host is a 400;
    # the probes answer as they are, which is what docker-compose's health check relies on.
    client = Client()
    assert client.get("/readyz", HTTP_HOST="10.0.0.5:8000").json() == {"status": "ready"}
    assert client.get("/healthz", HTTP_HOST="10.0.0.5:8000").status_code == 200
    assert client.get("/login/", HTTP_HOST="10.0.0.5:8000").status_code == 400


@override_settings(AIRLOCK_METRICS_TOKEN=TOKEN)
def test_decisions_are_counted_by_the_channel_they_came_from(launch, drive) -> None:
    rita, rob = person("rita", "reviewer"), person("rob", "reviewer")
    answers = [("slack", rita, "approve"), ("email", rob, "reject"), ("api", rita, "approve"), ("slack", rob, "approve")]
    for via, user, decision in answers:
        approval = Approval.objects.get(run=drive(launch(tainted_write(entry=via + decision + user.username))))
        approval_decide(approval_id=approval.pk, user=user, decision=decision, via=via)
    drive(launch(tainted_write(entry="still waiting")))
    got = samples(scrape(), "airlock_decisions", "airlock_decisions_total")
    # Keyed (decision, via): the labels sorted by name.
    assert got == {("approve", "slack"): 2, ("reject", "email"): 1, ("approve", "api"): 1}
