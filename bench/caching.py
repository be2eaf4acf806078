"""Prompt caching per run: what a long Anthropic run reads from the cache and what that
saves, through the real client, store and pricing. `make bench` runs it after
bench/run.py; it adds the section "caching" to bench/results.json and prints one line.

The provider is the test suite's fake Messages API server (`tests/llm`), which plays
Anthropic's prompt cache by exact breakpoint prefixes (stricter than the API), so the
figures are the ones Airlock's breakpoints earn against that rule, not a measurement
of Anthropic's servers. Tokens are estimated by the fake as a quarter of the characters.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run as airlock_bench  # noqa: E402  (bench/run.py: environment, Django set-up)

STEPS = 20
KEY_ENV = "AIRLOCK_BENCH_ANTHROPIC_API_KEY"
# Sonnet 4, micro-dollars per million tokens: input, output, cache read, cache write (5 min).
PRICES = {"price_input_micros": 3_000_000, "price_output_micros": 15_000_000,
          "price_cached_input_micros": 300_000, "price_cache_write_micros": 3_750_000}


def caching_bench(steps: int = STEPS) -> dict[str, Any]:
    from agents.actions.runs import run_launch
    from agents.models import AgentProfile
    from agents.runs import driver
    from tests.llm.provider import FakeProvider, Reply
    from tests.llm.shapes import AnthropicPromptCache, anthropic_check, anthropic_message

    fake = FakeProvider()
    fake.check = anthropic_check
    fake.usage_for = AnthropicPromptCache()
    fake.thread.start()
    os.environ.setdefault(KEY_ENV, "bench-placeholder-key")
    try:
        profile, _ = AgentProfile.objects.update_or_create(
            name="bench-anthropic",
            defaults={
                "provider": "anthropic", "model_name": "claude-sonnet-4-20250514", "base_url": fake.url,
                "api_key_env": KEY_ENV, "tools": ["kb_search"], "limits": {"max_steps": 10 * steps},
                "system_prompt": "You are the help desk of a shop. " + "Answer from the knowledge base. " * 120,
                **PRICES,
            },
        )
        queries = ["shipping", "refund", "password", "discount", "hours"]
        fake.add(*[
            Reply(body=anthropic_message(tool_uses=[(f"toolu_{i}", "kb_search", {"query": f"{queries[i % 5]} {i}"})],
                                         usage=(1, 40)))
            for i in range(steps - 1)
        ], Reply(body=anthropic_message(text="Answered.", usage=(1, 40))))
        run = driver.drive(run_launch(agent=profile, task="Answer the customer's questions.").pk)
        assert run.state == "done", run.error
        usages = [t.payload["usage"] for t in run.transitions.filter(kind="model").order_by("seq")]
    finally:
        fake.server.shutdown()
        fake.server.server_close()
    cache = run.cache_tokens()
    input_tokens = sum(u["input_tokens"] for u in usages)
    at_input_price = sum(math.ceil(u["input_tokens"] * 3 + u["output_tokens"] * 15) for u in usages)
    return {
        "model_calls": len(usages),
        "input_tokens": input_tokens,
        "cached_input_tokens": cache["read"],
        "cache_write_tokens": cache["write"],
        "cached_share": cache["read"] / input_tokens,
        "cost_micros": run.cost_micros,
        "cost_at_input_price_micros": at_input_price,
        "cost_ratio": run.cost_micros / at_input_price,
    }


def print_caching(c: dict[str, Any]) -> None:
    print(
        f"\nprompt caching (fake Anthropic cache, {c['model_calls']} model calls): {c['input_tokens']:,} input tokens, "
        f"{c['cached_input_tokens']:,} read from the cache ({c['cached_share']:.0%}), {c['cache_write_tokens']:,} written; "
        f"cost {c['cost_micros']:,} micro-$ = {c['cost_ratio']:.2f}x the same tokens at the input price"
    )


def main() -> None:
    airlock_bench.setup_django()
    out = ROOT / "bench" / "results.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results["caching"] = caching_bench()
    out.write_text(json.dumps(results, indent=2))
    print_caching(results["caching"])


if __name__ == "__main__":
    main()
