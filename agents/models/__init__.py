"""The ORM, a module by subject; `from agents.models import X` names every model.

runs.py        profiles, runs, transitions, the transcript, the tool-call journal
approvals.py   approvals, votes, grants
notifications.py  webhooks, outbox events, deliveries, notification preferences
mcp.py         MCP servers and their pinned tools
api.py         API tokens, launch idempotency keys
ops.py         metric tallies, purge records
review_stats.py  the review statistics' tallies, timings and streaks
projects.py    projects and memberships (teams)
external.py    ClientCall, the calls external agents proposed
gateway.py     GatewayStream, a gateway caller's runs; GatewaySession, a handshake-era session; GatewayTask, a held call as a task
testing.py     LedgerEntry, the diagnostic tools' side-effect ledger (a test instrument)
"""

from agents.models.api import ApiToken, ApiTokenQuerySet, IdempotencyKey
from agents.models.approvals import (
    Approval,
    ApprovalClaim,
    ApprovalDict,
    ApprovalQuerySet,
    ApprovalVote,
    Grant,
    GrantDict,
    VoteDict,
)
from agents.models.external import ClientCall
from agents.models.gateway import GatewaySession, GatewayStream, GatewayTask
from agents.models.mcp import McpServer, McpTool
from agents.models.mcp import _validate_server_name as _validate_server_name  # migration 0009 names it here
from agents.models.notifications import (
    EVENT_TYPES,
    DecisionLink,
    Delivery,
    DeliveryAttempt,
    DigestEntry,
    NotificationPreference,
    OutboxEvent,
    SlackAction,
    Webhook,
)
from agents.models.ops import MetricTally, PurgeRecord
from agents.models.projects import Membership, Project
from agents.models.review_stats import ReviewStreak, ReviewTally, ReviewTallyVersion, ReviewTiming
from agents.models.runs import (
    AgentProfile,
    AgentProfileQuerySet,
    Message,
    Run,
    RunDict,
    ToolCall,
    Transition,
    engine_message,
)
from agents.models.testing import LedgerEntry

__all__ = [
    "GatewaySession",
    "GatewayStream",
    "GatewayTask",
    "EVENT_TYPES",
    "AgentProfile",
    "AgentProfileQuerySet",
    "ApiToken",
    "ApiTokenQuerySet",
    "Approval",
    "ApprovalClaim",
    "ApprovalDict",
    "GrantDict",
    "VoteDict",
    "ApprovalQuerySet",
    "ApprovalVote",
    "ClientCall",
    "DecisionLink",
    "Delivery",
    "DeliveryAttempt",
    "DigestEntry",
    "Grant",
    "IdempotencyKey",
    "LedgerEntry",
    "McpServer",
    "Membership",
    "McpTool",
    "Message",
    "MetricTally",
    "NotificationPreference",
    "OutboxEvent",
    "Project",
    "PurgeRecord",
    "ReviewStreak",
    "ReviewTally",
    "ReviewTallyVersion",
    "ReviewTiming",
    "Run",
    "RunDict",
    "SlackAction",
    "ToolCall",
    "Transition",
    "Webhook",
    "engine_message",
]
