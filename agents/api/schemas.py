"""The request and response shapes the API validates and documents (its OpenAPI schema).

A run, an approval, a vote and a grant are written once, as the TypedDicts their
models' to_dict() returns (agents/models/runs.py, approvals.py); their schemas here are
derived from those (`from_dict_shape`), with the nested shapes the TypedDicts leave as
plain dicts named.
"""

from __future__ import annotations

import datetime as dt
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from ninja import Schema
from ninja.schema import DjangoGetter
from pydantic import (
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    StrictInt,
    StrictStr,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from agents.access import MAX_ID
from agents.actions.approvals import BATCH_MAX
from agents.engine import decisions
from agents.engine.limits import TASK_MAX_CHARS
from agents.models import ApprovalDict, GrantDict, RunDict, VoteDict


class DictShape(Schema):
    """A response schema of a model's to_dict(): a dict is validated as it is. ninja's
    Schema wraps whatever it validates in its ORM getter (attribute access, managers
    read as lists), which a dict of plain values does not need: for a run's answer,
    its nested approval, grants and hold, that wrapping was most of the validation
    (docs/performance.md, "The hot path"). Anything else goes through the getter."""

    @model_validator(mode="wrap")
    @classmethod
    def _run_root_validator(cls, values: Any, handler: ModelWrapValidatorHandler[Any], info: ValidationInfo) -> Any:
        if type(values) is dict:
            return handler(values)
        return handler(DjangoGetter(values, cls, info.context))


def from_dict_shape(name: str, shape: type, **nested: Any) -> type[Schema]:
    """The response schema of a TypedDict that a model's to_dict() returns: its fields in
    its order, each with its own type, or the schema named in `nested` for a value the
    TypedDict types as a plain dict; the description and default of the field's
    `Annotated[..., Field(...)]`; a field that may be null defaults to null (the OpenAPI
    document then lists it as optional). Built on `DictShape`."""
    fields: dict[str, Any] = {}
    for key, hint in get_type_hints(shape, include_extras=True).items():
        meta = getattr(hint, "__metadata__", ())
        given = next((m for m in meta if isinstance(m, FieldInfo)), None)
        annotation = nested.get(key, get_args(hint)[0] if meta else hint)
        if given is not None and not given.is_required():
            info = given
        elif _nullable(annotation):
            info = Field(None, description=given.description if given else None)
        else:
            info = Field(..., description=given.description if given else None)
        fields[key] = (annotation, info)
    return create_model(name, __base__=DictShape, __module__=__name__, **fields)


def _nullable(annotation: Any) -> bool:
    return annotation is Any or (
        get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)
    )


class Error(Schema):
    error: str
    detail: Any = None


class Limits(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    max_steps: StrictInt | None = Field(None, ge=1)
    max_cost_micros: StrictInt | None = Field(None, ge=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    deadline_seconds: StrictInt | None = Field(None, ge=1)
    max_consecutive_errors: StrictInt | None = Field(None, ge=1)
    max_identical_calls: StrictInt | None = Field(None, ge=1)


class RunIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    agent: StrictStr = Field(
        ..., min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$", description="an agent profile's name"
    )
    # The limit run_launch applies to the launch form too; here it is also in the schema.
    task: StrictStr = Field(..., max_length=TASK_MAX_CHARS)
    limits: Limits | None = Field(None, description="each may only tighten the profile's")
    approver: Literal["human", "none"] = "human"
    script: list[dict[str, Any]] | None = Field(None, description="decisions for the scripted agent")
    # Any: the engine's validator checks it and names the bad field in a 400 invalid_policy.
    policy: Any = Field(
        None,
        description='tightens the profile\'s policy for this run: {"rules": [ask/deny rules], '
        '"irreversible_approvals": N, "separate_duties": true, "approval_timeout_seconds": N} (docs/policy.md)',
    )


class DecisionIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    decision: decisions.DecisionName = Field(
        ..., description="approve or reject; an 'outcome unknown' approval takes happened, retry or fail; "
        "a fork's 'already ran' approval takes reuse, approve or reject"
    )
    note: StrictStr = Field("", max_length=10_000)
    args: dict[str, Any] | None = Field(
        None, description="with approve: run the call with these arguments instead (checked like the model's)"
    )
    remember: Literal["call", "tool"] | None = Field(
        None, description="with approve: allow the same call (call) or any call of the tool (tool) for the rest of the run"
    )
    # An empty hash is refused, not read as "none": it is a client that lost the value it
    # meant to send, and reading it as absent would drop the binding it asked for.
    args_hash: StrictStr | None = Field(
        None, min_length=1, max_length=64,
        description="the approval's args_hash as you saw it: a call that changed since answers 409 call_changed; "
        "without it, a call someone edited answers 409 call_changed; an empty string is a 400",
    )


class BatchDecisionIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    ids: list[StrictInt] = Field(
        ..., min_length=1, max_length=BATCH_MAX,
        description=f"the approvals to decide, as the caller was shown them: 1 to {BATCH_MAX} distinct ids",
    )
    decision: Literal["approve", "reject"]
    note: StrictStr = Field("", max_length=10_000, description="one note, kept on every vote")
    args_hashes: dict[StrictStr, StrictStr] | None = Field(
        None, description='{"<id>": "<args_hash>"}: bind each answer to the call you saw (a changed call is refused)'
    )

    @field_validator("ids")
    @classmethod
    def _distinct_positive(cls, ids: list[int]) -> list[int]:
        bad = next((i for i in ids if not 0 < i <= MAX_ID), None)
        if bad is not None:
            raise ValueError(f"{bad} is not an approval id (ids are positive integers)")
        seen: set[int] = set()
        for i in ids:
            if i in seen:
                raise ValueError(f"the ids must be distinct: {i} appears more than once")
            seen.add(i)
        return ids

    @model_validator(mode="after")
    def _hashes_name_listed_ids(self) -> BatchDecisionIn:
        listed = {str(i) for i in self.ids}
        for key, digest in (self.args_hashes or {}).items():
            if key not in listed:
                raise ValueError(f"args_hashes names {key[:20]!r}, which is not one of the ids")
            if len(digest) > 64:
                raise ValueError(f"the args_hash of {key} is longer than a sha256")
            if not digest:
                raise ValueError(f"the args_hash of {key} is empty: send the approval's args_hash, or leave {key} out")
        return self

    def hashes(self) -> dict[int, str]:
        return {int(k): v for k, v in (self.args_hashes or {}).items()}


class BatchResultOut(Schema):
    id: int
    outcome: Literal["decided", "already_decided", "refused", "needs_more_votes"]
    detail: str


class BatchDecisionOut(Schema):
    results: list[BatchResultOut] = Field(..., description="one per id, in the order given")


class ShadowOut(Schema):
    rule: int = Field(..., description="the shadow rule's 1-based index among the profile's rules")
    verdict: Literal["allow", "ask", "deny"]


class HistoryOut(Schema):
    scope: Literal["run", "caller", "profile", "project"]
    within: str | None = Field(None, description='the rule\'s window ("24h"), or null for the whole run')
    tools: list[str] = Field(default_factory=list, description="the tools counted (empty: every tool)")
    same: dict[str, Any] = Field(default_factory=dict, description="the argument values an earlier call had to share")
    count: int | None = Field(None, description="calls_over: the earlier counted calls found (counted up to calls_over + 1)")
    calls_over: int | None = None
    total: float | None = Field(None, description="sum_over: the sum over the earlier calls, this call's value included")
    sum_over: float | None = None
    ran: str | None = Field(None, description="after: the tool of an earlier call that ran, or null")
    text: str = Field(..., description='the figures in words: "the 3rd refund call with order_id 1042 in 24 h (over 2)"')


class PriorOut(Schema):
    run: int | None = None
    seq: int | None = None
    status: str | None = None


VoteOut = from_dict_shape("VoteOut", VoteDict)
ApprovalOut = from_dict_shape(
    "ApprovalOut", ApprovalDict, shadow=list[ShadowOut], history=HistoryOut | None, votes=list[VoteOut],
    prior=PriorOut | None,
)
GrantOut = from_dict_shape("GrantOut", GrantDict)


class HoldOut(Schema):
    scope: str  # "run", or "profile" (every run of the profile is held)
    reason: str
    by: str | None = None
    at: dt.datetime | None = None


class HoldIn(Schema):
    reason: str = ""


class ForkedFromOut(Schema):
    run: int | None = Field(None, description="the parent run (null once the parent was deleted)")
    seq: int


RunOut = from_dict_shape(
    "RunOut", RunDict, pending_approval=ApprovalOut | None, grants=list[GrantOut], hold=HoldOut | None,
    forked_from=ForkedFromOut | None,
)


class ForkPointOut(Schema):
    requested: int
    used: int
    why: str


class ForkOut(RunOut):
    fork_point: ForkPointOut | None = Field(
        None, description="set when the requested seq was not a resting point: the one used instead, and why"
    )


class ForkIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    from_seq: StrictInt = Field(..., description="the parent's transition to start after (a resting point)")
    task: StrictStr | None = Field(None, max_length=TASK_MAX_CHARS, description="a replacement task")
    limits: Limits | None = Field(None, description="the fork's limits; each at most the profile's")
    reuse: StrictStr = Field("recorded", description="recorded (reuse a safe call's recorded result) or none")
    note: StrictStr = Field("", max_length=2000)


class RetryIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    limits: Limits | None = Field(None, description="the retry's limits; each at most the profile's")


class RetryManyIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    ids: list[StrictInt] = Field(..., min_length=1, max_length=200)


class RetryResultOut(Schema):
    id: int
    outcome: Literal["retried", "refused", "not_found"]
    run: int | None = None
    detail: str


class RetryManyOut(Schema):
    results: list[RetryResultOut]


class TransitionOut(Schema):
    seq: int
    from_state: str
    to_state: str
    kind: str
    payload: dict[str, Any]
    cost_micros: int
    tokens: int
    duration_ms: int
    actor: str
    created_at: dt.datetime


class RunPage(Schema):
    items: list[RunOut]
    next: str | None = Field(None, description="the cursor of the next page (`?after=`), or null on the last")


class ApprovalPage(Schema):
    items: list[ApprovalOut]
    next: str | None = Field(None, description="the cursor of the next page (`?after=`), or null on the last")


class CallIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    tool: StrictStr = Field(..., min_length=1, max_length=100, description="a tool the run's profile offers")
    # Any: the tool's schema checks it, and a bad call is recorded (400 invalid_arguments).
    args: Any = Field(default_factory=dict, description="the call's arguments, checked against the tool's schema")
    usage: dict[str, Any] | None = Field(
        None, description="tokens the agent's model spent deciding this call: input_tokens, output_tokens"
    )


class CallOut(Schema):
    key: str
    tool: str
    args: Any = None
    verdict: Literal["allow", "ask", "deny"]
    reason: str
    rule: dict[str, Any] | None = None
    approval: ApprovalOut | None = None
    status: Literal["pending", "approved", "running", "succeeded", "failed", "rejected", "expired", "denied"]
    result: Any = None
    edited: bool = Field(..., description="a reviewer changed the arguments: run the call with `args`")
    note: str = Field(..., description="the reviewer's note, if any")
    client_tool: bool = Field(..., description="the client runs this tool and reports its result")
    run_state: str


class ReportIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    ok: bool = Field(..., description="whether the client's tool succeeded")
    output: Any = Field(None, description="the tool's output (or, with ok false, what went wrong)")


class FinishIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)

    answer: StrictStr = Field(..., max_length=1_000_000)
    usage: dict[str, Any] | None = None
