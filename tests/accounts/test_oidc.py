"""Single sign-on against a real OpenID Provider on loopback (tests/accounts/provider.py),
driven with Django's test client (CSRF enforced) and httpx: the code flow, each check
that must refuse a forged or replayed answer, roles from the groups claim, the domain
restriction, and password login turned off."""

from __future__ import annotations

import httpx
import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user
from django.contrib.auth.models import User
from django.test import Client

from agents.actions.tokens import token_create
from agents.models import ApiToken, Membership, Project
from tests.accounts.provider import sign_in, start_sign_in
from tests.helpers import PASSWORD, Api

pytestmark = pytest.mark.django_db


def logged_in_as(client: Client) -> str | None:
    user = get_user(client)
    return user.get_username() if user.is_authenticated else None


def roles(user: User) -> tuple[set[tuple[str, str]], set[str]]:
    memberships = set(Membership.objects.filter(user=user).values_list("project__slug", "role"))
    return memberships, set(user.groups.values_list("name", flat=True))


@pytest.fixture
def projects(defaults: None) -> dict[str, Project]:
    return {
        "support": Project.objects.create(slug="support", name="Support"),
        "finance": Project.objects.create(slug="finance", name="Finance"),
    }


def test_code_flow_signs_a_new_person_in_with_roles_from_the_claim(sso, projects) -> None:
    sso.add_person("ada", groups=["support:reviewer", "*:operator"], name="Ada Lovelace")
    client = Client(enforce_csrf_checks=True)
    response = sign_in(client, sso, "ada")

    assert response.status_code == 302 and response["Location"] == "/", response.content[:800]
    assert logged_in_as(client) == "ada"
    ada = User.objects.get(username="ada")
    assert (ada.email, ada.first_name, ada.last_name) == ("ada@example.com", "Ada", "Lovelace")
    assert not ada.has_usable_password()
    assert SocialAccount.objects.get(user=ada).uid == "sub-ada"
    assert roles(ada) == ({("support", "reviewer")}, {"operator"})
    assert client.get("/").status_code == 200


def test_after_sign_in_only_a_local_next_is_followed(sso, projects) -> None:
    sso.add_person("ada", groups=["*:reviewer"])
    assert sign_in(Client(enforce_csrf_checks=True), sso, "ada", "/reviews/")["Location"] == "/reviews/"
    assert sign_in(Client(enforce_csrf_checks=True), sso, "ada", "https://evil.example/")["Location"] == "/"


def test_the_authorization_request_uses_pkce_a_nonce_and_a_state(sso, projects) -> None:
    authorize = httpx.URL(start_sign_in(Client(enforce_csrf_checks=True)))
    params = dict(authorize.params)
    assert params["code_challenge_method"] == "S256" and len(params["code_challenge"]) >= 43
    assert len(params["nonce"]) >= 24 and len(params["state"]) >= 8
    assert params["redirect_uri"] == "http://testserver/accounts/oidc/sso/login/callback/"


def _refused_without_a_login(client: Client, response) -> None:
    assert response.status_code in (401, 403), response.status_code
    assert logged_in_as(client) is None
    assert not User.objects.filter(username="ada").exists()


def test_an_id_token_signed_with_another_key_is_refused(sso, projects) -> None:
    sso.add_person("ada", groups=["*:reviewer"])
    sso.sign_with_foreign_key = True
    client = Client(enforce_csrf_checks=True)
    response = sign_in(client, sso, "ada")
    _refused_without_a_login(client, response)
    assert "could not be verified" in response.content.decode()


def test_an_id_token_for_another_client_is_refused(sso, projects) -> None:
    sso.add_person("ada", groups=["*:reviewer"])
    sso.audience = "someone-else"
    client = Client(enforce_csrf_checks=True)
    _refused_without_a_login(client, sign_in(client, sso, "ada"))


def test_an_id_token_with_another_requests_nonce_is_refused(sso, projects) -> None:
    sso.add_person("ada", groups=["*:reviewer"])
    sso.nonce_override = "a-nonce-from-another-sign-in"
    client = Client(enforce_csrf_checks=True)
    response = sign_in(client, sso, "ada")
    _refused_without_a_login(client, response)
    assert "nonce" in response.content.decode()


def test_a_replayed_state_is_refused(sso, projects) -> None:
    """A callback is good once, in the browser that started it: the same answer again
    (a replay), or in another browser (a login CSRF), signs nobody in."""
    sso.add_person("ada", groups=["*:reviewer"])
    victim, attacker = Client(enforce_csrf_checks=True), Client(enforce_csrf_checks=True)
    authorize = start_sign_in(attacker)
    with httpx.Client(follow_redirects=False, timeout=10) as http:
        back = sso.authorize_as(authorize, "ada", http).removeprefix("http://testserver")
    victim.get("/login/")
    assert victim.get(back).status_code == 401
    assert logged_in_as(victim) is None

    assert attacker.get(back).status_code == 302
    assert logged_in_as(attacker) == "ada"
    attacker.logout()
    assert attacker.get(back).status_code == 401
    assert logged_in_as(attacker) is None


def test_a_second_sign_in_with_fewer_groups_removes_roles(sso, projects, caplog) -> None:
    ada = sso.add_person("ada", groups=["support:reviewer", "finance:launcher", "*:operator", "*:admin"])
    sign_in(Client(enforce_csrf_checks=True), sso, "ada")
    user = User.objects.get(username="ada")
    everywhere = {(slug, "admin") for slug in ("default", "support", "finance")}
    assert roles(user) == ({("support", "reviewer"), ("finance", "launcher"), *everywhere}, {"operator"})

    ada.groups = ["finance:launcher", "*:reviewer", "marketing:reviewer", "support:owner"]
    sign_in(Client(enforce_csrf_checks=True), sso, "ada")
    assert roles(user) == ({("finance", "launcher")}, {"reviewer"})
    ignored = [r.getMessage() for r in caplog.records if "ignored group" in r.getMessage()]
    assert any("'marketing:reviewer'" in m for m in ignored) and any("'support:owner'" in m for m in ignored)
    assert User.objects.filter(username="ada").count() == 1


def test_the_admin_role_from_the_claim_makes_staff_and_leaving_it_takes_staff_away(sso, projects) -> None:
    """The probe: `support:admin` from the identity provider gave the membership but not
    staff status, so the admin site stayed closed; add_member does make staff."""
    ada = sso.add_person("ada", groups=["support:admin"])
    client = Client(enforce_csrf_checks=True)
    sign_in(client, sso, "ada")
    user = User.objects.get(username="ada")
    assert user.is_staff
    assert client.get("/admin/agents/agentprofile/").status_code == 200  # the admin site lets her in
    ada.groups = ["support:reviewer"]
    sign_in(Client(enforce_csrf_checks=True), sso, "ada")
    user.refresh_from_db()
    assert roles(user) == ({("support", "reviewer")}, set()) and not user.is_staff
    # A superuser keeps staff whatever the claim says.
    boss = sso.add_person("boss", groups=["*:admin"])
    sign_in(Client(enforce_csrf_checks=True), sso, "boss")
    User.objects.filter(username="boss").update(is_superuser=True)
    boss.groups = ["support:reviewer"]
    sign_in(Client(enforce_csrf_checks=True), sso, "boss")
    assert User.objects.get(username="boss").is_staff


def test_groups_made_by_an_administrator_are_left_alone(sso, projects) -> None:
    from django.contrib.auth.models import Group

    sso.add_person("ada", groups=["*:reviewer"])
    sign_in(Client(enforce_csrf_checks=True), sso, "ada")
    user = User.objects.get(username="ada")
    user.groups.add(Group.objects.create(name="auditors"))
    sign_in(Client(enforce_csrf_checks=True), sso, "ada")
    assert roles(user)[1] == {"reviewer", "auditors"}


def test_sign_in_is_limited_to_the_listed_email_domains(sso, projects, settings) -> None:
    settings.AIRLOCK_OIDC_DOMAINS = ["example.com"]
    sso.add_person("ada", groups=["*:reviewer"], email="ada@example.com")
    sso.add_person("eve", groups=["*:reviewer"], email="eve@elsewhere.org")
    sso.add_person("uma", groups=["*:reviewer"], email="uma@example.com", email_verified=False)

    eve = Client(enforce_csrf_checks=True)
    response = sign_in(eve, sso, "eve")
    assert response.status_code == 403 and logged_in_as(eve) is None
    assert "limited to addresses at example.com" in response.content.decode()
    uma = Client(enforce_csrf_checks=True)
    response = sign_in(uma, sso, "uma")
    assert response.status_code == 403 and "not verified" in response.content.decode()
    assert not User.objects.filter(username__in=["eve", "uma"]).exists()

    ada = Client(enforce_csrf_checks=True)
    assert sign_in(ada, sso, "ada").status_code == 302
    assert logged_in_as(ada) == "ada"


def test_a_person_the_claim_gives_no_role_is_not_let_in(sso, projects) -> None:
    sso.add_person("ada", groups=["wiki:editor"])
    client = Client(enforce_csrf_checks=True)
    response = sign_in(client, sso, "ada")
    assert response.status_code == 403 and logged_in_as(client) is None
    assert "no role in Airlock" in response.content.decode()


def test_a_known_person_refused_at_their_next_sign_in_leaves(sso, projects) -> None:
    ada = sso.add_person("ada", groups=["support:reviewer", "*:reviewer"])
    first = Client(enforce_csrf_checks=True)
    sign_in(first, sso, "ada")
    user = User.objects.get(username="ada")
    token = token_create(user=user)[1]
    assert Api(token).get("/api/runs").status_code == 200

    ada.groups = []
    second = Client(enforce_csrf_checks=True)
    assert sign_in(second, sso, "ada").status_code == 403
    assert logged_in_as(first) is None and logged_in_as(second) is None
    assert first.get("/").status_code == 302
    assert roles(user) == (set(), set())
    assert not ApiToken.objects.filter(user=user, revoked_at__isnull=True).exists()
    assert Api(token).get("/api/runs").status_code == 401


def test_a_deactivated_person_cannot_sign_in(sso, projects) -> None:
    sso.add_person("ada", groups=["*:reviewer"])
    sign_in(Client(enforce_csrf_checks=True), sso, "ada")
    User.objects.filter(username="ada").update(is_active=False)
    client = Client(enforce_csrf_checks=True)
    response = sign_in(client, sso, "ada")
    assert response.status_code == 403 and "deactivated" in response.content.decode()
    assert logged_in_as(client) is None


def test_the_login_page_shows_the_button_only_when_an_issuer_is_set(client, settings, sso) -> None:
    page = client.get("/login/").content.decode()
    assert 'action="/accounts/oidc/sso/login/"' in page and "Sign in with Example ID" in page
    assert 'name="password"' in page and "Administrator sign-in" not in page

    settings.AIRLOCK_OIDC_ISSUER = ""
    page = client.get("/login/").content.decode()
    assert "/accounts/oidc/" not in page and 'name="password"' in page
    assert client.post("/accounts/oidc/sso/login/").status_code == 404
    assert client.get("/accounts/oidc/sso/login/callback/?code=x&state=y").status_code == 404


@pytest.mark.parametrize("path", ["/accounts/login/", "/accounts/signup/", "/accounts/password/reset/", "/accounts/email/"])
def test_allauths_local_account_pages_are_not_mounted(client, sso, path) -> None:
    assert client.get(path).status_code == 404


def test_a_get_of_the_sso_login_url_starts_nothing(client, sso) -> None:
    response = client.get("/accounts/oidc/sso/login/")
    assert response.status_code == 200 and "<form method=\"post\">" in response.content.decode()


# -- AIRLOCK_PASSWORD_LOGIN=0 ------------------------------------------------------------


@pytest.fixture
def password_off(sso, settings):
    settings.AIRLOCK_PASSWORD_LOGIN = False
    return sso


def _password_post(client: Client, username: str) -> object:
    client.get("/login/")
    return client.post(
        "/login/",
        {"username": username, "password": PASSWORD, "csrfmiddlewaretoken": client.cookies["csrftoken"].value},
    )


def test_with_password_login_off_the_page_shows_the_button_and_a_break_glass_disclosure(password_off) -> None:
    page = Client().get("/login/").content.decode()
    assert "Sign in with Example ID" in page
    assert '<details class="break-glass">' in page and "<summary>Administrator sign-in</summary>" in page
    # The password form is inside the disclosure, not beside the button.
    assert page.index('name="password"') > page.index("<details")


def test_with_password_login_off_a_non_superuser_password_is_refused(password_off, rita) -> None:
    client = Client(enforce_csrf_checks=True)
    response = _password_post(client, "rita")
    assert response.status_code == 200 and logged_in_as(client) is None
    page = response.content.decode()
    assert "Password sign-in is off for everyone but administrators" in page
    assert '<details class="break-glass" open>' in page


def test_with_password_login_off_the_superuser_still_signs_in(password_off, root) -> None:
    client = Client(enforce_csrf_checks=True)
    assert _password_post(client, "root").status_code == 302
    assert logged_in_as(client) == "root"


def test_with_password_login_off_api_tokens_still_work(password_off, rita) -> None:
    assert Api(token_create(user=rita)[1]).get("/api/runs").status_code == 200


def test_password_login_stays_as_it_was_without_an_issuer(client, rita) -> None:
    page = client.get("/login/").content.decode()
    assert "/accounts/oidc/" not in page and "<details" not in page
    fresh = Client(enforce_csrf_checks=True)
    assert _password_post(fresh, "rita").status_code == 302 and logged_in_as(fresh) == "rita"
