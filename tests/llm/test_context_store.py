"""Context compaction through the store: a run against the fake OpenAI server with a
small budget folds older results in what it sends, keeps them all in its rows, and
replays the same from its transitions."""

from __future__ import annotations

import pytest

from agents.models import AgentProfile
from agents.runs.verify import verify_run
from tests.helpers import person
from tests.llm.provider import Reply
from tests.llm.shapes import openai_completion

QUERIES = ["shipping", "refund", "password", "discount", "hours", "shipping Canada", "refund policy", "opening hours"]
STUB = "[airlock: this earlier result of kb_search"


@pytest.mark.django_db(transaction=True)
def test_a_long_run_folds_old_results_in_the_prompt_and_keeps_them_in_the_transcript(
    defaults, openai_env, launch, drive, client
) -> None:
    provider = openai_env
    AgentProfile.objects.create(name="gpt", provider="openai", model_name="gpt-4.1", tools=["kb_search"],
                                context_tokens=650, limits={"max_steps": 40})
    provider.add(*[Reply(body=openai_completion(tool_calls=[(f"call_{i}", "kb_search", {"query": q})], usage=None))
                   for i, q in enumerate(QUERIES)],
                 Reply(body=openai_completion(content="All answered.", usage=None)))
    run = drive(launch(None, agent="gpt", task="Tell me everything."))
    assert run.state == "done", run.error
    compactions = list(run.transitions.filter(kind="compact").order_by("seq"))
    assert compactions, "the budget should have forced at least one compaction"
    folded = [i for t in compactions for i in t.payload["folded"]]
    last = provider.requests[-1].json["messages"]
    stubs = [m["tool_call_id"] for m in last if m["role"] == "tool" and m["content"].startswith(STUB)]
    assert stubs == folded and "call_7" not in stubs and "call_6" not in stubs
    # Every call still has its result right after it in what the provider got.
    for i, m in enumerate(last):
        if m.get("tool_calls"):
            assert last[i + 1]["tool_call_id"] == m["tool_calls"][0]["id"]
    # The stored transcript is whole, and the run replays the same from its log.
    stored = list(run.messages.filter(role="tool").values_list("content", flat=True))
    assert len(stored) == len(QUERIES) and not any(c.startswith(STUB) for c in stored)
    assert verify_run(run) == []
    client.force_login(person("ops", superuser=True))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Context compacted:" in page and f"<code>{folded[0]}</code>" in page
