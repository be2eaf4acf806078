"""What the HTTP model clients share: one POST with timeouts, bounded retries and
errors that never carry an API key.

Retries follow the official SDKs (openai-python, anthropic-sdk-python): a 408, 409,
429, a 5xx (Anthropic's 529 "overloaded" included), a timeout or a dropped connection
is tried again up to `retries` times, sleeping `backoff * 2**attempt`, or what the
server asks (`retry-after-ms`, then `Retry-After`), never longer than `max_sleep`.
The server's `x-should-retry: true|false` overrides the status, and a 429 whose error
code is `insufficient_quota` (no credit left) is final: waiting does not refill it.
A model call has no side effects outside the provider, so repeating it is safe; it
may cost tokens, which is why the number of tries is bounded.
"""

from __future__ import annotations

import email.utils
import functools
import json
import re
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from django.conf import settings

from agents.engine.protocols import ModelError
from agents.lib import jsonsafe

RETRY_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))
# 429 codes that no wait cures (OpenAI: the account has no credit left).
FINAL_429_CODES = frozenset({"insufficient_quota"})
# Anything that looks like a provider key, in case a server echoes a mangled one back.
KEY_PATTERN = re.compile(r"\b(sk-[A-Za-z0-9_\-*.]{6,}|sk-ant-[A-Za-z0-9_\-*.]{6,})")
ERROR_TEXT_MAX = 500
RESPONSE_MAX_CHARS = 20_000_000  # a model's reply as JSON text; far above any max_tokens
T = TypeVar("T")


@dataclass
class HttpOptions:
    # Non-streaming: the whole reply arrives at once, so the timeout must cover the
    # generation of max_tokens (see config/settings.py AIRLOCK_LLM_TIMEOUT).
    timeout: float = 600.0
    retries: int = 3
    backoff: float = 1.0
    max_sleep: float = 30.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    @classmethod
    def from_settings(cls) -> HttpOptions:
        return cls(
            timeout=settings.AIRLOCK_LLM_TIMEOUT,
            retries=settings.AIRLOCK_LLM_RETRIES,
            backoff=settings.AIRLOCK_LLM_BACKOFF,
            max_sleep=settings.AIRLOCK_LLM_MAX_SLEEP,
        )


def scrub(text: str, secrets: Iterable[str]) -> str:
    """The text with every secret (and anything shaped like a key) masked, shortened."""
    for secret in secrets:
        if not secret:
            continue
        # Also the escaped spellings a repr() or a JSON dump of the secret would use.
        for form in {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1]}:
            text = text.replace(form, "[redacted]")
    text = KEY_PATTERN.sub("[redacted]", text)
    if len(text) > ERROR_TEXT_MAX:
        text = text[:ERROR_TEXT_MAX] + "..."
    return text


def retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms` (milliseconds, sent by
    OpenAI and Anthropic), else `Retry-After` (seconds or an HTTP date)."""
    raw_ms = response.headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = response.headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def should_retry(response: httpx.Response, error_body: Any) -> bool:
    """Whether an error answer is worth sending again (the SDKs' rule, plus quota)."""
    header = response.headers.get("x-should-retry", "").strip().lower()
    if header in ("true", "false"):
        return header == "true"
    if response.status_code == 429 and error_code(error_body) in FINAL_429_CODES:
        return False
    return response.status_code in RETRY_STATUSES


def error_code(body: Any) -> str:
    """The machine-readable code of a provider's JSON error (`error.code` or `error.type`)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return ""
    return str(err.get("code") or err.get("type") or "")


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verification context, built once per process: building it reads
    the whole CA bundle (about 30 ms of CPU), which per model call was the largest
    cost of a threaded worker waiting on many runs. A context is safe to
    share between threads."""
    return httpx.create_ssl_context()


class Failure(Exception):
    """An HTTP answer that is not a success: status and the provider's error body."""

    def __init__(self, status: int, body: Any, text: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body
        self.text = text


def post_json(
    url: str,
    *,
    headers: dict[str, str],
    body: dict[str, Any],
    options: HttpOptions,
    provider: str,
    secrets: Iterable[str],
) -> dict[str, Any]:
    """POST `body`, return the decoded JSON object of a 2xx answer.

    Raises `Failure` for a final non-retryable (or retried-out) HTTP error, so the
    client can read the provider's error shape, and `ModelError` for transport
    failures, timeouts and bodies that are not a JSON object.
    """
    secrets = [s for s in secrets if s]
    attempts = options.retries + 1
    last: str = ""
    with httpx.Client(timeout=options.timeout, follow_redirects=False, verify=tls_context()) as client:
        for attempt in range(attempts):
            wait: float | None = None
            try:
                response = client.post(url, headers=headers, json=body)
            except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                # A bad base URL: trying again cannot help.
                raise ModelError(scrub(f"{provider}: cannot send the request: {exc}", secrets)) from None
            except (httpx.LocalProtocolError, UnicodeError) as exc:
                # A header value HTTP cannot carry, usually the key: its text would quote it.
                raise ModelError(
                    f"{provider}: cannot send the request: invalid header value ({type(exc).__name__}); check the API key"
                ) from None
            except httpx.TimeoutException as exc:
                last = f"timed out after {options.timeout:g} s ({type(exc).__name__})"
            except httpx.TransportError as exc:
                last = f"connection failed ({type(exc).__name__}: {exc})"
            else:
                if response.is_success:
                    try:
                        # NaN or 1e400 in a tool call's arguments could not be stored.
                        data = jsonsafe.parse(response.content, max_chars=RESPONSE_MAX_CHARS)
                    except jsonsafe.JsonError as exc:
                        if exc.problem != "invalid":
                            raise ModelError(f"{provider}: malformed response ({exc.message})") from None
                        raise ModelError(
                            f"{provider}: malformed response (not JSON): {scrub(response.text, secrets)!r}"
                        ) from None
                    if not isinstance(data, dict):
                        raise ModelError(f"{provider}: malformed response (not a JSON object)")
                    return data
                try:
                    error_body: Any = response.json()
                except ValueError:
                    error_body = None
                failure = Failure(response.status_code, error_body, scrub(response.text, secrets))
                if not should_retry(response, error_body):
                    raise failure
                last = f"HTTP {response.status_code}: {failure.text}"
                wait = retry_after(response)
            if attempt + 1 >= attempts:
                break
            delay = options.backoff * (2**attempt) if wait is None else wait
            options.sleep(min(delay, options.max_sleep))
    raise ModelError(scrub(f"{provider}: gave up after {attempts} attempt(s): {last}", secrets))


def exchange(
    url: str,
    *,
    headers: dict[str, str],
    body: dict[str, Any],
    options: HttpOptions,
    provider: str,
    secret: str,
    describe: Callable[[Failure], str],
    parse: Callable[[Any, int], T],
    turn: int,
) -> T:
    """POST a request and parse the reply into a Decision; no error carries the key."""
    try:
        data = post_json(url, headers=headers, body=body, options=options, provider=provider, secrets=[secret])
    except Failure as exc:
        raise ModelError(scrub(describe(exc), [secret])) from None
    try:
        return parse(data, turn)
    except ModelError as exc:
        # A 200 body can carry an error message that repeats the key.
        raise ModelError(scrub(str(exc), [secret])) from None


def error_message(body: Any) -> str:
    """The human part of a provider's JSON error (`{"error": {"message": ...}}`)."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err.get("type") or json.dumps(err))
        if isinstance(err, str):
            return err
    return ""
