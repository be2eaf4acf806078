"""A real OpenID Provider on loopback for the single sign-on tests, built on Authlib's
authorization server: the authorization code grant with its OpenID Connect extension
(ID tokens signed RS256 with a key made at start, nonce required) and PKCE (S256
required). Served by wsgiref on 127.0.0.1 in a thread; it stops with its fixture.

Endpoints: /.well-known/openid-configuration, /jwks, /authorize (GET: the provider's own
sign-in form; POST: check the password, redirect back with a code), /token.

Tests make it misbehave on purpose, one knob each: `sign_with_foreign_key` (an ID token
whose signature no published key checks), `audience` (a token for another client),
`nonce_override` (a token that carries another request's nonce).
"""

from __future__ import annotations

import html
import json
import os
import secrets
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from authlib.oauth2 import AuthorizationServer, OAuth2Request
from authlib.oauth2.rfc6749 import grants
from authlib.oauth2.rfc6749.errors import OAuth2Error
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import UserInfo
from authlib.oidc.core.grants import OpenIDCode
from joserfc.jwk import RSAKey

# Authlib insists on https; this provider lives on loopback for the length of a test.
os.environ.setdefault("AUTHLIB_INSECURE_TRANSPORT", "1")

CLIENT_ID = "airlock-test"
CLIENT_SECRET = "s3cret-for-tests-only"


class Request(OAuth2Request):  # type: ignore[misc]
    """An OAuth 2 request as Authlib's grants read it: the payload, the query, the form."""

    def __init__(self, method: str, uri: str, *, query: str = "", body: str = "", headers: Any = None) -> None:
        super().__init__(method, uri, headers=headers or {})
        self._args = dict(parse_qsl(query))
        self._form = dict(parse_qsl(body))
        self.payload = BasicOAuth2Payload({**self._args, **self._form})

    @property
    def args(self) -> dict[str, str]:
        return self._args

    @property
    def form(self) -> dict[str, str]:
        return self._form


@dataclass
class Person:
    username: str
    password: str
    email: str
    groups: list[str] = field(default_factory=list)
    email_verified: bool = True
    name: str = ""

    @property
    def sub(self) -> str:
        return f"sub-{self.username}"


@dataclass
class Client:
    client_id: str
    client_secret: str
    redirect_uris: list[str]

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str:
        return self.redirect_uris[0]

    def get_allowed_scope(self, scope: str) -> str:
        return " ".join(s for s in (scope or "").split() if s in ("openid", "profile", "email"))

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret: str) -> bool:
        return secrets.compare_digest(client_secret, self.client_secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "authorization_code"


@dataclass
class Code:
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    username: str
    nonce: str | None
    code_challenge: str | None
    code_challenge_method: str | None

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope

    def get_nonce(self) -> str | None:
        return self.nonce

    def get_auth_time(self) -> None:
        return None

    def get_acr(self) -> None:
        return None

    def get_amr(self) -> None:
        return None


class OpenIDProvider:
    def __init__(self) -> None:
        self.key = RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256", "use": "sig"}, private=True)
        # Same kid, another key: a token signed with it names a published key it does not match.
        self.foreign_key = RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256", "use": "sig"}, private=True)
        self.people: dict[str, Person] = {}
        self.clients: dict[str, Client] = {}
        self.codes: dict[str, Code] = {}
        self.nonces: set[str] = set()
        self.tokens_issued = 0
        self.sign_with_foreign_key = False
        self.audience: str | None = None
        self.nonce_override: str | None = None
        self.issuer = ""
        self.server = self._authorization_server()

    # -- test setup ---------------------------------------------------------------

    def add_person(self, username: str, *, groups: list[str], email: str = "", **kw: Any) -> Person:
        person = Person(username, f"pw-{username}", email or f"{username}@example.com", list(groups), **kw)
        self.people[username] = person
        return person

    def register(self, redirect_uri: str) -> None:
        client = self.clients.setdefault(CLIENT_ID, Client(CLIENT_ID, CLIENT_SECRET, []))
        if redirect_uri not in client.redirect_uris:
            client.redirect_uris.append(redirect_uri)

    # -- Authlib's server -----------------------------------------------------------

    def _authorization_server(self) -> AuthorizationServer:
        op = self

        class Server(AuthorizationServer):  # type: ignore[misc]
            def query_client(self, client_id: str) -> Client | None:
                return op.clients.get(client_id)

            def save_token(self, token: dict[str, Any], request: Any) -> None:
                op.tokens_issued += 1

            def create_oauth2_request(self, request: Any) -> Any:
                return request

            def create_json_request(self, request: Any) -> Any:
                return request

            def handle_response(self, status: int, body: Any, headers: Any) -> tuple[int, Any, Any]:
                return status, body, headers

            def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
                pass

        class CodeGrant(grants.AuthorizationCodeGrant):  # type: ignore[misc]
            TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]

            def save_authorization_code(self, code: str, request: Any) -> None:
                data = request.payload.data
                if data.get("nonce"):
                    op.nonces.add(data["nonce"])
                op.codes[code] = Code(
                    code, request.client.client_id, data.get("redirect_uri", ""), data.get("scope", ""),
                    request.user.username, data.get("nonce"), data.get("code_challenge"),
                    data.get("code_challenge_method"),
                )

            def query_authorization_code(self, code: str, client: Client) -> Code | None:
                found = op.codes.get(code)
                return found if found is not None and found.client_id == client.client_id else None

            def delete_authorization_code(self, authorization_code: Code) -> None:
                op.codes.pop(authorization_code.code, None)

            def authenticate_user(self, authorization_code: Code) -> Person:
                return op.people[authorization_code.username]

        class IdToken(OpenIDCode):  # type: ignore[misc]
            def exists_nonce(self, nonce: str, request: Any) -> bool:
                # A nonce a code was already issued for: the request is a replay.
                return nonce in op.nonces

            def resolve_client_private_key(self, client: Client) -> RSAKey:
                return op.foreign_key if op.sign_with_foreign_key else op.key

            def get_client_algorithm(self, client: Client) -> str:
                return "RS256"

            def get_encode_header(self, client: Client) -> dict[str, str]:
                return {"alg": "RS256", "kid": "k1"}

            def get_client_claims(self, client: Client) -> dict[str, Any]:
                return {"iss": op.issuer, "aud": [op.audience or client.client_id]}

            def generate_user_info(self, user: Person, scope: str) -> UserInfo:
                return UserInfo(
                    sub=user.sub, preferred_username=user.username, name=user.name or user.username.title(),
                    email=user.email, email_verified=user.email_verified, groups=user.groups,
                )

            def encode_id_token(self, token: Any, request: Any) -> str:
                if op.nonce_override is not None and request.authorization_code is not None:
                    request.authorization_code.nonce = op.nonce_override
                return str(super().encode_id_token(token, request))

        server = Server(scopes_supported=["openid", "profile", "email"])
        server.register_token_generator(
            "default", BearerTokenGenerator(lambda **_: secrets.token_urlsafe(32), expires_generator=lambda *_: 300)
        )
        server.register_grant(CodeGrant, [IdToken(require_nonce=True), CodeChallenge(required=True)])
        return server

    # -- the WSGI app -------------------------------------------------------------

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_post", "client_secret_basic"],
            "scopes_supported": ["openid", "profile", "email"],
        }

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "")
        query = environ.get("QUERY_STRING", "")
        body = b""
        if method == "POST":
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items() if k.startswith("HTTP_")}
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        try:
            status, out, extra = self.route(method, path, query, body.decode(), headers)
        except Exception:  # a test provider says what broke instead of hanging up
            status, out, extra = 500, f"provider error: {traceback.format_exc()}", [("Content-Type", "text/plain")]
        reason = {200: "OK", 302: "Found", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}.get(status, "Error")
        start_response(f"{status} {reason}", list(extra))
        return [out.encode() if isinstance(out, str) else out]

    def route(self, method: str, path: str, query: str, body: str, headers: dict[str, str]) -> tuple[int, Any, Any]:
        if path == "/.well-known/openid-configuration":
            return 200, json.dumps(self.discovery()), [("Content-Type", "application/json")]
        if path == "/jwks":
            return 200, json.dumps({"keys": [self.key.as_dict(private=False)]}), [("Content-Type", "application/json")]
        if path == "/authorize":
            return self.authorize(method, query, body)
        if path == "/token" and method == "POST":
            request = Request("POST", f"{self.issuer}/token", body=body, headers=headers)
            status, out, extra = self.server.create_token_response(request)
            return status, json.dumps(out) if isinstance(out, dict) else out, extra
        return 404, "not found", [("Content-Type", "text/plain")]

    def authorize(self, method: str, query: str, body: str) -> tuple[int, Any, Any]:
        # The authorization request is the query; the form carries only the password.
        request = Request(method, f"{self.issuer}/authorize?{query}", query=query)
        try:
            grant = self.server.get_consent_grant(request)
        except OAuth2Error as exc:
            return 400, f"authorization request refused: {exc.error}", [("Content-Type", "text/plain")]
        error = ""
        if method == "POST":
            form = dict(parse_qsl(body))
            person = self.people.get(form.get("username", ""))
            if person is not None and secrets.compare_digest(form.get("password", ""), person.password):
                return self.server.create_authorization_response(request, grant_user=person, grant=grant)
            error = "<p role='alert'>Wrong username or password.</p>"
        page = (
            "<!doctype html><title>Test identity provider</title><h1>Test identity provider</h1>"
            f"{error}<form method='post' action='/authorize?{html.escape(query)}'>"
            "<label>Username <input name='username'></label>"
            "<label>Password <input name='password' type='password'></label>"
            "<button type='submit'>Sign in</button></form>"
        )
        return 200, page, [("Content-Type", "text/html; charset=utf-8")]

    # -- driving the flow without a browser ------------------------------------------

    def authorize_as(self, authorize_url: str, username: str, http: Any) -> str:
        """Sign in at the provider as `username` (its form, with httpx `http`); returns
        the redirect back to Airlock (the callback URL with code and state)."""
        response = http.get(authorize_url)
        assert response.status_code == 200, response.text
        person = self.people[username]
        response = http.post(
            authorize_url, content=urlencode({"username": username, "password": person.password}),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert response.status_code == 302, response.text
        return str(response.headers["Location"])


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def oidc_provider() -> Iterator[OpenIDProvider]:
    """A running provider on 127.0.0.1 (a free port), stopped after the test."""
    op = OpenIDProvider()
    server = make_server("127.0.0.1", 0, op, handler_class=_Quiet)
    op.issuer = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield op
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def sso(oidc_provider: OpenIDProvider, settings: Any) -> OpenIDProvider:
    """Airlock configured for the running provider, as the environment would
    (AIRLOCK_OIDC_*), with the test client's redirect URI registered."""
    settings.AIRLOCK_OIDC_ISSUER = oidc_provider.issuer
    settings.AIRLOCK_OIDC_CLIENT_ID = CLIENT_ID
    settings.AIRLOCK_OIDC_CLIENT_SECRET = CLIENT_SECRET
    settings.AIRLOCK_OIDC_NAME = "Sign in with Example ID"
    oidc_provider.register("http://testserver/accounts/oidc/sso/login/callback/")
    return oidc_provider


def start_sign_in(client: Any, next_url: str = "") -> str:
    """Press the login page's SSO button with the Django test client (CSRF enforced);
    returns the provider's authorize URL Airlock redirected to."""
    page = client.get("/login/")
    assert page.status_code == 200
    data = {"csrfmiddlewaretoken": client.cookies["csrftoken"].value, **({"next": next_url} if next_url else {})}
    response = client.post("/accounts/oidc/sso/login/", data)
    assert response.status_code == 302, response.content[:500]
    return str(response["Location"])


def sign_in(client: Any, op: OpenIDProvider, username: str, next_url: str = "") -> Any:
    """The whole code flow: Airlock's button, the provider's form (httpx), and the
    callback back into Airlock. Returns Airlock's answer to the callback."""
    import httpx

    authorize = start_sign_in(client, next_url)
    with httpx.Client(follow_redirects=False, timeout=10) as http:
        back = op.authorize_as(authorize, username, http)
    assert back.startswith("http://testserver/"), back
    return client.get(back.removeprefix("http://testserver"))
