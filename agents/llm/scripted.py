"""The scripted client: replays decisions given with the run (tests, evals)."""

from __future__ import annotations

from typing import Any

from agents.engine.protocols import ModelError, ModelReply, ModelRequest, ProposedCall, Usage


class ScriptError(ValueError):
    """A script that does not have the documented shape."""


def parse_item(item: Any, index: int) -> ModelReply:
    where = f"script item {index}"
    if not isinstance(item, dict):
        raise ScriptError(f"{where} must be an object, not {type(item).__name__}")
    shapes = [k for k in ("call", "calls", "final") if k in item]
    if len(shapes) != 1:
        raise ScriptError(f"{where} needs exactly one of 'call', 'calls' or 'final'")
    usage = None
    if "usage" in item:
        raw = item["usage"]
        if not isinstance(raw, dict) or not all(
            isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool) and raw[k] >= 0
            for k in ("input_tokens", "output_tokens")
        ):
            raise ScriptError(f"{where}: usage needs whole input_tokens and output_tokens")
        cache = [raw.get(k, 0) for k in ("cached_input_tokens", "cache_write_tokens")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in cache):
            raise ScriptError(f"{where}: cached_input_tokens and cache_write_tokens must be whole numbers")
        if sum(cache) > raw["input_tokens"]:
            raise ScriptError(f"{where}: cached tokens are part of input_tokens and cannot exceed it")
        usage = Usage(raw["input_tokens"], raw["output_tokens"], *cache)
    if "final" in item:
        if not isinstance(item["final"], str):
            raise ScriptError(f"{where}: final must be text")
        return ModelReply(final=item["final"], usage=usage)
    raw_calls = [item["call"]] if "call" in item else item["calls"]
    if not isinstance(raw_calls, list) or not raw_calls:
        raise ScriptError(f"{where}: calls must be a non-empty list")
    calls = []
    for j, call in enumerate(raw_calls):
        if not isinstance(call, dict) or not isinstance(call.get("tool"), str):
            raise ScriptError(f"{where}: call {j} needs a tool name")
        calls.append(ProposedCall(id=str(call.get("id") or f"call_{index}_{j}"), tool=call["tool"], args=call.get("args", {})))
    return ModelReply(calls=tuple(calls), usage=usage)


def validate_script(script: Any) -> list[dict[str, Any]]:
    if not isinstance(script, list):
        raise ScriptError("script must be a list of decisions")
    for i, item in enumerate(script):
        parse_item(item, i)
    return script


class ScriptedClient:
    # Answers from memory: the driver keeps its database connection (driver.ReleasingModel).
    waits = False

    def __init__(self, script: list[Any]) -> None:
        self.script = script

    def propose(self, request: ModelRequest) -> ModelReply:
        if request.turn >= len(self.script):
            raise ModelError("script exhausted")
        try:
            return parse_item(self.script[request.turn], request.turn)
        except ScriptError as exc:
            raise ModelError(str(exc)) from None


def make_client(profile: Any, run: Any) -> ScriptedClient:
    return ScriptedClient(run.script or [])
