"""Login lockout by username and address (issues 25.2 and 34.4), at /login/ and /admin/login/.

Wrong passwords lock one username from one address, for AIRLOCK_LOGIN_COOLOFF_MINUTES:
never the address for everybody, never the username from everywhere, never for good.
The client address is REMOTE_ADDR unless that is one of AIRLOCK_TRUSTED_PROXIES.
Cool-offs are checked by moving the recorded attempt times back, not by waiting.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.test import Client

from tests.helpers import PASSWORD

pytestmark = pytest.mark.django_db

ATTACKER = "192.0.2.66"
HOME = "198.51.100.7"
PROXY = "10.0.0.5"
PAGES = ("/login/", "/admin/login/")


def fail(path: str, username: str, times: int, **extra: str) -> None:
    for _ in range(times):
        Client().post(path, {"username": username, "password": "not the password"}, **extra)


def log_in(path: str, username: str, **extra: str) -> tuple[int, Client, bytes]:
    client = Client()
    response = client.post(path, {"username": username, "password": PASSWORD, "next": "/"}, **extra)
    return response.status_code, client, response.content


def age_attempts(by: timedelta) -> None:
    """Pretend every recorded failure happened `by` earlier."""
    for attempt in AccessAttempt.objects.all():
        AccessAttempt.objects.filter(pk=attempt.pk).update(attempt_time=attempt.attempt_time - by)


@pytest.mark.parametrize("path", PAGES)
def test_a_flood_of_failures_under_other_usernames_locks_out_no_real_user(
    path: str, rita: User, root: User, settings
) -> None:
    for n in range(4 * settings.AXES_FAILURE_LIMIT):
        fail(path, f"made-up-{n}", 2, REMOTE_ADDR=ATTACKER)
    # From the very address of the flood: the reviewer at /login/, the admin at both.
    status, client, _ = log_in("/login/", "rita", REMOTE_ADDR=ATTACKER)
    assert status == 302 and client.session["_auth_user_id"] == str(rita.pk)
    for page in PAGES:
        status, client, _ = log_in(page, "root", REMOTE_ADDR=ATTACKER)
        assert status == 302 and client.session["_auth_user_id"] == str(root.pk)


@pytest.mark.parametrize("path", PAGES)
def test_failures_against_one_username_lock_that_username_from_that_address_only(
    path: str, rita: User, root: User, settings
) -> None:
    fail(path, "root", settings.AXES_FAILURE_LIMIT, REMOTE_ADDR=ATTACKER)
    # Locked at both login pages, even with the right password ...
    for page in PAGES:
        status, client, _ = log_in(page, "root", REMOTE_ADDR=ATTACKER)
        assert status == 429 and "_auth_user_id" not in client.session
    # ... but the same user from home, and another user from the attacker's address, get in.
    for page in PAGES:
        assert log_in(page, "root", REMOTE_ADDR=HOME)[0] == 302
    assert log_in("/login/", "rita", REMOTE_ADDR=ATTACKER)[0] == 302


def test_the_limit_counts_failures_of_one_username_from_one_address(rita: User, settings) -> None:
    fail("/login/", "rita", settings.AXES_FAILURE_LIMIT - 1, REMOTE_ADDR=ATTACKER)
    fail("/login/", "rita", settings.AXES_FAILURE_LIMIT - 1, REMOTE_ADDR=HOME)
    assert log_in("/login/", "rita", REMOTE_ADDR=ATTACKER)[0] == 302


@pytest.mark.parametrize("path", PAGES)
def test_a_lockout_lifts_by_itself_after_the_cool_off(path: str, root: User, settings) -> None:
    assert settings.AXES_COOLOFF_TIME == timedelta(minutes=15)  # AIRLOCK_LOGIN_COOLOFF_MINUTES' default
    fail(path, "root", settings.AXES_FAILURE_LIMIT, REMOTE_ADDR=ATTACKER)
    age_attempts(timedelta(minutes=14))
    assert log_in(path, "root", REMOTE_ADDR=ATTACKER)[0] == 429
    # Knocking while locked does not push the end of the lockout back (what the page promised).
    fail(path, "root", 3, REMOTE_ADDR=ATTACKER)
    age_attempts(timedelta(minutes=1, seconds=1))
    status, client, _ = log_in(path, "root", REMOTE_ADDR=ATTACKER)
    assert status == 302 and client.session["_auth_user_id"] == str(root.pk)


def test_expired_attempts_are_cleaned_up_so_a_flood_does_not_grow_the_table_forever(settings) -> None:
    for n in range(30):
        fail("/login/", f"made-up-{n}", 1, REMOTE_ADDR=ATTACKER)
    age_attempts(timedelta(minutes=15, seconds=1))
    fail("/login/", "one-more", 1, REMOTE_ADDR=ATTACKER)
    assert list(AccessAttempt.objects.values_list("username", flat=True)) == ["one-more"]


def test_a_fractional_cool_off_is_honoured(rita: User, settings) -> None:
    settings.AXES_COOLOFF_TIME = timedelta(minutes=0.5)
    fail("/login/", "rita", settings.AXES_FAILURE_LIMIT, REMOTE_ADDR=ATTACKER)
    assert log_in("/login/", "rita", REMOTE_ADDR=ATTACKER)[0] == 429
    age_attempts(timedelta(seconds=31))
    assert log_in("/login/", "rita", REMOTE_ADDR=ATTACKER)[0] == 302


@pytest.mark.parametrize("path", PAGES)
def test_the_lockout_page_says_what_is_locked_and_until_when(path: str, root: User, settings) -> None:
    fail(path, "root", settings.AXES_FAILURE_LIMIT, REMOTE_ADDR=ATTACKER)
    attempt = AccessAttempt.objects.get()
    response = Client().post(path, {"username": "root", "password": PASSWORD}, REMOTE_ADDR=ATTACKER)
    assert response.status_code == 429
    page = " ".join(re.sub(r"<[^>]+>", "", response.content.decode()).split())
    ends = attempt.attempt_time + timedelta(minutes=15)
    # Rounded up, to the minute.
    until = (
        ends if ends.second == ends.microsecond == 0 else (ends + timedelta(minutes=1)).replace(second=0, microsecond=0)
    )
    assert "“root”" in page and ATTACKER in page
    assert f"until {until:%H:%M} UTC" in page and "in 15 minutes" in page
    assert "Other usernames, and this username from other addresses, are not affected." in page
    assert "This account is locked" not in page
    assert 14 * 60 <= int(response.headers["Retry-After"]) <= 15 * 60


def test_the_lockout_page_shows_a_hostile_username_as_text(settings) -> None:
    name = '<img src=x onerror="alert(1)">'
    fail("/login/", name, settings.AXES_FAILURE_LIMIT, REMOTE_ADDR=ATTACKER)
    response = Client().post("/login/", {"username": name, "password": "x"}, REMOTE_ADDR=ATTACKER)
    assert response.status_code == 429
    assert b"<img" not in response.content and b"&lt;img src=x" in response.content


def test_x_forwarded_for_is_ignored_by_default(rita: User, settings) -> None:
    assert settings.AIRLOCK_TRUSTED_PROXIES == []
    # Rotating the header does not dodge the lockout, and does not frame another address.
    for n in range(settings.AXES_FAILURE_LIMIT):
        fail("/login/", "rita", 1, REMOTE_ADDR=ATTACKER, HTTP_X_FORWARDED_FOR=f"203.0.113.{n}")
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {ATTACKER}
    assert log_in("/login/", "rita", REMOTE_ADDR=ATTACKER, HTTP_X_FORWARDED_FOR=HOME)[0] == 429
    assert log_in("/login/", "rita", REMOTE_ADDR=HOME)[0] == 302


@pytest.mark.parametrize("path", PAGES)
def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(path: str, root: User, settings) -> None:
    settings.AIRLOCK_TRUSTED_PROXIES = ["10.0.0.0/8"]
    # Everyone comes through the proxy: the attacker's failures lock the attacker only.
    fail(path, "root", settings.AXES_FAILURE_LIMIT, REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=ATTACKER)
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == [ATTACKER]
    assert log_in(path, "root", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=ATTACKER)[0] == 429
    assert log_in(path, "root", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=HOME)[0] == 302
    # The proxy appends what it saw: a left-most entry the attacker typed changes nothing.
    spoofed = f"{HOME}, {ATTACKER}"
    assert log_in(path, "root", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=spoofed)[0] == 429
    # Chained trusted proxies are skipped, right to left, to the first address not trusted.
    assert log_in(path, "root", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=f"{ATTACKER}, 10.1.2.3")[0] == 429
    # The same header from a client that is not a trusted proxy is ignored.
    assert log_in(path, "root", REMOTE_ADDR=HOME, HTTP_X_FORWARDED_FOR=ATTACKER)[0] == 302


@pytest.mark.parametrize(
    "header", ["not-an-address", "", " , ", "999.1.1.1", "10.0.0.1, 10.0.0.2", f"{ATTACKER}\x00", "a" * 5000]
)
def test_a_garbled_forwarded_header_from_the_proxy_is_no_500(header: str, rita: User, settings) -> None:
    settings.AIRLOCK_TRUSTED_PROXIES = ["10.0.0.0/8"]
    fail("/login/", "rita", 1, REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=header)
    # Nothing to believe past the proxy: the failure is recorded against the proxy's hop.
    [address] = AccessAttempt.objects.values_list("ip_address", flat=True)
    assert address.startswith("10.0.0.")
    assert log_in("/login/", "rita", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=header)[0] == 302


@pytest.mark.parametrize("path", PAGES)
def test_an_overlong_username_is_a_wrong_login_not_a_500(path: str, settings) -> None:
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = Client().post(path, {"username": "u" * 300, "password": "x"}, REMOTE_ADDR=ATTACKER)
        assert response.status_code == 200 and b"correct username" in response.content
    assert AccessAttempt.objects.get().username == "u" * 255
    response = Client().post(path, {"username": "u" * 300, "password": "x"}, REMOTE_ADDR=ATTACKER)
    assert response.status_code == 429


def test_the_cool_off_setting_takes_fractions_and_refuses_nonsense(monkeypatch) -> None:
    from config.env import EnvError, env_positive_float

    monkeypatch.setenv("AIRLOCK_LOGIN_COOLOFF_MINUTES", "0.5")
    assert env_positive_float("AIRLOCK_LOGIN_COOLOFF_MINUTES", 15) == 0.5
    monkeypatch.delenv("AIRLOCK_LOGIN_COOLOFF_MINUTES")
    assert env_positive_float("AIRLOCK_LOGIN_COOLOFF_MINUTES", 15) == 15
    for bad in ("0", "-1", "nan", "inf", "fifteen"):
        monkeypatch.setenv("AIRLOCK_LOGIN_COOLOFF_MINUTES", bad)
        with pytest.raises(EnvError, match="AIRLOCK_LOGIN_COOLOFF_MINUTES"):
            env_positive_float("AIRLOCK_LOGIN_COOLOFF_MINUTES", 15)


def test_the_trusted_proxies_setting_takes_addresses_and_networks_and_refuses_nonsense(monkeypatch) -> None:
    from config.env import EnvError, env_cidrs

    monkeypatch.delenv("AIRLOCK_TRUSTED_PROXIES", raising=False)
    assert env_cidrs("AIRLOCK_TRUSTED_PROXIES") == []
    monkeypatch.setenv("AIRLOCK_TRUSTED_PROXIES", "127.0.0.1, 172.16.0.0/12,::1")
    assert env_cidrs("AIRLOCK_TRUSTED_PROXIES") == ["127.0.0.1/32", "172.16.0.0/12", "::1/128"]
    for bad in ("proxy.internal", "10.0.0.0/33", "*"):
        monkeypatch.setenv("AIRLOCK_TRUSTED_PROXIES", bad)
        with pytest.raises(EnvError, match="AIRLOCK_TRUSTED_PROXIES"):
            env_cidrs("AIRLOCK_TRUSTED_PROXIES")
