"""The Content-Security-Policy header, as django-csp sets it, with its text kept.

django-csp builds the header's text afresh for every response: it copies the policy's
directives and joins them again, about 30 us, which was 7% of a token's run read
(docs/performance.md, "The hot path"). Almost every response takes the policy as the
settings give it: no nonce asked for, no per-response change, no report-only policy,
no excluded prefix. Those get the same text, built once for the settings object
(a test's `override_settings` makes a new one, so a changed policy is built again);
every other response goes through django-csp's own `process_response`.
"""

from __future__ import annotations

import http.client
from typing import Any

from csp.constants import HEADER
from csp.middleware import CheckableLazyObject
from csp.middleware import CSPMiddleware as LibraryCSPMiddleware
from csp.utils import build_policy
from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase

# What a view or decorator sets on a response to change its policy (django-csp's names).
_PER_RESPONSE = ("_csp_config", "_csp_update", "_csp_replace")
# Error pages django-csp leaves without the header while DEBUG is on.
_DEBUG_EXEMPT = (http.client.INTERNAL_SERVER_ERROR, http.client.NOT_FOUND)


class CSPMiddleware(LibraryCSPMiddleware):
    _kept: tuple[Any, str] | None = None

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        policy = getattr(settings, "CONTENT_SECURITY_POLICY", None)
        if not self._plain(request, response, policy):
            return super().process_response(request, response)
        kept = self._kept
        if kept is None or kept[0] is not policy:
            kept = self._kept = (policy, build_policy())
        if kept[1]:
            response[HEADER] = kept[1]
        # As django-csp does once the header is written: a nonce asked for later fails loudly.
        request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)  # type: ignore[attr-defined]
        return response

    @staticmethod
    def _plain(request: HttpRequest, response: HttpResponseBase, policy: Any) -> bool:
        """Whether django-csp would set exactly the settings' policy, and nothing else."""
        return (
            isinstance(policy, dict)
            and not policy.get("EXCLUDE_URL_PREFIXES")
            and not getattr(settings, "CONTENT_SECURITY_POLICY_REPORT_ONLY", None)
            and getattr(request, "_csp_nonce", None) is None
            and all(getattr(response, name, None) is None for name in _PER_RESPONSE)
            and not getattr(response, "_csp_exempt", False)
            and HEADER not in response
            and not (settings.DEBUG and response.status_code in _DEBUG_EXEMPT)
        )
