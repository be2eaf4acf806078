"""The OpenAI Agents SDK (`pip install openai-agents`, import `agents`) governed by Airlock.

Each tool call of an unchanged agent is proposed to Airlock, waits for its decision
(policy, then a reviewer if policy asks), runs with the arguments Airlock approved, and
has its result reported to the run's journal:

    gate = AirlockGate(Airlock(url, token), airlock.start_run("crm-agent", task).id)
    result = await Runner.run(gate.govern(agent), task)
    gate.finish(result)

Two ways to wait for a reviewer:
- blocking (the default): the tool call itself waits (long polls) for the decision; a
  rejection, denial or expiry becomes the tool's output, text the model reads.
- interrupting (`AirlockGate(..., interrupt=True)`): each tool's `needs_approval` asks
  Airlock, and a call a human must see interrupts the run the SDK's way
  (`result.interruptions`); `await gate.settle(result)` waits for Airlock's decisions
  and approves or rejects them on the run state, which you run again.

Airlock takes one call of a run at a time: the gate serialises the agent's tool calls
(parallel calls run one after another)."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable
from typing import Any

from agents import Agent, FunctionTool, RunContextWrapper, RunState, ToolApprovalItem

from .client import Airlock, Decision, RunRef
from .errors import CallNotRun, Refused

# Refusals a model can act on (it called a tool wrongly): told to the model as the tool's
# output, as the SDK does with a tool's own errors. Any other refusal ends the agent run.
MODEL_ERRORS = frozenset({"invalid_arguments", "unknown_tool"})


class AirlockGate:
    """Puts one Airlock run in front of an agent's function tools."""

    def __init__(self, airlock: Airlock, run: RunRef, *, timeout: float | None = None, interrupt: bool = False) -> None:
        self.airlock = airlock
        self.run = run
        self.timeout = timeout
        self.interrupt = interrupt
        self._lock: asyncio.Lock | None = None
        self._usage_seen = (0, 0)

    # -- wrapping ---------------------------------------------------------------------

    def govern(self, agent: Agent[Any]) -> Agent[Any]:
        """A copy of `agent` whose function tools all go through Airlock. Tools that run
        outside this process (hosted tools) cannot be proposed first: refused."""
        tools = []
        for tool in agent.tools:
            if not isinstance(tool, FunctionTool):
                raise TypeError(f"Airlock can only govern function tools, not {type(tool).__name__} {tool.name!r}")
            tools.append(self.wrap(tool))
        return agent.clone(tools=tools)

    def wrap(self, tool: FunctionTool) -> FunctionTool:
        """A copy of `tool` that proposes each call to Airlock before running it."""
        original = tool.on_invoke_tool
        gate = self

        async def invoke(ctx: Any, raw_args: str) -> Any:
            try:
                args = json.loads(raw_args) if raw_args else {}
            except ValueError:
                return f"Error: the arguments of {tool.name} are not valid JSON."
            async with gate._serial():
                try:
                    decision = await asyncio.to_thread(
                        gate.airlock.decide, gate.run, tool.name, args, usage=gate._usage(ctx), timeout=gate.timeout
                    )
                except CallNotRun as exc:
                    return str(exc)
                except Refused as exc:
                    if exc.code in MODEL_ERRORS:
                        return f"Error: Airlock refused the call ({exc.code}): {exc.detail}"
                    raise
                if not decision.may_run:
                    return _result_text(decision)
                try:
                    output = await original(ctx, json.dumps(decision.args or {}))
                except Exception as exc:
                    await asyncio.to_thread(
                        gate.airlock.report, gate.run, decision.key, False, f"{type(exc).__name__}: {exc}"
                    )
                    raise
                await asyncio.to_thread(gate.airlock.report, gate.run, decision.key, True, _jsonable(output))
                if decision.edited and isinstance(output, str):
                    # The model should know what really ran, not what it asked for.
                    return f"{output}\n[Airlock: a reviewer changed the arguments; it ran with {json.dumps(decision.args)}]"
                return output

        wrapped = copy.copy(tool)
        wrapped.on_invoke_tool = invoke
        if self.interrupt:
            wrapped.needs_approval = self.needs_approval(tool.name)
        return wrapped

    def needs_approval(self, tool_name: str) -> Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]:
        """A `needs_approval` callable for the tool `tool_name`: proposes the call to
        Airlock and answers True when a human must decide it (the SDK then interrupts the
        run; `settle` waits for the decision). The proposal is the call the tool wrapper
        proposes again when it runs: an identical call is one call in Airlock."""

        async def check(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
            async with self._serial():
                try:
                    decision = await asyncio.to_thread(
                        self.airlock.propose, self.run, tool_name, params, self._usage(ctx)
                    )
                except Refused as exc:
                    if exc.code == "call_pending":
                        return True  # another call waits first; settle() answers this one after it
                    if exc.code in MODEL_ERRORS:
                        return False  # the wrapper tells the model
                    raise
            return decision.status in ("pending", "running")

        return check

    async def settle(self, result: Any) -> RunState[Any]:
        """Wait for Airlock's decision on each of `result.interruptions` and record it on
        the run state (approve, or reject with the reason as the model's tool output);
        run the returned state again with `Runner.run(agent, state)`."""
        state: RunState[Any] = result.to_state()
        for item in result.interruptions:
            await self._settle_one(state, item)
        return state

    async def _settle_one(self, state: RunState[Any], item: ToolApprovalItem) -> None:
        args = json.loads(item.arguments or "{}")
        try:
            await asyncio.to_thread(self.airlock.decide, self.run, str(item.tool_name), args, timeout=self.timeout)
        except CallNotRun as exc:
            state.reject(item, rejection_message=str(exc))
            return
        except Refused as exc:
            if exc.code == "call_pending":
                # An earlier call of this round, approved, has not run yet: Airlock takes
                # this one once it has. Left undecided, the SDK interrupts on it again.
                return
            raise
        state.approve(item)

    # -- the end of the run -------------------------------------------------------------

    def finish(self, result: Any, answer: str | None = None) -> Any:
        """End the Airlock run in `done` with the agent's final output (and the tokens it
        spent since the last proposed call)."""
        text = answer if answer is not None else str(result.final_output)
        return self.airlock.finish(self.run, text, usage=self._usage(getattr(result, "context_wrapper", None)))

    # -- helpers --------------------------------------------------------------------------

    def _serial(self) -> asyncio.Lock:
        # Airlock answers 409 call_pending to a second call while one waits: queue them here.
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _usage(self, ctx: Any) -> dict[str, int] | None:
        """The tokens the SDK counted since the last report: the usage of the model calls
        that led to this call (None when the SDK has no usage to give)."""
        usage = getattr(ctx, "usage", None)
        if usage is None:
            return None
        now = (int(getattr(usage, "input_tokens", 0) or 0), int(getattr(usage, "output_tokens", 0) or 0))
        seen = self._usage_seen
        self._usage_seen = (max(now[0], seen[0]), max(now[1], seen[1]))
        return {"input_tokens": max(0, now[0] - seen[0]), "output_tokens": max(0, now[1] - seen[1])}


def _result_text(decision: Decision) -> str:
    """What the model reads for a tool Airlock ran itself."""
    result = decision.result if isinstance(decision.result, dict) else {}
    if result.get("ok"):
        value = result.get("result")
        return value if isinstance(value, str) else json.dumps(value)
    return f"Error: {result.get('error', 'the tool failed')}: {result.get('detail', '')}".rstrip(": ")


def _jsonable(output: Any) -> Any:
    """The tool's output as JSON carries it (the SDK's output objects as their dicts)."""
    if hasattr(output, "model_dump"):
        return output.model_dump(mode="json")
    try:
        json.dumps(output)
    except (TypeError, ValueError):
        return str(output)
    return output
