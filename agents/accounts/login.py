"""The login page: Django's password login, and the single sign-on button when an
identity provider is configured (agents/accounts/sso.py, docs/teams.md)."""

from __future__ import annotations

from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse

from agents.accounts import sso


def login(request: HttpRequest) -> HttpResponse:
    # Built per request: the button and the password form follow the settings as they are.
    view = LoginView.as_view(
        authentication_form=sso.PasswordLoginForm, redirect_authenticated_user=True, extra_context=sso.login_context()
    )
    response: HttpResponse = view(request)
    return sso.allow_provider(response)
