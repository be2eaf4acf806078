"""The API tests' fixtures: the personas by name, and a JSON client per persona."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User

from agents.tokens import token_create
from tests.helpers import Api


@pytest.fixture
def users(lena: User, leo: User, otto: User, rita: User, rob: User, nina: User, root: User) -> dict[str, User]:
    """The personas by name, for tables of who may do what."""
    return {u.username: u for u in (lena, leo, otto, rita, rob, nina, root)}


@pytest.fixture
def api(users: dict[str, User]) -> Callable[[str | None], Api]:
    """api("lena") -> a client carrying a fresh token of lena's; api(None) -> anonymous."""

    def _api(name: str | None) -> Api:
        if name is None:
            return Api(None)
        _token, raw = token_create(user=users[name])
        return Api(raw)

    return _api
