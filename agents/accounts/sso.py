"""Single sign-on with OpenID Connect, through django-allauth's `openid_connect`
provider (docs/teams.md#single-sign-on-openid-connect).

The provider app is built from the AIRLOCK_OIDC_* settings at each request; no issuer,
no app: the button is not shown and allauth's URLs answer 404. What allauth does for us:
discovery, the authorization code flow with PKCE, the state (single use, bound to the
browser's session), the token request, and the ID token's issuer, audience and expiry.
Two checks allauth 65 leaves out, added here with its own pieces:

- the ID token's signature: allauth skips it for a token fetched over the back channel
  (OpenID Connect Core 3.1.3.7 allows that over TLS); we verify it against the provider's
  JWKS always, so a token that did not come from the provider's key is refused whatever
  the transport (`Adapter._decode_id_token`);
- the nonce: allauth sends none for this provider; ours sends one, keeps it in the
  allauth state, and compares it with the ID token's (`Provider.redirect`,
  `SsoAccountAdapter.pre_social_login`).

Who a person is and what they may do come from the verified ID token alone (userinfo is
not fetched), once per sign-in: `admission()` decides, `members.person_roles_sync` and
`people.person_leave` act.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from allauth.account.adapter import DefaultAccountAdapter
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.core.internal.datakit import parse_bool_safely
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from allauth.socialaccount.internal import jwtkit
from allauth.socialaccount.models import SocialApp, SocialLogin
from allauth.socialaccount.providers.base.constants import AuthError
from allauth.socialaccount.providers.oauth2.client import OAuth2Error
from allauth.socialaccount.providers.oauth2.views import OAuth2CallbackView
from allauth.socialaccount.providers.openid_connect.provider import OpenIDConnectProvider
from allauth.socialaccount.providers.openid_connect.views import OpenIDConnectOAuth2Adapter
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from agents.accounts import members
from agents.actions import people
from agents.models import Project
from agents.models.projects import ROLES

log = logging.getLogger("airlock.sso")

# The allauth app's id: the redirect URI is /accounts/oidc/sso/login/callback/.
PROVIDER_ID = "sso"
# Global groups a `*:<role>` entry gives ("this role in every project"); `*:admin`
# gives the admin membership of every project that exists at sign-in.
GLOBAL_ROLES = ("reviewer", "operator", "launcher")


def enabled() -> bool:
    return bool(settings.AIRLOCK_OIDC_ISSUER)


def social_app() -> SocialApp:
    """The provider app, from the environment (never a database row)."""
    return SocialApp(
        provider="openid_connect",
        provider_id=PROVIDER_ID,
        name=settings.AIRLOCK_OIDC_NAME,
        client_id=settings.AIRLOCK_OIDC_CLIENT_ID,
        secret=settings.AIRLOCK_OIDC_CLIENT_SECRET,
        settings={
            "server_url": settings.AIRLOCK_OIDC_ISSUER,
            "oauth_pkce_enabled": True,
            # The verified ID token is the one source: userinfo is unsigned JSON.
            "fetch_userinfo": False,
        },
    )


def login_url() -> str:
    return reverse("openid_connect_login", kwargs={"provider_id": PROVIDER_ID})


class Adapter(OpenIDConnectOAuth2Adapter):
    def complete_login(self, request: HttpRequest, app: SocialApp, token: Any, **kwargs: Any) -> SocialLogin:
        if not kwargs["response"].get("id_token"):
            raise OAuth2Error("the provider answered without an ID token")
        return super().complete_login(request, app, token, **kwargs)

    def _decode_id_token(self, app: SocialApp, id_token: str) -> dict[str, Any]:
        # allauth passes verify_signature=False after a token request; we never do.
        data: dict[str, Any] = jwtkit.verify_and_decode(
            credential=id_token,
            keys_url=self.openid_config["jwks_uri"],
            issuer=self.openid_config["issuer"],
            audience=app.client_id,
            lookup_kid=jwtkit.lookup_kid_jwk,
            verify_signature=True,
        )
        return data


class Provider(OpenIDConnectProvider):
    """allauth's OpenID Connect provider, with our adapter and a nonce
    (SOCIALACCOUNT_PROVIDERS' `provider_class`)."""

    oauth2_adapter_class = Adapter

    def redirect(self, request: HttpRequest, process: Any, next_url: Any = None, data: Any = None, **kwargs: Any) -> Any:
        nonce = secrets.token_urlsafe(24)
        params = kwargs.pop("auth_params", None)
        params = dict(self.get_auth_params() if params is None else params)
        params["nonce"] = nonce
        # The nonce rides in allauth's state (the session), which the callback unstashes
        # once: a replayed callback finds no state and is refused by allauth.
        return super().redirect(request, process, next_url, data, auth_params=params, nonce=nonce, **kwargs)


@login_not_required
def callback(request: HttpRequest, provider_id: str) -> HttpResponse:
    """allauth's callback view with our adapter (its own builds allauth's adapter
    directly, which would skip the signature check). Mounted at allauth's path."""
    try:
        view = OAuth2CallbackView.adapter_view(Adapter(request, provider_id))
        response: HttpResponse = view(request)
        return response
    except SocialApp.DoesNotExist:
        raise Http404("single sign-on is not configured") from None


@dataclass
class Admission:
    """What one sign-in's ID token allows: `refusal` (why not) or the roles it gives."""

    refusal: str = ""
    memberships: set[tuple[int, str]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)

    @property
    def roles(self) -> members.Roles:
        return members.Roles(memberships=frozenset(self.memberships), groups=frozenset(self.groups))


def _entries(claims: dict[str, Any]) -> list[str]:
    value = claims.get(settings.AIRLOCK_OIDC_GROUPS_CLAIM)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, str)]


def admission(claims: dict[str, Any], *, superuser: bool = False) -> Admission:
    """Decide one sign-in from its verified ID token's claims.

    1. AIRLOCK_OIDC_DOMAINS set: the email must be verified (`email_verified` true) and
       its domain listed, exactly (no subdomains).
    2. The groups claim's entries `<project-slug>:<role>` and `*:<role>` become
       memberships and global groups; an unknown project or role is ignored and logged.
    3. No role at all: refused (an identity provider that knows a person does not make
       them an Airlock user), except for a superuser, who needs none.
    """
    who = str(claims.get("preferred_username") or claims.get("sub") or "?")[:150]
    domains = settings.AIRLOCK_OIDC_DOMAINS
    if domains:
        email = str(claims.get("email") or "")
        domain = email.rpartition("@")[2].lower().rstrip(".") if "@" in email else ""
        if not parse_bool_safely(claims.get("email_verified")):
            return Admission(refusal="your email address is not verified by the identity provider")
        if domain not in domains:
            return Admission(refusal=f"sign-in is limited to addresses at {', '.join(domains)}")
    found = Admission()
    projects = dict(Project.objects.values_list("slug", "pk"))
    for entry in _entries(claims):
        slug, _, role = entry.strip().partition(":")
        if role not in ROLES or (slug != "*" and slug not in projects):
            # The entry is the provider's group name: no secret, but cut and quoted.
            log.warning("sso: ignored group %r for %s (unknown project or role)", entry[:100], who)
            continue
        if slug == "*" and role in GLOBAL_ROLES:
            found.groups.add(role)
        elif slug == "*":
            found.memberships.update((pk, role) for pk in projects.values())
        else:
            found.memberships.add((projects[slug], role))
    if not (found.memberships or found.groups or superuser):
        return Admission(refusal="the identity provider gives you no role in Airlock")
    return found


class PasswordLoginForm(AuthenticationForm):
    """Django's login form; with AIRLOCK_PASSWORD_LOGIN=0 only a superuser (the
    break-glass account) gets past it. Checked after the password, so a wrong password is
    counted by django-axes as ever and the message tells nothing to who lacks it."""

    def confirm_login_allowed(self, user: Any) -> None:
        super().confirm_login_allowed(user)
        if not settings.AIRLOCK_PASSWORD_LOGIN and not user.is_superuser:
            raise ValidationError(
                f"Password sign-in is off for everyone but administrators: use “{settings.AIRLOCK_OIDC_NAME}”.",
                code="password_login_off",
            )


def login_context(**extra: Any) -> dict[str, Any]:
    """What the login page needs besides its form."""
    return {
        "sso": {"name": settings.AIRLOCK_OIDC_NAME, "url": login_url()} if enabled() else None,
        "password_login": settings.AIRLOCK_PASSWORD_LOGIN or not enabled(),
        **extra,
    }


def allow_provider(response: HttpResponse) -> HttpResponse:
    """Let a page's SSO button lead to the provider: the button's POST is answered with a
    redirect there, and Content-Security-Policy's form-action covers the redirects after a
    form's submission (Chromium enforces it). Only the issuer's origin is added."""
    if enabled():
        issuer = urlsplit(settings.AIRLOCK_OIDC_ISSUER)
        response._csp_update = {"form-action": [f"{issuer.scheme}://{issuer.netloc}"]}  # type: ignore[attr-defined]
    return response


def refused(request: HttpRequest, message: str) -> ImmediateHttpResponse:
    """The login page again, saying why single sign-on let nobody in."""
    context = {"form": PasswordLoginForm(request), **login_context(sso_error=message)}
    return ImmediateHttpResponse(allow_provider(render(request, "registration/login.html", context, status=403)))


class AccountAdapter(DefaultAccountAdapter):
    """allauth's local accounts stay closed: passwords are Django's own login's."""

    def is_open_for_signup(self, request: HttpRequest) -> bool:
        return False


class SsoAccountAdapter(DefaultSocialAccountAdapter):
    def list_apps(self, request: HttpRequest | None, provider: Any = None, client_id: Any = None) -> list[SocialApp]:
        if not enabled():
            return []
        app = social_app()
        if provider and provider not in (app.provider, app.provider_id):
            return []
        if client_id and client_id != app.client_id:
            return []
        return [app]

    def is_open_for_signup(self, request: HttpRequest, sociallogin: SocialLogin) -> bool:
        return True

    def on_authentication_error(
        self, request: HttpRequest, provider: Any, error: Any = None, exception: Any = None, extra_context: Any = None
    ) -> None:
        # The exception's class and allauth's code only: its text may quote a token.
        log.warning("sso: sign-in failed: %s %s", error, type(exception).__name__ if exception else "")
        if error == AuthError.CANCELLED:
            # allauth would redirect to its own "cancelled" page, which we do not mount.
            raise refused(request, "Single sign-on was cancelled at the identity provider. Nothing was signed in.")

    def is_auto_signup_allowed(self, request: HttpRequest, sociallogin: SocialLogin) -> bool:
        return True

    def pre_social_login(self, request: HttpRequest, sociallogin: SocialLogin) -> None:
        """Every sign-in, before allauth logs anyone in: the nonce, then `admission()`.
        A known person refused here leaves (people.person_leave); one admitted has their
        name, email and roles set from the token."""
        claims = sociallogin.account.extra_data.get("id_token") or {}
        expected = str((sociallogin.state or {}).get("nonce") or "")
        if not expected or not hmac.compare_digest(str(claims.get("nonce") or ""), expected):
            log.warning("sso: refused a sign-in whose ID token does not carry this browser's nonce")
            raise refused(request, "The sign-in could not be verified (nonce). Nothing was signed in; try again.")
        user = sociallogin.user if sociallogin.is_existing else None
        verdict = admission(claims, superuser=bool(user and user.is_superuser))
        if verdict.refusal:
            log.warning("sso: refused %s: %s", claims.get("preferred_username") or claims.get("sub"), verdict.refusal)
            if user is not None:
                members.person_roles_sync(user=user, roles=members.Roles())
                people.person_leave(user=user, reason=f"refused by the identity provider: {verdict.refusal}")
            raise refused(request, f"Single sign-on refused: {verdict.refusal}.")
        if user is not None and not user.is_active:
            raise refused(request, "Your Airlock account is deactivated; ask an administrator.")
        # Kept on the login for save_user (a new person) or applied now (a known one).
        sociallogin.airlock_roles = verdict.roles  # type: ignore[attr-defined]
        if user is not None:
            self.populate_user(request, sociallogin, sociallogin.provider.extract_common_fields(sociallogin.account.extra_data))
            user.username = user.username or sociallogin.account.uid
            user.save()
            members.person_roles_sync(user=user, roles=verdict.roles)

    def populate_user(self, request: HttpRequest, sociallogin: SocialLogin, data: dict[str, Any]) -> Any:
        user = sociallogin.user
        keep = user.username if user is not None and user.pk else None
        user = super().populate_user(request, sociallogin, data)
        if keep:
            user.username = keep  # a known person keeps their Airlock username
        return user

    def save_user(self, request: HttpRequest, sociallogin: SocialLogin, form: Any = None) -> Any:
        user = super().save_user(request, sociallogin, form)
        members.person_roles_sync(user=user, roles=getattr(sociallogin, "airlock_roles", members.Roles()))
        return user

