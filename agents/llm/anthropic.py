"""The Anthropic client: the Messages API with tool use, over httpx.

Configuration comes from the environment when a run is driven: `ANTHROPIC_API_KEY` and
`ANTHROPIC_BASE_URL` (default https://api.anthropic.com). The key goes into the
`x-api-key` header and nowhere else; every error text is scrubbed of it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from django.conf import settings

from agents.engine.protocols import Decision, ModelError, ModelRequest, ProposedCall, Usage
from agents.engine.registry import ToolSpec

from . import CLIENTS
from .http import Failure, HttpOptions, error_message, exchange

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
PROVIDER = "anthropic"


def wire_messages(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Engine transcript -> (system text, Messages API turns).

    System messages become the top-level `system`; tool results become `tool_result`
    blocks in a user turn; consecutive turns of one role are merged, because the API
    wants every result of an assistant's tool uses in the single user turn after it.
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
            blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
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
            add("user", [{"type": "text", "text": content}] if content else [])
    return "\n\n".join(system), turns


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


def parse_response(data: dict[str, Any], turn: int) -> Decision:
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
    text = "".join(texts)
    usage = parse_usage(data.get("usage"))
    if calls:
        return Decision(calls=tuple(calls), text=text, usage=usage)
    if not text.strip():
        raise ModelError(f"{PROVIDER}: empty reply (no text and no tool use)")
    return Decision(final=text, usage=usage)


def parse_usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    given, out = raw.get("input_tokens"), raw.get("output_tokens")
    if not isinstance(given, int) or not isinstance(out, int):
        return None
    # Cached prompt tokens are billed too (at other rates); count them as input.
    cached = sum(v for k in ("cache_creation_input_tokens", "cache_read_input_tokens")
                 if isinstance(v := raw.get(k), int))
    return Usage(input_tokens=given + cached, output_tokens=out)


class AnthropicClient:
    def __init__(
        self,
        *,
        model: str,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        max_tokens: int = 4096,
        options: HttpOptions | None = None,
    ) -> None:
        self.model = model
        self._api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.max_tokens = max_tokens
        self.options = options or HttpOptions()

    def __repr__(self) -> str:  # never show the key, even in a traceback's locals
        return f"AnthropicClient(model={self.model!r}, base_url={self.base_url!r})"

    def decide(self, request: ModelRequest) -> Decision:
        if not self._api_key:
            raise ModelError(f"{PROVIDER}: ANTHROPIC_API_KEY is not set")
        system, turns = wire_messages(request.messages)
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": turns}
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = wire_tools(request.tools)
        headers = {"x-api-key": self._api_key, "anthropic-version": API_VERSION, "content-type": "application/json"}
        return exchange(
            f"{self.base_url}/v1/messages",
            headers=headers, body=body, options=self.options, provider=PROVIDER, secret=self._api_key,
            describe=describe_failure, parse=parse_response, turn=request.turn,
        )


def describe_failure(exc: Failure) -> str:
    message = error_message(exc.body) or exc.text
    lowered = message.lower()
    if "prompt is too long" in lowered or "context window" in lowered or "context length" in lowered:
        return f"{PROVIDER}: context length exceeded: {message}"
    if exc.status in (401, 403):
        return f"{PROVIDER}: authentication failed (HTTP {exc.status}; check ANTHROPIC_API_KEY): {message}"
    return f"{PROVIDER}: HTTP {exc.status}: {message}"


def _factory(profile: Any, run: Any) -> AnthropicClient:
    return AnthropicClient(
        model=profile.model_name,
        api_key=os.environ.get("ANTHROPIC_API_KEY", ""),
        base_url=os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL,
        max_tokens=settings.AIRLOCK_ANTHROPIC_MAX_TOKENS,
        options=HttpOptions.from_settings(),
    )


CLIENTS[PROVIDER] = _factory
