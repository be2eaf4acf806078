from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from agents import access


def roles(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {
        "can_launch": access.can_launch(user),
        "can_decide": access.can_decide(user),
        "can_cancel": access.can_cancel(user),
    }
