"""Content passes through: an upstream's image, audio, embedded resources and structured
content reach the gateway's client as the upstream sent them, while the run's
transcript keeps the text summary the model reads and the journal the full result."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import AgentProfile, Message, ToolCall
from tests.gateway.conftest import mcp_session
from tests.helpers import requires_postgres

pytestmark = [requires_postgres(), pytest.mark.django_db(transaction=True)]

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


@pytest.fixture
def media(suite_upstream: str) -> AgentProfile:
    return AgentProfile.objects.create(name="media", provider="external", tools=["suite__*"])


def test_an_upstream_image_reaches_the_client_as_an_image_and_the_transcript_keeps_its_summary(
    live_server: Any, media, token
) -> None:
    async def session(client: Any) -> Any:
        return await client.call_tool("suite__test_image_content", {})

    result = mcp_session(f"{live_server.url}/mcp/media/", token, session)
    assert not result.is_error
    [block] = result.content
    assert block.type == "image" and block.mime_type == "image/png" and block.data == PNG
    said = Message.objects.get(role="tool").content
    assert said == f"[image image/png, {len(PNG)} base64 chars]"  # what the model reads: no base64 in the transcript
    kept = ToolCall.objects.get().result
    assert kept["result"] == said and kept["content"]["content"][0]["data"] == PNG  # the journal: all of it


def test_mixed_content_audio_and_embedded_resources_pass_through_in_order(live_server: Any, media, token) -> None:
    async def session(client: Any) -> Any:
        return [await client.call_tool(f"suite__{name}", {})
                for name in ("test_multiple_content_types", "test_audio_content", "test_embedded_resource")]

    mixed, audio, embedded = mcp_session(f"{live_server.url}/mcp/media/", token, session)
    assert [b.type for b in mixed.content] == ["text", "image", "resource"]
    assert mixed.content[0].text == "Multiple content types test:"
    assert mixed.content[2].resource.uri == "test://mixed-content-resource"
    assert mixed.content[2].resource.text == '{"test":"data","value":123}'
    assert [(b.type, b.mime_type) for b in audio.content] == [("audio", "audio/wav")]
    assert embedded.content[0].resource.mime_type == "text/plain"


def test_a_plain_text_result_is_journaled_as_before(live_server: Any, media, token) -> None:
    async def session(client: Any) -> Any:
        return await client.call_tool("suite__test_simple_text", {})

    result = mcp_session(f"{live_server.url}/mcp/media/", token, session)
    assert [(b.type, b.text) for b in result.content] == [("text", "This is a simple text response for testing.")]
    assert ToolCall.objects.get().result == {"ok": True, "result": "This is a simple text response for testing."}


def test_structured_content_and_resource_links_pass_through(live_server: Any, media, token) -> None:
    async def session(client: Any) -> Any:
        return await client.call_tool("suite__structured_record", {})

    result = mcp_session(f"{live_server.url}/mcp/media/", token, session)
    assert result.structured_content == {"id": 7, "name": "alpha"}
    assert [b.type for b in result.content] == ["text", "resource_link"]
    assert str(result.content[1].uri) == "test://records/7"
    assert Message.objects.get(role="tool").content == '{"id": 7, "name": "alpha"}\n[resource test://records/7]'
