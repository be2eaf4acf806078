"""The built-in demo web site, for people: the same pages `http_get` returns for the
reserved host `demo.airlock.internal` (see agents/demo.py for why they are in-process)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents import demo


@require_GET
@login_required
def demo_site(request: HttpRequest, page: str = "") -> HttpResponse:
    content = demo.SITE.get(page)
    if content is None:
        raise Http404("no such demo page")
    context = {
        "page": content,
        "url": f"https://{demo.DEMO_HOST}/{page}",
        "pages": [(slug, p["title"]) for slug, p in demo.SITE.items()],
        "planted": demo.PLANTED_INSTRUCTION,
    }
    return render(request, "agents/demo_site.html", context)
