"""Issue 34, item 2: a regular expression cannot freeze a worker.

A launcher's rule `{"op": "matches", "value": "^(a+)+$"}` against forty `a`s and a `!`
would backtrack about 2^40 steps under Python's `re`, holding the GIL; a tool schema's
`pattern` did the same through jsonschema. Both now run on RE2 (agents/engine/regex.py):
these tests get their verdicts at all only because the engine is linear. A pattern RE2
cannot compile is refused where it is written.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from agents.actions.tokens import token_create
from agents.engine import policy, regex, schemas
from agents.engine.registry import ToolSpec
from agents.models import AgentProfile, Message, Run
from tests.helpers import call, final, launch_body

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True)]

CATASTROPHIC = "^(a+)+$"
NEAR_MISS = "a" * 40 + "!"  # no match, after 2^40 backtracking steps under Python's re


def no_as(then: str = "deny") -> dict[str, Any]:
    return {"tool": "echo", "when": {"arg": "text", "op": "matches", "value": CATASTROPHIC}, "then": then,
            "reason": "only a's"}


def test_a_catastrophic_rule_pattern_gets_its_verdict(defaults, drive) -> None:
    from agents.actions.runs import run_launch

    run = run_launch(
        agent="scripted", task="t", policy={"rules": [no_as()]},
        script=[call("echo", text=NEAR_MISS), call("echo", text="a" * 40), final("ok")],
    )
    run = drive(run)
    assert run.state == "done"
    results = list(Message.objects.filter(run=run, role="tool").order_by("index").values_list("content", flat=True))
    assert results[0] == NEAR_MISS  # no match: the call ran
    assert "not_permitted" in results[1] and "only a's" in results[1]  # a match: denied


def test_rule_text_past_the_cap_fails_closed() -> None:
    long = "a" * (regex.MAX_TEXT + 1)
    args = {"text": long}
    assert policy.first_match([no_as("allow")], "echo", args) is None  # an allow rule does not match
    assert policy.first_match([no_as("deny")], "echo", args) is not None  # a deny rule does
    assert policy.first_match([no_as("deny")], "echo", {"text": "a" * regex.MAX_TEXT}) is not None


@pytest.mark.parametrize("pattern", [r"(?=admin)", r"(a)\1", r"(?<!x)y"])
def test_a_pattern_re2_cannot_compile_is_refused_at_save_naming_the_rule(defaults, pattern: str) -> None:
    profile = AgentProfile.objects.get(name="scripted")
    profile.rules = [{**no_as(), "when": {"arg": "text", "op": "matches", "value": pattern}}]
    with pytest.raises(ValidationError) as caught:
        profile.full_clean()
    assert "rules[1].when.value" in str(caught.value) and "RE2" in str(caught.value)


def test_a_launch_with_a_pattern_re2_cannot_compile_is_a_400_naming_the_rule(people) -> None:
    token = token_create(user=people["launcher"])[1]
    api = Client(headers={"Authorization": f"Bearer {token}"})
    bad = {**no_as(), "when": {"arg": "text", "op": "matches", "value": "(?=x)"}}
    response = api.post("/api/runs", launch_body(policy={"rules": [no_as(), bad]}), content_type="application/json")
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid_policy" and body["detail"].startswith("policy.rules[2].when.value: ")
    assert "RE2" in body["detail"]
    assert not Run.objects.exists()


def test_a_profile_pattern_saved_around_validation_launches_nothing(people) -> None:
    AgentProfile.objects.filter(name="scripted").update(
        rules=[{**no_as(), "when": {"arg": "text", "op": "matches", "value": "(?=x)"}}]
    )
    token = token_create(user=people["launcher"])[1]
    response = Client(headers={"Authorization": f"Bearer {token}"}).post(
        "/api/runs", launch_body(), content_type="application/json"
    )
    # A broken profile row costs only itself, named by its field (#47): 409 invalid_profile.
    assert response.status_code == 409 and response.json()["error"] == "invalid_profile"
    assert "its rules: rules[1].when.value: " in response.json()["detail"]


def spec(schema: dict[str, Any]) -> ToolSpec:
    return ToolSpec("t", "a tool", schema, "read", "internal", "safe", lambda args, ctx: None)


def test_a_catastrophic_schema_pattern_gets_its_answer() -> None:
    tool = spec({"type": "object", "properties": {"s": {"type": "string", "pattern": CATASTROPHIC}}})
    assert tool.validate({"s": NEAR_MISS}) == f"s: {NEAR_MISS!r} does not match {CATASTROPHIC!r}"
    assert tool.validate({"s": "aaaa"}) is None


def test_a_catastrophic_pattern_properties_key_gets_its_answer() -> None:
    tool = spec({"type": "object", "patternProperties": {CATASTROPHIC: {"type": "integer"}},
                 "additionalProperties": False})
    assert tool.validate({"a" * 40: 1}) is None
    assert "does not match any of the regexes" in (tool.validate({NEAR_MISS: 1}) or "")


def test_a_schema_pattern_re2_cannot_compile_is_refused() -> None:
    with pytest.raises(schemas.SchemaRefused, match="RE2"):
        spec({"type": "object", "properties": {"s": {"type": "string", "pattern": "(?=x)"}}})
    with pytest.raises(schemas.SchemaRefused, match="RE2"):
        spec({"type": "object", "patternProperties": {r"(a)\1": {}}})


def test_unevaluated_properties_beside_pattern_properties_is_refused() -> None:
    # jsonschema would run those patterns itself, on Python's re.
    with pytest.raises(schemas.SchemaRefused, match="unevaluatedProperties"):
        spec({"type": "object", "patternProperties": {"^a": {}}, "unevaluatedProperties": False})

