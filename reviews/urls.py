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
    # A group card's answer: approve or reject the checked calls, each on its own.
    path("decisions/", views.decide_batch, name="decisions"),
    path("stats/", views.stats, name="stats"),
    path("<int:approval_id>/", views.approval, name="approval"),
    # An emailed decision link: GET confirms (changes nothing), POST decides.
    path("links/<str:token>/", links.link, name="link"),
    *[path(f"<int:approval_id>/{d}/", views.decide, {"decision": d}, name=d) for d in DECISIONS],
    # "I'm on it", and letting go (docs/reviewing.md#claims).
    *[path(f"<int:approval_id>/{a}/", views.claim, {"action": a}, name=a) for a in ("claim", "release")],
]
