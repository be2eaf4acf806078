"""API tokens: created once, stored as sha256, revocable."""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Sequence
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from agents import access
from agents.lib import rows
from agents.models import ApiToken

PREFIX = "airlock_"


@functools.cache
def _active(beside: str = "", join: str = "") -> tuple[str, rows.Columns, rows.Columns]:
    """Every API request and gateway call reads its token, the token's user and the
    user's roles (which every access rule asks next): one statement, a row per role (or
    one of NULLs), written out (agents/lib/rows.py) so no queryset is built each time,
    and prepared on the server so it is not planned each time either. `beside` and
    `join`: more columns, after those, from the tables `join` adds (`token_read`)."""
    token, user = rows.Columns(ApiToken, "a"), rows.Columns(get_user_model(), "b0")
    sql = (
        f"SELECT {token.sql}, {user.sql}, r.kind, r.name, r.project_id{beside} FROM {ApiToken._meta.db_table} a"  # noqa: S608
        f" JOIN {get_user_model()._meta.db_table} b0 ON b0.id = a.user_id"
        f" LEFT JOIN ({access.roles_union()}) r ON r.user_id = b0.id{join}"
        " WHERE a.digest = %s AND a.revoked_at IS NULL AND b0.is_active = %s"
    )
    return sql, token, user


def digest(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "replace")).hexdigest()


def token_issue(token: ApiToken) -> str:
    """Give an unsaved token a new secret (its digest and prefix); returns the raw token,
    to show once and never store. The command and the admin both come here."""
    raw = PREFIX + secrets.token_urlsafe(32)
    token.digest = digest(raw)
    token.prefix = raw[: len(PREFIX) + 6]
    return raw


def token_create(*, user: Any, name: str = "", project: Any = None) -> tuple[ApiToken, str]:
    """A new token for `user` (limited to `project` when given): the row, and the raw
    token (shown once, never stored)."""
    token = ApiToken(user=user, name=name[:100], project=project)
    raw = token_issue(token)
    token.save()
    return token, raw


def token_user(raw: str) -> Any:
    """The active user a raw token belongs to, or None (unknown, revoked, inactive user).
    A token limited to a project marks the user object so (agents.access.token_project):
    every rule then answers for that project alone, whatever else the user holds."""
    return token_read(raw)[0]


def token_read(
    raw: str, beside: str = "", join: str = "", params: Sequence[Any] = ()
) -> tuple[Any, list[tuple[Any, ...]]]:
    """`token_user`'s user, and what the same statement read beside it: the `beside`
    columns of each row (one row per role), from the tables `join` adds (its
    placeholders take `params`; they are outer joins, so the token alone decides
    whether there is a row). (None, []) for no user: nothing beside it is read then."""
    if not raw or len(raw) > 200:
        return None, []
    sql, *columns = _active(beside, join)
    return _user_of(rows.fetch(sql, [*params, digest(raw), True], prepared=True), *columns)


def token_user_and(raw: str, read: tuple[str, Sequence[Any]]) -> tuple[Any, list[tuple[Any, ...]]]:
    """`token_user`'s user and the row of `read` (a fixed text and its values: a read of
    one row at most, by a unique key, that the token does not decide), read by the
    token's own statement: a request that reads the same thing whoever asks reads it
    beside the token, in one statement. (None, []) for no user: what `read` found is
    dropped then, unseen."""
    if not raw or len(raw) > 200:
        return None, []
    sql, params = read
    text, *columns = _active_and(sql, connection.vendor == "postgresql")
    user, beside = _user_of(rows.fetch(text, [*params, digest(raw), True], prepared=True), *columns)
    # One row per role, each with the same row of `read` after a "found" mark.
    return user, ([tuple(beside[0][1:])] if user is not None and beside[0][0] else [])


@functools.lru_cache(maxsize=16)
def _active_and(read: str, materialized: bool) -> tuple[str, rows.Columns, rows.Columns]:
    """`_active`'s statement with `read`'s row beside each of its rows. `read` runs once
    (on PostgreSQL a materialized CTE: a plan never runs it again for each role), and a
    token with no row there still has its row (the outer join), with `found_` NULL."""
    sql, token, user = _active(", x.*", " LEFT JOIN x ON TRUE")
    cte = "AS MATERIALIZED" if materialized else "AS"  # SQLite before 3.35 has no MATERIALIZED
    return f"WITH x {cte} (SELECT TRUE AS found_, * FROM ({read}) y) {sql}", token, user


def _user_of(
    found: list[tuple[Any, ...]], token_columns: rows.Columns, user_columns: rows.Columns
) -> tuple[Any, list[tuple[Any, ...]]]:
    """The user (with the token's project and the roles) of the rows `_active` read,
    and what each row read beside them."""
    if not found:
        return None, []
    roles_at = token_columns.width + user_columns.width
    # The token's own values, not a model instance: only three of them are used here.
    token = dict(zip(token_columns.attnames, token_columns.values(found[0]), strict=True))
    user = user_columns.instance(found[0][token_columns.width :])
    access.remember_roles(user, (row[roles_at : roles_at + 3] for row in found))
    now = timezone.now()
    if token["last_used_at"] is None or (now - token["last_used_at"]).total_seconds() > 60:
        # At most one write a minute per token: "last used" is for humans, not an audit log.
        ApiToken.objects.filter(pk=token["id"]).update(last_used_at=now)
    user._airlock_token_project = token["project_id"]
    return user, [row[roles_at + 3 :] for row in found]


def token_revoke(*, token_id: int | None = None, user: Any = None) -> int:
    """Revoke one token by id, or every active token of `user`; returns how many."""
    tokens = ApiToken.objects.all()
    if token_id is not None:
        tokens = tokens.filter(pk=token_id)
    if user is not None:
        tokens = tokens.filter(user=user)
    if token_id is None and user is None:
        raise ValueError("name a token or a user")
    return tokens.revoke()
