"""Who may decide what, through every door that decides (issue 46, item 1).

One table (WHO_DECIDES) says, for a person and a call, what any decision must come to:
`decided`, `forbidden` (they see the call but do not review it: 403), `hidden` (they
may not even see it: answered as missing) or `duties` (they launched a run whose
policy separates duties). Every door that records a decision walks the same table:
the dashboard card, the approval page, the grouped queue's batch form, the decision
API and its batch form, a Slack click and an emailed link. A batch refuses, per id,
exactly what a single decision refuses, with the same reason.

The MCP gateway and the external agents' calls API propose calls and deliver their
outcome; they decide nothing (a guard below checks that every caller of
`approval_decide` passes `by_reviewer=True` or decides as nobody, the evals)."""

from __future__ import annotations

import ast
import json
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client
from slack_sdk.signature import SignatureVerifier

from agents import access
from agents.actions.approvals import approval_escalate
from agents.actions.tokens import token_create
from agents.models import Approval, ApprovalVote, LedgerEntry, Membership, SlackAction
from agents.notifications import links, slack
from tests.helpers import Api, CsrfClient, member, person, reviewed_profile, tainted_write

# (who, which call) -> what any door must come to. The calls:
#   support: a support-bot run launched by sid (support's launcher; duties not separated)
#   duties: a support-bot run launched by sky with `separate_duties`
#   payments: a default-project profile reviewed by payments-reviewers only (backup:
#     payments-leads), launched by root; payments_escalated: the same, escalated
WHO_DECIDES: list[tuple[str, str, str]] = [
    ("sue", "support", "decided"),  # support's reviewer
    ("fay", "support", "hidden"),  # finance's reviewer
    ("sol", "support", "forbidden"),  # support's operator who reviews only in finance
    ("sid", "support", "forbidden"),  # its launcher, who reviews only in finance
    ("sky", "duties", "duties"),  # launcher and reviewer in support: not their own run
    ("sky", "support", "decided"),  # ...but sid's run, yes
    ("ria", "payments", "forbidden"),  # operator and reviewer everywhere, not in the profile's group
    ("pam", "payments", "decided"),  # in payments-reviewers
    ("bea", "payments", "hidden"),  # backup group, before the escalation
    ("bea", "payments_escalated", "decided"),  # ...and after it
    ("fay", "payments", "hidden"),
    ("root", "payments", "decided"),
]


@pytest.fixture
def cast(teams: dict[str, Any]) -> dict[str, Any]:
    """The people of WHO_DECIDES (support's and finance's from `teams`, plus four), and
    a function making the named call wait for a human."""
    support, finance = teams["support"], teams["finance"]
    for name in ("sol", "sid"):  # ...who also review, in finance only
        Membership.objects.create(project=finance.project, user=support[name_role(name)], role="reviewer")
    people: dict[str, User] = {
        "sue": support["reviewer"], "sol": support["operator"], "sid": support["launcher"], "fay": finance["reviewer"],
        "sky": member("sky", support.project, "launcher", "reviewer"),
        "ria": person("ria", "operator", "reviewer"),
        "root": person("root", superuser=True),
    }
    reviewed_profile("payments", reviewer_group="payments-reviewers", backup_group="payments-leads")
    people["pam"] = person("pam", "payments-reviewers")
    people["bea"] = person("bea", "payments-leads")
    return {"people": people, "support": support}


def name_role(name: str) -> str:
    return {"sol": "operator", "sid": "launcher"}[name]


@pytest.fixture
def target(cast: dict[str, Any], launch: Callable[..., Any], drive: Callable[..., Any]) -> Callable[[str], Approval]:
    people = cast["people"]

    def _target(which: str) -> Approval:
        if which in ("support", "duties"):
            who = people["sid"] if which == "support" else people["sky"]
            policy = {"separate_duties": True} if which == "duties" else None
            run = launch(tainted_write(), agent="support-bot", user=who, policy=policy)
        else:
            run = launch(tainted_write(), agent="payments", user=people["root"])
        run = drive(run)
        assert run.state == "awaiting_approval", (run.state, run.error)
        approval = Approval.objects.select_related("run__profile").get(run=run, status="pending")
        if which == "payments_escalated":
            assert approval_escalate(approval_id=approval.pk)
            approval.refresh_from_db()
        return approval

    return _target


# -- the doors: each tries to approve, and says what it answered ----------------------


def _kind(text: str) -> str:
    """A refusal's kind from its words (the detail every door passes on)."""
    if "separat" in text:
        return "duties"
    if "not found" in text or "no approval" in text:
        return "hidden"
    return "forbidden"


def by_api(user: User, a: Approval) -> str:
    r = Api(token_create(user=user)[1]).post(
        f"/api/approvals/{a.pk}/decision", {"decision": "approve", "args_hash": a.args_hash}
    )
    if r.status_code == 200:
        return "decided"
    assert r.status_code in (403, 404), r.data
    return {"separation_of_duties": "duties", "forbidden": "forbidden", "not_found": "hidden"}[r.data["error"]]


def by_api_batch(user: User, a: Approval) -> str:
    r = Api(token_create(user=user)[1]).post(
        "/api/approvals/decisions", {"ids": [a.pk], "decision": "approve", "args_hashes": {str(a.pk): a.args_hash}}
    )
    assert r.status_code == 200, r.data
    [result] = r.data["results"]
    return "decided" if result["outcome"] == "decided" else _kind(result["detail"])


def by_card(user: User, a: Approval) -> str:
    client = CsrfClient()
    client.force_login(user)
    r = client.decide(a.pk, "approve", htmx=True, args_hash=a.args_hash)
    if r.status_code == 404:
        return "hidden"
    if r.status_code == 403:
        return _kind(r.content.decode())
    assert r.status_code == 200, r.content[:300]
    return "decided" if Approval.objects.get(pk=a.pk).status == "approved" else "refused"


def by_approval_page(user: User, a: Approval) -> str:
    client = CsrfClient()
    client.force_login(user)
    page = client.get(f"/reviews/{a.pk}/")
    if page.status_code == 404:
        hidden = True
    else:
        assert page.status_code == 200
        hidden = False
    r = client.decide(a.pk, "approve", back="approval", args_hash=a.args_hash)
    if r.status_code == 404:
        assert hidden, "the page showed a call its POST calls missing"
        return "hidden"
    if r.status_code == 403:
        return _kind(r.content.decode())
    assert r.status_code == 303, r.status_code
    return "decided" if Approval.objects.get(pk=a.pk).status == "approved" else "refused"


def by_group_form(user: User, a: Approval) -> str:
    client = CsrfClient()
    client.force_login(user)
    r = client.post(
        "/reviews/decisions/",
        {"decision": "approve", "ids": [a.pk], "seen": [f"{a.pk}:{a.args_hash}"]},
        headers={"X-CSRFToken": client.token()},
    )
    assert r.status_code == 303, r.status_code
    [message] = [str(m) for m in get_messages(r.wsgi_request)]
    if f"#{a.pk} decided" in message:
        return "decided"
    assert f"#{a.pk} refused: " in message, message
    return _kind(message.split(f"#{a.pk} refused: ", 1)[1])


def by_email_link(user: User, a: Approval) -> str:
    token = links.link_create(user=user, approval=a)
    client = Client(enforce_csrf_checks=True)
    path = f"/reviews/links/{token}/"
    client.get(path)
    r = client.post(path, {"decision": "approve", "csrfmiddlewaretoken": client.cookies["csrftoken"].value})
    if r.status_code == 303:
        return "decided"
    assert r.status_code == 403, r.status_code
    # A link names its reviewer: whether they may see the call is no secret to them.
    return _kind(r.content.decode())


DOORS: dict[str, Callable[[User, Approval], str]] = {
    "api": by_api, "api_batch": by_api_batch, "card": by_card, "approval_page": by_approval_page,
    "group_form": by_group_form, "email_link": by_email_link,
}
# Doors that answer a person as the call's recipient (a message sent to them) say
# "you may not decide this" for a call they may not see: no id is guessed there.
TELLS_HIDDEN = {"api", "api_batch", "card", "approval_page", "group_form"}


def expected_at(door: str, expect: str) -> str:
    return "forbidden" if expect == "hidden" and door not in TELLS_HIDDEN else expect


def assert_outcome(a: Approval, user: User, expect: str) -> None:
    a.refresh_from_db()
    if expect == "decided":
        assert (a.status, a.decided_by_id) == ("approved", user.pk)
    else:
        assert a.status == "pending"
        assert not ApprovalVote.objects.filter(approval=a).exists()
        assert not LedgerEntry.objects.filter(run=a.run).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("door", list(DOORS))
@pytest.mark.parametrize(("who", "which", "expect"), WHO_DECIDES)
def test_every_door_decides_exactly_what_the_table_says(cast, target, door, who, which, expect) -> None:
    user = cast["people"][who]
    approval = target(which)
    assert DOORS[door](user, approval) == expected_at(door, expect)
    assert_outcome(approval, user, expect)


@pytest.mark.django_db
@pytest.mark.parametrize(("who", "which", "expect"), WHO_DECIDES)
def test_the_table_is_access_may_decide(cast, target, who, which, expect) -> None:
    """The one helper every door asks agrees with the table (duties aside, which are
    `duties_separated`'s)."""
    user = cast["people"][who]
    approval = target(which)
    assert access.may_decide(user, approval) == (expect in ("decided", "duties"))
    assert access.duties_separated(user, approval.run) == (expect == "duties")


@pytest.mark.django_db
@pytest.mark.parametrize(("who", "which", "expect"), [row for row in WHO_DECIDES if row[2] != "decided"])
def test_a_batch_refuses_with_the_single_decisions_reason(cast, target, who, which, expect) -> None:
    user = cast["people"][who]
    approval = target(which)
    api = Api(token_create(user=user)[1])
    single = api.post(f"/api/approvals/{approval.pk}/decision", {"decision": "approve"})
    batch = api.post("/api/approvals/decisions", {"ids": [approval.pk], "decision": "approve"})
    [result] = batch.data["results"]
    assert result["outcome"] == "refused"
    if single.status_code == 404:
        assert result["detail"] == "not found"
    else:
        assert result["detail"] == f"{single.data['error']}: {single.data['detail']}"
    assert_outcome(approval, user, expect)


# -- Slack: a click decides in a thread of its own, so the rows must be committed -------

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


def by_slack(user: User, a: Approval) -> str:
    member_id = f"U{user.pk:08d}"  # linked before the message was sent (see the test)
    value = {"approval": a.pk, "args_hash": a.args_hash}
    data = {
        "type": "block_actions", "user": {"id": member_id}, "response_url": "",
        "actions": [{"action_id": "approve", "value": json.dumps(value), "action_ts": f"{time.time():.6f}"}],
    }
    body = urllib.parse.urlencode({"payload": json.dumps(data)})
    stamp = str(int(time.time()))
    headers = {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": SignatureVerifier(SECRET).generate_signature(timestamp=stamp, body=body),
    }
    r = Client().post("/integrations/slack/interactions", body, content_type="application/x-www-form-urlencoded",
                      headers=headers)
    assert r.status_code == 200
    slack.wait_idle()
    outcome = SlackAction.objects.get(approval_id=a.pk).outcome
    if outcome == "decided":
        return "decided"
    assert outcome.startswith("refused"), outcome
    return _kind(outcome.replace("may not decide", "forbidden"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("who", "which", "expect"), WHO_DECIDES)
def test_a_slack_click_decides_exactly_what_the_table_says(settings, cast, target, who, which, expect) -> None:
    settings.AIRLOCK_SLACK_SIGNING_SECRET = SECRET
    settings.AIRLOCK_SLACK_ANSWER_SECONDS = 30.0
    user = cast["people"][who]
    slack.link(user.get_username(), f"U{user.pk:08d}")  # an admin's link_slack, before the message
    approval = target(which)
    assert by_slack(user, approval) == expected_at("slack", expect)
    assert_outcome(approval, user, expect)


# -- the guard: no door decides without asking who reviews ------------------------------


def test_every_caller_of_approval_decide_asks_who_reviews() -> None:
    """Every call of `approval_decide` in the code passes `by_reviewer=True` (so
    `access.may_decide` is asked), or decides as nobody (`user=None`: the evals replay
    recorded votes). A new door that forgets fails here, then belongs in DOORS."""
    root = Path(__file__).resolve().parents[2]
    unchecked = []
    for path in [*root.glob("agents/**/*.py"), *root.glob("reviews/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "approval_decide"):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            asks = isinstance(kw.get("by_reviewer"), ast.Constant) and kw["by_reviewer"].value is True
            nobody = isinstance(kw.get("user"), ast.Constant) and kw["user"].value is None
            if not (asks or nobody):
                unchecked.append(f"{path.relative_to(root)}:{node.lineno}")
    assert unchecked == []

