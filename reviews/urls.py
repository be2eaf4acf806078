from __future__ import annotations

from django.urls import path

from agents.engine.decisions import DECISIONS

from . import links, views

app_name = "reviews"

# One endpoint per answer, so each button posts to exactly what it says.

urlpatterns = [
    path("", views.queue, name="queue"),
    path("list/", views.queue_list, name="list"),
    path("badge/", views.badge, name="badge"),
    path("stats/", views.stats, name="stats"),
    path("<int:approval_id>/", views.approval, name="approval"),
    # An emailed decision link: GET confirms (changes nothing), POST decides.
    path("links/<str:token>/", links.link, name="link"),
    *[path(f"<int:approval_id>/{d}/", views.decide, {"decision": d}, name=d) for d in DECISIONS],
]
