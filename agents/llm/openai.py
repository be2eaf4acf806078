"""The OpenAI client: Chat Completions with tools, over httpx, any compatible base URL
(OpenAI, vLLM, Ollama, llama.cpp server).

Configuration comes from the profile and the environment when a run is driven: the
profile's `base_url`, else `OPENAI_BASE_URL` (default https://api.openai.com/v1); the
key from the environment variable the profile names in `api_key_env`, else
`OPENAI_API_KEY`. The key goes into the Authorization header and nowhere else; every
error text is scrubbed of it.

Prompt caching: OpenAI (and vLLM's or llama.cpp's prefix cache) reuses the longest
prompt prefix it has seen, automatically from 1,024 tokens. The prompt is rendered tools
first, then the system prompt and the task, then the transcript, which only grows (a
compaction folds results once and for all): each part is serialised the same way on
every step, so step N's prompt is a byte-identical prefix of step N+1's.
"""

from __future__ import annotations

import json
import os
from typing import Any

from agents.engine.protocols import ModelError, ModelReply, ModelRequest, ProposedCall, Usage
from agents.engine.registry import ToolSpec
from agents.lib import jsonsafe

from .http import Failure, HttpOptions, error_message, exchange
from .keys import profile_key

DEFAULT_BASE_URL = "https://api.openai.com/v1"
PROVIDER = "openai"


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Engine transcript -> Chat Completions messages (tool call ids kept)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.get("content") or None}
            if m.get("tool_calls"):
                msg["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["tool"], "arguments": _arguments_text(c.get("args"))},
                    }
                    for c in m["tool_calls"]
                ]
            out.append(msg)
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": m.get("tool_call_id", ""), "content": m.get("content") or ""})
        else:
            out.append({"role": role, "content": m.get("content") or ""})
    return out


def _arguments_text(args: Any) -> str:
    """Arguments as the JSON object text the API expects. Arguments that were not a
    JSON object go back as `{}`: Ollama (and others) decode every replayed call and
    answer 400 to invalid JSON, failing the run. The raw text is not lost: the stored
    transcript keeps it and the model reads it in the call's `invalid_arguments` result."""
    return json.dumps(args if isinstance(args, dict) else {}, ensure_ascii=False)


def wire_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.schema}}
        for t in tools
    ]


def parse_arguments(raw: Any) -> Any:
    """Decoded arguments; text that is not JSON is passed on as is, for the engine to
    record as invalid arguments instead of crashing the run."""
    if raw is None or raw == "":
        return {}
    if not isinstance(raw, str):
        return raw
    try:
        return jsonsafe.parse(raw)
    except jsonsafe.JsonError:
        return raw


def parse_response(data: dict[str, Any], turn: int) -> ModelReply:
    if "error" in data and not data.get("choices"):
        # Some compatible servers answer 200 with an error object.
        raise ModelError(f"{PROVIDER}: error response: {error_message(data) or 'unknown error'}")
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise ModelError(f"{PROVIDER}: malformed response (no choices)")
    if not choices:
        raise ModelError(f"{PROVIDER}: empty response (no choices)")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise ModelError(f"{PROVIDER}: malformed response (choice without a message)")
    finish = choice.get("finish_reason")
    if message.get("refusal"):
        raise ModelError(f"{PROVIDER}: the model refused: {str(message['refusal'])[:300]}")
    if finish == "content_filter":
        raise ModelError(f"{PROVIDER}: the reply was withheld by the provider's content filter")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ModelError(f"{PROVIDER}: malformed response (tool_calls is not a list)")
    content = message.get("content")
    if isinstance(content, list):  # some compatible servers send content parts
        content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    text = content if isinstance(content, str) else ""
    if finish == "length":
        raise ModelError(f"{PROVIDER}: the reply was cut off at the output token limit")
    usage = parse_usage(data.get("usage"))
    calls = []
    for i, raw in enumerate(raw_calls):
        fn = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ModelError(f"{PROVIDER}: malformed response (tool call {i} without a function name)")
        raw_id = raw.get("id")
        call_id = raw_id if isinstance(raw_id, str) and raw_id else f"call_{turn}_{i}"
        calls.append(ProposedCall(id=call_id, tool=fn["name"], args=parse_arguments(fn.get("arguments"))))
    if calls:
        return ModelReply(calls=tuple(calls), text=text, usage=usage)
    if not text.strip():
        raise ModelError(f"{PROVIDER}: empty reply (no text and no tool calls)")
    return ModelReply(final=text, usage=usage)


def parse_usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    # prompt_tokens includes the part served from the automatic prefix cache.
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(input_tokens=prompt, output_tokens=completion,
                 cached_input_tokens=min(cached, prompt) if isinstance(cached, int) and cached > 0 else 0)


class OpenAIClient:
    def __init__(
        self,
        *,
        model: str,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        options: HttpOptions | None = None,
        key_name: str = "OPENAI_API_KEY",
    ) -> None:
        self.model = model
        self._api_key = api_key
        self.key_name = key_name  # the environment variable it came from, for error texts
        self.base_url = base_url.rstrip("/")
        self.options = options or HttpOptions()

    def __repr__(self) -> str:  # never show the key, even in a traceback's locals
        return f"OpenAIClient(model={self.model!r}, base_url={self.base_url!r})"

    def propose(self, request: ModelRequest) -> ModelReply:
        if not self._api_key and self.base_url == DEFAULT_BASE_URL:
            raise ModelError(f"{PROVIDER}: {self.key_name} is not set")
        body: dict[str, Any] = {"model": self.model, "messages": wire_messages(request.messages)}
        if request.tools:
            body["tools"] = wire_tools(request.tools)
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return exchange(
            f"{self.base_url}/chat/completions",
            headers=headers, body=body, options=self.options, provider=PROVIDER, secret=self._api_key,
            describe=lambda exc: describe_failure(exc, self.key_name), parse=parse_response, turn=request.turn,
        )


def describe_failure(exc: Failure, key_name: str = "OPENAI_API_KEY") -> str:
    message = error_message(exc.body) or exc.text
    err = exc.body.get("error") if isinstance(exc.body, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    kind = err.get("type") if isinstance(err, dict) else None
    lowered = message.lower()
    if (
        code == "context_length_exceeded"
        or kind == "exceed_context_size_error"  # llama.cpp server
        or "context length" in lowered
        or "context_length" in lowered
        or "context size" in lowered
    ):
        return f"{PROVIDER}: context length exceeded: {message}"
    if exc.status in (401, 403):
        return f"{PROVIDER}: authentication failed (HTTP {exc.status}; check {key_name}): {message}"
    return f"{PROVIDER}: HTTP {exc.status}: {message}"


def make_client(profile: Any, run: Any) -> OpenAIClient:
    key_name, api_key = profile_key(profile, "OPENAI_API_KEY")
    return OpenAIClient(
        model=profile.model_name,
        api_key=api_key,
        key_name=key_name,
        base_url=profile.base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL,
        options=HttpOptions.from_settings(),
    )
