"""`POST /integrations/slack/interactions`: the Request URL of a Slack app's
interactivity. The work is in `agents.notifications.slack`."""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agents.notifications import slack

log = logging.getLogger("airlock.slack")


@csrf_exempt  # Slack signs the request instead (checked first, below)
@require_POST
def interactions(request: HttpRequest) -> HttpResponse:
    """1. Verify Slack's signature over the raw body: unsigned or stale is a 401.
    2. Parse the click; anything but an Airlock button is a 400.
    3. Record and decide it in a thread (a retried delivery, X-Slack-Retry-Num, finds
       the first one's row and decides nothing), waiting at most
       AIRLOCK_SLACK_ANSWER_SECONDS, then answer 200: Slack retries what is not answered
       in 3 s, and the outcome goes to the message's response_url either way. This
       thread touches no database, so a slow one cannot hold the answer up."""
    body = request.body
    if not slack.verified(body, request.headers):
        log.warning("slack interaction refused: bad or stale signature")
        return JsonResponse({"error": "invalid_signature", "detail": "not signed by the Slack app"}, status=401)
    try:
        click = slack.parse(body)
    except slack.BadInteraction as exc:
        return JsonResponse({"error": "invalid_interaction", "detail": str(exc)}, status=400)
    slack.handle(click, retry=request.headers.get("X-Slack-Retry-Num", "")).join(settings.AIRLOCK_SLACK_ANSWER_SECONDS)
    return HttpResponse(status=200)
