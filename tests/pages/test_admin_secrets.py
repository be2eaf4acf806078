"""API tokens and webhooks are created in the admin as well as by command: the token or
the signing secret is shown once, on the page that answers the form, and never again
(not on the change page, the list, a later page, the session or a cookie)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.sessions.models import Session
from django.core.exceptions import ValidationError
from django.test import Client

from agents.actions.tokens import digest
from agents.models import ApiToken, Webhook
from tests.helpers import client_for, person

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(defaults: None) -> Client:
    return client_for(person("root", superuser=True))


def post_form(client: Client, url: str, data: dict[str, Any]) -> Any:
    """POST the add form with the CSRF token its page handed out, as the browser does."""
    page = client.get(url)
    assert page.status_code == 200
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert token is not None
    return client.post(url, {**data, "csrfmiddlewaretoken": token.group(1)})


def shown(response: Any) -> str:
    found = re.search(r'<pre class="shown-once" data-testid="shown-once">([^<]+)</pre>', response.content.decode())
    assert found is not None, response.content.decode()[:3000]
    return found.group(1)


def nowhere_else(client: Client, secret: str, *urls: str) -> None:
    for url in urls:
        page = client.get(url)
        assert page.status_code == 200 and secret not in page.content.decode(), url
    assert all(secret not in morsel.value for morsel in client.cookies.values())
    assert all(secret not in s.session_data and secret not in str(s.get_decoded()) for s in Session.objects.all())


# -- API tokens -------------------------------------------------------------------------


def test_an_api_token_made_in_the_admin_is_shown_once_and_works(admin_client: Client, lena: Any) -> None:
    response = post_form(admin_client, "/admin/agents/apitoken/add/", {"user": lena.pk, "name": "ci"})
    assert response.status_code == 200, "rendered, not redirected: the token never rides in a message or URL"
    assert "no-store" in response["Cache-Control"]
    raw = shown(response)
    assert raw.startswith("airlock_")

    token = ApiToken.objects.get()
    assert (token.user, token.name, token.digest) == (lena, "ci", digest(raw))
    assert raw not in (token.prefix, token.name) and raw.startswith(token.prefix)
    nowhere_else(admin_client, raw, f"/admin/agents/apitoken/{token.pk}/change/", "/admin/agents/apitoken/")

    api = Client()
    assert api.get("/api/approvals", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    assert api.get("/api/approvals", HTTP_AUTHORIZATION=f"Bearer {raw}x").status_code == 401


def test_the_api_token_add_form_refuses_an_inactive_user(admin_client: Client, lena: Any) -> None:
    lena.is_active = False
    lena.save()
    response = post_form(admin_client, "/admin/agents/apitoken/add/", {"user": lena.pk, "name": ""})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not ApiToken.objects.exists()


def test_who_may_not_add_tokens_gets_403(defaults: None) -> None:
    operator = person("otto", "operator")
    operator.is_staff = True
    operator.save()
    assert client_for(operator).get("/admin/agents/apitoken/add/").status_code == 403


# -- webhooks ---------------------------------------------------------------------------


def test_a_webhook_made_in_the_admin_shows_its_secret_once(admin_client: Client, settings: Any) -> None:
    settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS = ["hooks.internal"]
    url = "https://hooks.internal/airlock/T0/B0/secret-path"
    response = post_form(admin_client, "/admin/agents/webhook/add/", {
        "url": url, "events": ["approval.pending", "run.failed"], "format": "json", "active": "on",
    })
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    secret = shown(response)
    assert "would be refused" not in response.content.decode()

    hook = Webhook.objects.get()
    assert secret.startswith("whsec_") and hook.secret == secret, "the secret shown is the one deliveries sign with"
    assert (hook.url, hook.events, hook.format, hook.active) == (url, ["approval.pending", "run.failed"], "json", True)
    nowhere_else(admin_client, secret, f"/admin/agents/webhook/{hook.pk}/change/", "/admin/agents/webhook/")
    change = admin_client.get(f"/admin/agents/webhook/{hook.pk}/change/").content.decode()
    assert "secret-path" not in change and "https://hooks.internal/…" in change


def test_a_webhook_to_a_refused_address_is_saved_with_a_warning(admin_client: Client, settings: Any) -> None:
    settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS = []
    response = post_form(admin_client, "/admin/agents/webhook/add/", {
        "url": "http://127.0.0.1:9/hook", "events": ["run.done"], "format": "json", "active": "on",
    })
    assert response.status_code == 200
    shown(response)
    assert "Deliveries to this URL would be refused now" in response.content.decode()
    assert Webhook.objects.count() == 1


def test_the_webhook_add_form_refuses_unknown_events_and_bad_urls(admin_client: Client) -> None:
    response = post_form(admin_client, "/admin/agents/webhook/add/", {
        "url": "ftp://example.com/x", "events": ["run.exploded"], "format": "json",
    })
    assert response.status_code == 200
    page = response.content.decode()
    assert "Select a valid choice. run.exploded is not one of the available choices." in page
    assert page.count("Enter a valid URL.") == 1
    assert not Webhook.objects.exists()


@pytest.mark.parametrize("url", ["ftp://x", "ftp://example.com/x", "https://"])
def test_the_webhook_add_form_says_a_refused_url_once(admin_client: Client, url: str) -> None:
    response = post_form(admin_client, "/admin/agents/webhook/add/", {"url": url, "events": ["run.done"], "format": "json"})
    assert response.status_code == 200
    assert response.content.decode().count("Enter a valid URL.") == 1
    assert not Webhook.objects.exists()


def test_a_webhooks_full_clean_says_each_refusal_once() -> None:
    with pytest.raises(ValidationError) as caught:
        Webhook(url="ftp://x", events=["run.done"], secret="s").full_clean()
    assert caught.value.message_dict == {"url": ["Enter a valid URL."]}


def test_a_webhooks_events_are_changed_in_the_admin_without_its_secret(admin_client: Client) -> None:
    hook = Webhook.objects.create(url="https://hooks.example.com/x", events=["run.done"], secret="whsec_kept")
    url = f"/admin/agents/webhook/{hook.pk}/change/"
    response = post_form(admin_client, url, {"events": ["run.done", "run.failed"], "format": "slack", "active": "on"})
    assert response.status_code == 302
    hook.refresh_from_db()
    assert (hook.events, hook.format, hook.secret, hook.url) == (
        ["run.done", "run.failed"], "slack", "whsec_kept", "https://hooks.example.com/x")
