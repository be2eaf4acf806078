"""The project's URLs plus one view that fails, to see what a 500 shows and logs."""

from __future__ import annotations

import os

from django.http import HttpRequest, HttpResponse
from django.urls import path

from config.urls import urlpatterns as project


def boom(request: HttpRequest) -> HttpResponse:
    key = os.environ.get("OPENAI_API_KEY", "")  # a secret in a local, as a real bug's frame would hold
    raise RuntimeError(f"the provider client crashed (key of {len(key)} characters)")


urlpatterns = [path("boom/", boom), *project]
