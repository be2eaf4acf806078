from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from agents import access
from agents.models import Approval


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    runs = access.visible_runs(request.user)
    by_state = dict(runs.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    pending = Approval.objects.filter(status="pending").count() if access.can_decide(request.user) else None
    return render(request, "agents/overview.html", {"by_state": by_state, "pending": pending})
