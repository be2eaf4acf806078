"""A client of Airlock's decision API: an agent that runs anywhere proposes each tool
call, Airlock's policy and reviewers decide, and the run's journal records what ran.

Only httpx is needed; `airlock_client.openai_agents` adapts the OpenAI Agents SDK."""

from __future__ import annotations

from .client import FINAL, Airlock, Decision, RunInfo, raise_if_not_run
from .errors import AirlockError, CallNotRun, Denied, Expired, Refused, Rejected, StillPending, Unavailable

__all__ = [
    "FINAL", "Airlock", "AirlockError", "CallNotRun", "Decision", "Denied", "Expired", "Refused", "Rejected",
    "RunInfo", "StillPending", "Unavailable", "raise_if_not_run",
]
