"""The review queue's client: a CSRF-enforcing browser stand-in per persona."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User

from tests.helpers import CsrfClient


@pytest.fixture
def as_user() -> Callable[[User], CsrfClient]:
    def _as(user: User) -> CsrfClient:
        client = CsrfClient()
        client.force_login(user)
        return client

    return _as
