"""Response bodies in the shape the providers really send (recorded, ids shortened)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def openai_completion(
    *, content: str | None = None, tool_calls: list[tuple[str, str, Any]] | None = None,
    finish_reason: str | None = None, usage: tuple[int, int] | None = (312, 24), refusal: str | None = None,
    cached: int = 0,
) -> dict[str, Any]:
    """tool_calls: (id, name, arguments) where a str argument is sent as is (maybe invalid JSON)."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal, "annotations": []}
    if tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function",
             "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
            for cid, name, args in tool_calls
        ]
    body: dict[str, Any] = {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion",
        "created": 1741570283,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop")}],
        "service_tier": "default",
        "system_fingerprint": "fp_06737a9306",
    }
    if usage:
        body["usage"] = {
            "prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage),
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
        }
    return body


def openai_error(message: str, *, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def anthropic_message(
    *, text: str | None = None, tool_uses: list[tuple[str, str, Any]] | None = None,
    stop_reason: str | None = None, usage: tuple[int, int] | None = (410, 57),
    cache_read: int = 0, cache_write: int = 0,
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"type": "text", "text": text})
    for tid, name, args in tool_uses or []:
        content.append({"type": "tool_use", "id": tid, "name": name, "input": args})
    body: dict[str, Any] = {
        "id": "msg_01Aq9w938a90dw8q",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-20250514",
        "content": content,
        "stop_reason": stop_reason or ("tool_use" if tool_uses else "end_turn"),
        "stop_sequence": None,
    }
    if usage:
        body["usage"] = {"input_tokens": usage[0], "output_tokens": usage[1],
                         "cache_creation_input_tokens": cache_write, "cache_read_input_tokens": cache_read,
                         "service_tier": "standard"}
    return body


def anthropic_error(type_: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}}


def llama_cpp_context_error(n_prompt: int = 9000, n_ctx: int = 8192) -> dict[str, Any]:
    """llama.cpp server's answer (HTTP 400) to a prompt longer than its context."""
    return {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                      "type": "exceed_context_size_error", "n_prompt_tokens": n_prompt, "n_ctx": n_ctx}}


def ollama_check(body: Any) -> Any:
    """Ollama's OpenAI-compatible endpoint decodes every replayed tool call's
    `arguments` into an object and answers 400 when one is not valid JSON."""
    from tests.llm.provider import Reply

    for message in body.get("messages", []):
        for call in message.get("tool_calls") or []:
            try:
                args = json.loads(call["function"]["arguments"])
            except ValueError:
                args = None
            if not isinstance(args, dict):
                return Reply(400, openai_error("invalid tool call arguments"))
    return None


def anthropic_check(body: Any) -> Any:
    """The Messages API's own checks that our requests could trip: text blocks need
    non-whitespace text, and at most four blocks may carry cache_control."""
    from tests.llm.provider import Reply

    blocks = [*body.get("tools", []), *(body["system"] if isinstance(body.get("system"), list) else [])]
    for message in body.get("messages", []):
        content = message.get("content")
        blocks.extend(content if isinstance(content, list) else [])
    for block in blocks:
        if block.get("type") == "text" and not str(block.get("text", "")).strip():
            return Reply(400, anthropic_error("invalid_request_error",
                                              "messages: text content blocks must contain non-whitespace text"))
    if sum(1 for b in blocks if "cache_control" in b) > 4:
        return Reply(400, anthropic_error("invalid_request_error",
                                          "A maximum of 4 blocks with cache_control may be provided. Found 5."))
    return None


class AnthropicPromptCache:
    """Plays Anthropic's prompt cache for the fake server's usage.

    The prompt is the blocks of tools, then system, then messages. A block carrying
    `cache_control` is a breakpoint: the prefix up to it is written to the cache, unless
    it is already there, and the longest cached breakpoint prefix of a request is read.
    Stricter than the API (no lookback to unmarked boundaries), so a request only reads
    the cache where a breakpoint lies exactly where an earlier request put one. Tokens
    are estimated as a quarter of the characters.
    """

    def __init__(self) -> None:
        self.cached: set[str] = set()

    def __call__(self, body: Any) -> dict[str, int]:
        system = body.get("system")
        blocks = [("tool", b) for b in body.get("tools", [])]
        blocks += [("system", b) for b in (system if isinstance(system, list) else [])]
        blocks += [(m["role"], b) for m in body.get("messages", []) for b in m["content"]]
        digest = hashlib.sha256()
        keys, sizes = [], []
        for role, block in blocks:
            text = json.dumps([role, {k: v for k, v in block.items() if k != "cache_control"}], sort_keys=True)
            digest.update(text.encode())
            keys.append(digest.hexdigest())
            sizes.append(len(text) // 4 + 1)
        marks = [i for i, (_, block) in enumerate(blocks) if "cache_control" in block]
        read_to = max((i + 1 for i in marks if keys[i] in self.cached), default=0)
        write_to = max((i + 1 for i in marks), default=0)
        read, write = sum(sizes[:read_to]), sum(sizes[read_to:write_to])
        self.cached.update(keys[i] for i in marks)
        return {"input_tokens": sum(sizes) - read - write, "cache_read_input_tokens": read,
                "cache_creation_input_tokens": write}
