"""The Anthropic client: the Messages API with tool use, over httpx.

Configuration comes from the profile and the environment when a run is driven: the
profile's `base_url`, else `ANTHROPIC_BASE_URL` (default https://api.anthropic.com); the
key from the environment variable the profile names in `api_key_env`, else
`ANTHROPIC_API_KEY`. The key goes into the
`x-api-key` header and nowhere else; every error text is scrubbed of it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings

from agents.engine.protocols import ModelError, ModelReply, ModelRequest, ProposedCall, Usage
from agents.engine.registry import ToolSpec

from .http import Failure, HttpOptions, error_message, exchange
from .keys import profile_key

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
PROVIDER = "anthropic"
EPHEMERAL = {"type": "ephemeral"}
# A `pause_turn` reply (a long server-side turn the API stopped) is sent back to be
# continued, at most this many times per reply.
PAUSED_TURNS_MAX = 3


@dataclass(frozen=True)
class Paused:
    """A reply with stop_reason `pause_turn`: not an answer, a turn to continue."""

    content: list[dict[str, Any]]
    usage: Usage | None


def wire_messages(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Engine transcript -> (system text, Messages API turns).

    System messages become the top-level `system`; tool results become `tool_result`
    blocks in a user turn; consecutive turns of one role are merged, because the API
    wants every result of an assistant's tool uses in the single user turn after it.
    Text that is only whitespace (a model's "\n\n" before its tool use) is dropped:
    the API answers 400 to a text block without non-whitespace text.
    """
    system: list[str] = []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "system":
            if content:
                system.append(content)
        elif role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content.strip() else []
            for c in m.get("tool_calls") or []:
                args = c.get("args")
                # tool_use input must be an object; anything else is kept, wrapped.
                blocks.append({"type": "tool_use", "id": c["id"], "name": c["tool"],
                               "input": args if isinstance(args, dict) else {"value": args}})
            add("assistant", blocks)
        elif role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""),
                          "content": content, **({"is_error": True} if _is_error(content) else {})}])
        else:
            add("user", [{"type": "text", "text": content}] if content.strip() else [])
    return "\n\n".join(system), turns


def mark_cache(body: dict[str, Any]) -> None:
    """Put `cache_control` breakpoints (at most three of the API's four) on the request.

    The cached prefix runs tools, then system, then messages. Breakpoints:
    1. the end of the stable prefix: the system prompt (which covers the tools), or the
       last tool when there is no system prompt;
    2. the last block of the newest turn, so the next step can read all of this one;
    3. the last block of the user turn before the newest assistant reply: where the
       previous step put its breakpoint 2, so this step reads that cache even when more
       than the API's lookback of 20 blocks came after it (many results at once).
    A breakpoint on a prefix shorter than the model's minimum (1,024 tokens for most)
    is ignored by the API, and costs nothing.
    """
    stable = body.get("system") or body.get("tools")
    if stable:
        stable[-1]["cache_control"] = EPHEMERAL
    turns = body["messages"]
    if turns:
        turns[-1]["content"][-1]["cache_control"] = EPHEMERAL
    earlier = [i for i, t in enumerate(turns[:-1]) if t["role"] == "user"]
    if earlier:
        turns[earlier[-1]]["content"][-1]["cache_control"] = EPHEMERAL


def _is_error(content: str) -> bool:
    if not content.startswith("{"):
        return False
    try:
        data = json.loads(content)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("ok") is False


def wire_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": t.schema} for t in tools]


def parse_reply(data: dict[str, Any], turn: int) -> ModelReply | Paused:
    if data.get("stop_reason") == "pause_turn" and isinstance(data.get("content"), list):
        return Paused(content=data["content"], usage=parse_usage(data.get("usage")))
    return parse_response(data, turn)


def parse_response(data: dict[str, Any], turn: int) -> ModelReply:
    if data.get("type") == "error":
        raise ModelError(f"{PROVIDER}: error response: {error_message(data) or 'unknown error'}")
    content = data.get("content")
    if not isinstance(content, list):
        raise ModelError(f"{PROVIDER}: malformed response (no content list)")
    stop = data.get("stop_reason")
    if stop == "refusal":
        raise ModelError(f"{PROVIDER}: the model refused to answer")
    texts: list[str] = []
    calls: list[ProposedCall] = []
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise ModelError(f"{PROVIDER}: malformed response (content block {i} is not an object)")
        if block.get("type") == "text":
            texts.append(str(block.get("text") or ""))
        elif block.get("type") == "tool_use":
            if not isinstance(block.get("name"), str):
                raise ModelError(f"{PROVIDER}: malformed response (tool_use {i} without a name)")
            raw_id = block.get("id")
            call_id = raw_id if isinstance(raw_id, str) and raw_id else f"toolu_{turn}_{i}"
            calls.append(ProposedCall(id=call_id, tool=block["name"], args=block.get("input", {})))
    if stop == "max_tokens":
        raise ModelError(f"{PROVIDER}: the reply was cut off at max_tokens")
    if stop == "model_context_window_exceeded":
        raise ModelError(f"{PROVIDER}: the reply was cut off: the model's context window is full")
    text = "".join(texts)
    usage = parse_usage(data.get("usage"))
    if calls:
        return ModelReply(calls=tuple(calls), text=text, usage=usage)
    if not text.strip():
        raise ModelError(f"{PROVIDER}: empty reply (no text and no tool use)")
    return ModelReply(final=text, usage=usage)


def parse_usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    given, out = raw.get("input_tokens"), raw.get("output_tokens")
    if not isinstance(given, int) or not isinstance(out, int):
        return None
    # Anthropic's input_tokens are only the tokens after the last cache breakpoint; the
    # prompt is all three, and the cache parts are priced apart.
    read, write = (v if isinstance(v := raw.get(k), int) else 0
                   for k in ("cache_read_input_tokens", "cache_creation_input_tokens"))
    return Usage(input_tokens=given + read + write, output_tokens=out, cached_input_tokens=read, cache_write_tokens=write)


class AnthropicClient:
    def __init__(
        self,
        *,
        model: str,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        max_tokens: int = 4096,
        options: HttpOptions | None = None,
        key_name: str = "ANTHROPIC_API_KEY",
    ) -> None:
        self.model = model
        self._api_key = api_key
        self.key_name = key_name  # the environment variable it came from, for error texts
        self.base_url = base_url.rstrip("/")
        self.max_tokens = max_tokens
        self.options = options or HttpOptions()

    def __repr__(self) -> str:  # never show the key, even in a traceback's locals
        return f"AnthropicClient(model={self.model!r}, base_url={self.base_url!r})"

    def propose(self, request: ModelRequest) -> ModelReply:
        if not self._api_key:
            raise ModelError(f"{PROVIDER}: {self.key_name} is not set")
        system, turns = wire_messages(request.messages)
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": turns}
        if system:
            body["system"] = [{"type": "text", "text": system}]
        if request.tools:
            body["tools"] = wire_tools(request.tools)
        mark_cache(body)
        headers = {"x-api-key": self._api_key, "anthropic-version": API_VERSION, "content-type": "application/json"}
        paused: list[Usage | None] = []
        for _ in range(PAUSED_TURNS_MAX + 1):
            reply = exchange(
                f"{self.base_url}/v1/messages",
                headers=headers, body=body, options=self.options, provider=PROVIDER, secret=self._api_key,
                describe=lambda exc: describe_failure(exc, self.key_name), parse=parse_reply, turn=request.turn,
            )
            if isinstance(reply, ModelReply):
                return _with_usage(reply, [*paused, reply.usage])
            # The API's way to continue: send the paused content back as the assistant's
            # last turn; a second pause extends that same turn.
            paused.append(reply.usage)
            messages = body["messages"]
            if paused[1:]:
                messages[-1] = {"role": "assistant", "content": [*messages[-1]["content"], *reply.content]}
            else:
                body["messages"] = [*messages, {"role": "assistant", "content": reply.content}]
        raise ModelError(f"{PROVIDER}: the turn was still paused (pause_turn) after {PAUSED_TURNS_MAX} continuations")


def _with_usage(reply: ModelReply, usages: list[Usage | None]) -> ModelReply:
    """The reply billed for every request it took (a paused turn costs too)."""
    if len(usages) == 1:
        return reply
    if any(u is None for u in usages):
        return replace(reply, usage=None)
    return replace(reply, usage=sum((u for u in usages if u is not None), Usage(0, 0)))


def describe_failure(exc: Failure, key_name: str = "ANTHROPIC_API_KEY") -> str:
    message = error_message(exc.body) or exc.text
    lowered = message.lower()
    if (
        "prompt is too long" in lowered
        or "context window" in lowered
        or "context length" in lowered
        or "exceed context limit" in lowered  # input length and `max_tokens` exceed context limit
    ):
        return f"{PROVIDER}: context length exceeded: {message}"
    if exc.status in (401, 403):
        return f"{PROVIDER}: authentication failed (HTTP {exc.status}; check {key_name}): {message}"
    return f"{PROVIDER}: HTTP {exc.status}: {message}"


def make_client(profile: Any, run: Any) -> AnthropicClient:
    key_name, api_key = profile_key(profile, "ANTHROPIC_API_KEY")
    return AnthropicClient(
        model=profile.model_name,
        api_key=api_key,
        key_name=key_name,
        base_url=profile.base_url or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL,
        max_tokens=settings.AIRLOCK_ANTHROPIC_MAX_TOKENS,
        options=HttpOptions.from_settings(),
    )
