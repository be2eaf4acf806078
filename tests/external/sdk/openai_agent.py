"""An OpenAI Agents SDK agent as a team would write it, made to go through Airlock by
two lines at the end (`AirlockGate`, `gate.govern`). Run by
tests/external/test_openai_agents.py in a virtual environment of its own, where
`agents` is the SDK and not Airlock's Django app.

Environment: AIRLOCK_URL, AIRLOCK_TOKEN, AIRLOCK_AGENT (the external profile),
OPENAI_BASE_URL (the fake model server), AIRLOCK_GATE_MODE (`block`: a held call waits
inside the tool; `interrupt`: the SDK's needs_approval interrupts the run and
`gate.settle` resumes it). Prints one JSON line with the run's id as soon
as the run exists, and one with the outcome at the end."""

# ruff: noqa: I001  (`agents` here is the SDK, a third-party package, not the project's app)
from __future__ import annotations

import asyncio
import json
import os

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from airlock_client import Airlock
from airlock_client.openai_agents import AirlockGate

set_tracing_disabled(True)  # no trace export to OpenAI from a test
RAN: list[dict[str, str]] = []


@function_tool
def crm_update(customer: str, note: str) -> str:
    """Update a customer's record in the team's CRM."""
    RAN.append({"customer": customer, "note": note})
    return f"updated {customer}: {note}"


agent = Agent(
    name="crm",
    instructions="You keep the CRM up to date.",
    tools=[crm_update],
    model=OpenAIChatCompletionsModel(
        model="gpt-4o-mini", openai_client=AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="sk-test")
    ),
)


async def main() -> None:
    task = "Follow up with ACME"
    with Airlock(os.environ["AIRLOCK_URL"], os.environ["AIRLOCK_TOKEN"]) as airlock:
        run = airlock.start_run(os.environ["AIRLOCK_AGENT"], task)
        print(json.dumps({"run": run.id}), flush=True)
        gate = AirlockGate(airlock, run, timeout=120, interrupt=os.environ.get("AIRLOCK_GATE_MODE") == "interrupt")
        governed = gate.govern(agent)
        result = await Runner.run(governed, task)
        interrupted = 0
        while result.interruptions:
            interrupted += 1
            result = await Runner.run(governed, await gate.settle(result))
        finished = gate.finish(result)
    print(json.dumps({"final": result.final_output, "ran": RAN, "state": finished.state, "interrupted": interrupted}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
