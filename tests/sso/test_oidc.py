"""Single sign-on against a real OpenID Provider on loopback (tests/sso/provider.py),
driven with Django's test client (CSRF enforced) and httpx: the code flow, and each
check that must refuse a forged or replayed answer."""

from __future__ import annotations

import httpx
import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth.models import User
from django.test import Client

from agents.models import Membership, Project
from tests.sso.provider import start_sign_in, sign_in

pytestmark = pytest.mark.django_db


def logged_in_as(client: Client) -> str | None:
    from django.contrib.auth import get_user

    user = get_user(client)
    return user.get_username() if user.is_authenticated else None


def test_code_flow_signs_a_new_person_in_with_roles_from_the_claim(sso, defaults) -> None:
    support = Project.objects.create(slug="support", name="Support")
    sso.add_person("ada", groups=["support:reviewer", "*:operator"], name="Ada Lovelace")
    client = Client(enforce_csrf_checks=True)
    response = sign_in(client, sso, "ada")
    assert response.status_code == 302 and response["Location"] == "/", response.content[:800]
    assert logged_in_as(client) == "ada"
    ada = User.objects.get(username="ada")
    assert (ada.email, ada.first_name, ada.last_name) == ("ada@example.com", "Ada", "Lovelace")
    assert not ada.has_usable_password()
    assert SocialAccount.objects.get(user=ada).uid == "sub-ada"
    assert set(Membership.objects.filter(user=ada).values_list("project__slug", "role")) == {("support", "reviewer")}
    assert list(ada.groups.values_list("name", flat=True)) == ["operator"]
    assert client.get("/").status_code == 200
    assert support.pk
