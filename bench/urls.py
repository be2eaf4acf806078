"""The project's URLs plus one minimal logged-in page: the yardstick for page costs.

Used only by `make bench` (through override_settings); the app itself never routes here.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.template import engines
from django.urls import path

from config.urls import urlpatterns as project

MINIMAL = engines["django"].from_string('{% extends "base.html" %}{% block content %}<p>ok</p>{% endblock %}')


@login_required
def minimal(request: HttpRequest) -> HttpResponse:
    # The base layout with its nav, session and auth: what every page pays before its own work.
    return HttpResponse(MINIMAL.render({}, request))


urlpatterns = [*project, path("bench/minimal/", minimal)]
