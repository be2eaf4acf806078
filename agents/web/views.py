"""Pages over runs: overview, list, timeline, launch, cancel, export.

Each view: decorators, an access helper, the form, one domain call, a render.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, Sum
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agents import access
from agents.actions import forks
from agents.actions.base import ActionError
from agents.actions.runs import grant_revoke, run_launch
from agents.actions.runs import run_cancel as cancel_action
from agents.actions.runs import run_hold as hold_action
from agents.actions.runs import run_release as release_action
from agents.demo import SCENARIOS
from agents.engine import states
from agents.models import NotificationPreference, Run
from agents.notifications import slack
from agents.runs.export import CaseRefused, export_run, save_eval_case
from agents.web import projects, timeline
from agents.web.forms import ForkForm, LaunchForm, RunFilterForm, limit_rows

LIST_PAGE = 50
LIVE_POLL = "every 1s"


# -- overview ------------------------------------------------------------------------


@require_GET
@login_required
def overview(request: HttpRequest) -> HttpResponse:
    project = projects.current_id(request)
    runs = access.visible_runs(request.user, project=project)
    now = timezone.now()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    by_state = dict(runs.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    ordered = {s: by_state[s] for s in states.STATES if s in by_state}
    # Approvals are about every run of a project: shown to those who read its runs.
    readers = access.can_decide(request.user) or access.can_cancel(request.user)
    open_approvals = access.visible_approvals(request.user, project=project).pending()
    pending = open_approvals.count() if readers else None
    waiting = list(open_approvals.select_related("run__profile").order_by("created_at")[:5]) if readers else []
    failed = list(
        runs.filter(state="failed", finished_at__gte=now - dt.timedelta(hours=24))
        .select_related("profile")
        .order_by("-finished_at")[:10]
    )
    cost_today = runs.filter(created_at__gte=today).aggregate(c=Sum("cost_micros"), n=Count("id"))
    newest = list(runs.select_related("profile").order_by("-created_at", "-id")[:10])
    return render(
        request,
        "agents/overview.html",
        {
            "by_state": ordered,
            "active": sum(n for s, n in ordered.items() if s in states.ACTIVE),
            "pending": pending,
            "waiting": waiting,
            "failed": failed,
            "cost_today": cost_today["c"] or 0,
            "runs_today": cost_today["n"],
            "newest": newest,
            # Not an error: a person nobody has given a role yet is told so.
            "no_project": access.in_no_project(request.user),
        },
    )


# -- the list ------------------------------------------------------------------------


def _cursor(run: Run) -> str:
    return f"{int(run.created_at.timestamp() * 1_000_000)}.{run.pk}"


def _parse_cursor(value: str | None) -> tuple[dt.datetime, int] | None:
    try:
        micros, pk = (value or "").split(".")
        when = dt.datetime.fromtimestamp(int(micros) / 1_000_000, tz=dt.UTC)
        return when, int(pk)
    except (ValueError, OverflowError, OSError):
        # A cursor is the visitor's text: one past what a timestamp can hold is ignored.
        return None


@require_GET
@login_required
def runs(request: HttpRequest) -> HttpResponse:
    """Newest first, keyset-paginated: no COUNT, one query for the page whatever the total."""
    form = RunFilterForm(request.GET)
    project = projects.current_id(request)
    qs = access.visible_runs(request.user, project=project).filter(**form.filters()).select_related("profile").defer("engine", "script")
    before, after = _parse_cursor(request.GET.get("before")), _parse_cursor(request.GET.get("after"))
    if after is not None:
        # Going back towards newer runs: walk upwards from the cursor, then flip.
        when, pk = after
        qs = qs.filter(Q(created_at__gt=when) | Q(created_at=when, pk__gt=pk), created_at__gte=when)
        rows = list(qs.order_by("created_at", "id")[: LIST_PAGE + 1])
        has_newer = len(rows) > LIST_PAGE
        rows = rows[:LIST_PAGE][::-1]
        has_older = True
    else:
        if before is not None:
            when, pk = before
            qs = qs.filter(Q(created_at__lt=when) | Q(created_at=when, pk__lt=pk), created_at__lte=when)
        rows = list(qs.order_by("-created_at", "-id")[: LIST_PAGE + 1])
        has_older = len(rows) > LIST_PAGE
        rows = rows[:LIST_PAGE]
        has_newer = before is not None
    query = request.GET.copy()
    for key in ("before", "after"):
        query.pop(key, None)
    base = query.urlencode()
    older = newer = None
    if rows and has_older:
        older = f"?{base}&before={_cursor(rows[-1])}" if base else f"?before={_cursor(rows[-1])}"
    if rows and has_newer:
        newer = f"?{base}&after={_cursor(rows[0])}" if base else f"?after={_cursor(rows[0])}"
    agents = access.visible_profile_names(request.user, project=project)
    # A wrong filter is the visitor's mistake, named on the page: not "No runs match".
    problems = form.problems()
    if problems:
        rows, older, newer = [], None, None
    return render(
        request,
        "agents/runs.html",
        {
            "form": form,
            "rows": rows,
            "older": older,
            "newer": newer,
            "agents": agents,
            "filtered": bool(base),
            "problems": problems,
        },
        status=400 if problems else 200,
    )


# -- the timeline --------------------------------------------------------------------


@require_GET
@access.login_required_htmx
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.readable_run(request.user, run_id)
    after = _int(request.GET.get("after"))
    if after is not None and request.GET.get("live"):
        return _live(request, run, after)
    if after is not None and request.htmx:
        entries, more = timeline.page(run, after=after)
        last = entries[-1].t.seq if entries else after
        context = {
            "run": run,
            "entries": entries,
            "more": more,
            "last_seq": last,
            "live_after": last,
            "poll": LIVE_POLL,
            "fork_form": _fork_form(request, run),
        }
        return render(request, "agents/run_detail.html#more", context)
    # Without htmx, "load more" is a plain link: the page starting after that seq.
    points, cache = timeline.series_and_cache(run)
    header = _header(request, run, cache=cache)
    entries, more = timeline.page(run, after=max(after or 0, 0), points=points, approvals=header["approvals"])
    last = entries[-1].t.seq if entries else 0
    context = {
        **header,
        "entries": entries,
        "more": more,
        "last_seq": last,
        # With older transitions still unloaded, live rows would leave a gap: the poller
        # refreshes the header only until "load more" reaches the end.
        "live_after": None if more else last,
        "chart": timeline.chart(points, timeline.inherited(run)),
        "poll": LIVE_POLL,
    }
    return render(request, "agents/run_detail.html", context)


def _header(request: HttpRequest, run: Run, *, cache: dict[str, int] | None = None) -> dict[str, Any]:
    """What the run's header shows: its approvals, its grants and its prompt-cache tokens
    (`cache`, when the caller summed them already)."""
    approvals = timeline.run_approvals(run)
    task, task_cut = timeline.page_text(run.task)
    answer, answer_cut = timeline.page_text(run.answer)
    return {
        "run": run,
        # Cut at PAGE_TEXT_MAX characters; the whole is at run_text's URL.
        "task_shown": task,
        "task_cut": task_cut,
        "answer_shown": answer,
        "answer_cut": answer_cut,
        "page_text_max": timeline.PAGE_TEXT_MAX,
        # Otherwise the template calls the method, and only if it renders the header.
        "cache_tokens": run.cache_tokens if cache is None else cache,
        "approvals": approvals,
        "pending": next((a for a in approvals if a.is_pending), None),
        # Most runs grant nothing, and the run row says so: no query for them.
        "grants": list(run.grants.select_related("by", "revoked_by").order_by("number")) if run.has_grants else [],
        "can_revoke": access.can_decide(request.user, access.project_of(run)) and not run.is_terminal,
        # Per project: an operator elsewhere who reads this run as its launcher may not.
        "can_cancel": access.can_cancel(request.user, access.project_of(run)),
        "can_fork": access.can_fork(request.user, run),
        # Forks are rare: the partial index on forked_from answers "none" without a scan.
        "forks": list(run.forks.order_by("pk").only("pk", "state", "fork_seq")),
        # A gateway stream's runs (docs/gateway.md): the partial index answers most runs' "none".
        "continued_by": list(run.continued_by.order_by("pk").only("pk")),
        "limit_rows": limit_rows(run),
        "launch_policy": run.policy(),
        "fork_form": _fork_form(request, run),
        # The retry's limits: the same form (and template) as a fork's.
        "retry_form": ForkForm(run=run, retry=True) if run.state == states.FAILED else None,
    }


def _fork_form(request: HttpRequest, run: Run) -> dict[str, str] | None:
    """"Fork from here" on the timeline's resting points: an ended run the viewer may
    fork, with its content (a purged run has no transcript to fork) and its own driver
    (an external agent's client drives its runs, which cannot be forked). Each links to
    the fork's page (its limits, then the button that forks)."""
    if not (run.is_terminal and not run.purged_at and run.profile.provider != "external"):
        return None
    if not access.can_fork(request.user, run):
        return None
    return {"url": reverse("run_fork", args=[run.pk])}


def _live(request: HttpRequest, run: Run, after: int) -> HttpResponse:
    """The poller's answer: new transitions, a fresh header and chart, and the next poller.

    The header is sent only when the run's version moved past the one the page shows
    (`seen`): re-rendering it every second would take focus from its links and repeat
    its status messages to screen readers. At a terminal state the poller comes back
    without `hx-trigger`, so polling stops.
    """
    # Most polls find nothing new (a run waiting for a human): then the chart and the
    # rows are left alone and the answer is the header alone.
    changed = after < 0 or run.version > after
    points, cache = timeline.series_and_cache(run) if changed else ([], None)
    header = _header(request, run, cache=cache)
    entries, more = (
        timeline.page(run, after=after, points=points, approvals=header["approvals"])
        if changed and after >= 0
        else ([], False)
    )
    last = entries[-1].t.seq if entries else after
    context = {
        **header,
        "entries": entries,
        "live_after": last if after >= 0 else -1,
        "chart": timeline.chart(points, timeline.inherited(run)) if changed else None,
        "chart_unchanged": not changed,
        "header_unchanged": _int(request.GET.get("seen")) == run.version,
        # Keep polling while rows remain to fetch, even if the run has just ended.
        "poll": LIVE_POLL if (not run.is_terminal or more) else None,
    }
    return render(request, "agents/run_detail.html#live", context)


def _int(value: str | None) -> int | None:
    """A query-string number, or None: absent, not a number, or past a bigint (no
    sequence number is, and SQLite cannot compare one)."""
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return number if number is None or abs(number) <= access.MAX_ID else None


@require_POST
@login_required
def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.readable_run(request.user, run_id)
    if not access.can_cancel(request.user, access.project_of(run)):
        raise PermissionDenied("only operators cancel runs")
    reason = request.POST.get("reason", "").strip()[:2000]
    try:
        cancel_action(run_id=run.pk, user=request.user, reason=reason)
    except ActionError as exc:
        messages.error(request, str(exc.detail))
    else:
        messages.success(request, f"Run {run.pk} cancelled.")
    return redirect("run_detail", run_id=run.pk)


@require_http_methods(["GET", "POST"])
@login_required
def run_retry(request: HttpRequest, run_id: int) -> HttpResponse:
    """"Retry from the last good step": a fork of the failed run from its last resting
    point (the button on the run's page posts here); goes to the new run."""
    return _fork_page(request, run_id, retry=True)


@require_http_methods(["GET", "POST"])
@login_required
def run_fork(request: HttpRequest, run_id: int) -> HttpResponse:
    """"Fork from here" on a timeline step (`?from_seq=`): GET shows the fork's limits,
    POST forks after that step (or the nearest earlier resting point, which the message
    names); goes to the new run."""
    return _fork_page(request, run_id, retry=False)


def _fork_page(request: HttpRequest, run_id: int, *, retry: bool) -> HttpResponse:
    """A retry's and a fork's one flow: the access check, the limits form, one call of
    `run_retry` or `run_fork` (the API's), then the new run; a refused value, or a run
    that cannot be forked, is answered on this page, on the field it names."""
    run = access.readable_run(request.user, run_id)
    verb = "retry" if retry else "fork"
    if not access.can_fork(request.user, run):
        raise PermissionDenied(f"only operators, or the run's launcher, {verb} runs")
    form = ForkForm(request.POST if request.method == "POST" else request.GET, run=run, retry=retry)
    status = 200 if form.is_valid() else 400
    if request.method == "POST" and status == 200:
        try:
            if retry:
                fork, point = forks.run_retry(run_id=run.pk, user=request.user, limits=form.limits())
            else:
                fork, point = forks.run_fork(
                    run_id=run.pk, user=request.user, from_seq=form.cleaned_data["from_seq"], limits=form.limits()
                )
        except ActionError as exc:
            form.add_action_error(exc.code, exc.detail)
            status = exc.status
        else:
            moved = f" ({point.why})" if point.used != point.requested and not retry else ""
            done = "retried" if retry else "forked"
            messages.success(request, f"Run {run.pk} {done} as run {fork.pk}, from after step {point.used}{moved}.")
            return redirect("run_detail", run_id=fork.pk)
    # The step as a number, or none: what the visitor typed is not shown back in the heading.
    context = {"run": run, "form": form, "retry": retry, "from_seq": form.cleaned_data.get("from_seq")}
    return render(request, "agents/run_fork.html", context, status=status)


@require_POST
@login_required
def run_hold(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.readable_run(request.user, run_id)
    if not access.can_cancel(request.user, access.project_of(run)):
        raise PermissionDenied("only operators hold runs")
    try:
        hold_action(run_id=run.pk, user=request.user, reason=request.POST.get("reason", ""))
    except ActionError as exc:
        messages.error(request, str(exc.detail))
    else:
        messages.success(request, f"Run {run.pk} is on hold.")
    return redirect("run_detail", run_id=run.pk)


@require_POST
@login_required
def run_release(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.readable_run(request.user, run_id)
    if not access.can_cancel(request.user, access.project_of(run)):
        raise PermissionDenied("only operators release held runs")
    release_action(run_id=run.pk, user=request.user)
    messages.success(request, f"Run {run.pk}'s hold is released.")
    return redirect("run_detail", run_id=run.pk)


@require_POST
@login_required
def run_grant_revoke(request: HttpRequest, run_id: int, grant_id: int) -> HttpResponse:
    run = access.readable_run(request.user, run_id)
    if not access.can_decide(request.user, access.project_of(run)):
        raise PermissionDenied("only reviewers revoke grants")
    try:
        grant = grant_revoke(run_id=run.pk, grant_id=grant_id, user=request.user)
    except ActionError as exc:
        if exc.status == 404:
            raise Http404(str(exc.detail)) from None
        messages.error(request, str(exc.detail))
    else:
        messages.success(request, f"Grant {grant.number} revoked: {grant.tool} calls ask again.")
    return redirect("run_detail", run_id=run.pk)


@require_GET
@login_required
def run_text(request: HttpRequest, run_id: int, part: str) -> HttpResponse:
    """The run's whole task or answer as plain text, which its page cuts at
    PAGE_TEXT_MAX characters; the same access as the page."""
    run = access.readable_run(request.user, run_id)
    text = run.task if part == "task" else run.answer
    if text is None:
        raise Http404("the run has no answer (yet)")
    return _plain(text)


@require_GET
@login_required
def run_message_text(request: HttpRequest, run_id: int, index: int) -> HttpResponse:
    """One transcript message's whole text (the timeline cuts long ones)."""
    run = access.readable_run(request.user, run_id)
    content = run.messages.filter(index=index).values_list("content", flat=True).first() if index <= access.MAX_ID else None
    if content is None:
        raise Http404(f"run {run.pk} has no message {index}")
    return _plain(content)


def _plain(text: str) -> HttpResponse:
    # text/plain with nosniff (SecurityMiddleware): model-written HTML stays text.
    response = HttpResponse(text, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = "inline"
    return response


@require_GET
@login_required
def run_export(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.readable_run(request.user, run_id)
    body = json.dumps(export_run(run), indent=2, ensure_ascii=False)
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="airlock-run-{run.pk}.json"'
    return response


@require_POST
@login_required
def run_save_eval_case(request: HttpRequest, run_id: int) -> HttpResponse:
    """"Save as eval case": the run's export, with its recorded tool results, written
    into the deployment's own cases (AIRLOCK_EVALS_DIR, under var/), never into the
    shipped evals/; `run_evals <that folder>` replays them."""
    run = access.readable_run(request.user, run_id)
    if not access.can_cancel(request.user, access.project_of(run)):
        raise PermissionDenied("only operators save eval cases")
    try:
        path = save_eval_case(run, settings.AIRLOCK_EVALS_DIR)
    except CaseRefused as exc:
        messages.error(request, f"Not saved as an eval case: {exc}.")
    except OSError as exc:
        messages.error(request, f"Could not save the eval case: {exc.strerror}.")
    else:
        messages.success(
            request, f"Run {run.pk} saved as the eval case {path}; manage.py run_evals {path.parent} replays it."
        )
    return redirect("run_detail", run_id=run.pk)


# -- launch --------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@login_required
def run_new(request: HttpRequest) -> HttpResponse:
    if not access.can_launch(request.user):
        raise PermissionDenied("only launchers start runs")
    launchable = access.launchable_profiles(request.user)
    project = projects.current_id(request)
    profiles = list(launchable if project is None else launchable.filter(project_id=project))
    for p in profiles:
        # A broken profile row costs only itself: listed, unavailable, with the reason.
        p.unavailable = p.launch_problem()
    form = LaunchForm(request.POST or None, profiles=profiles)
    if request.method == "POST" and form.is_valid():
        try:
            run = run_launch(user=request.user, by_launcher=True, **form.launch_kwargs())
        except ActionError as exc:
            form.add_action_error(exc.code, exc.detail)
        else:
            return redirect("run_detail", run_id=run.pk)
    status = 400 if request.method == "POST" else 200
    return render(
        request,
        "agents/run_new.html",
        {
            "form": form,
            "profiles": profiles,
            "allow_scripted": settings.AIRLOCK_ALLOW_SCRIPTED,
            "example": EXAMPLE_SCRIPT,
            "scenarios": [s for s in SCENARIOS if s["agent"] in {p.name for p in profiles if not p.unavailable}],
        },
        status=status,
    )


EXAMPLE_SCRIPT = json.dumps(
    [
        {"call": {"tool": "fetch_fixture", "args": {"text": "Quarterly numbers: 42"}}},
        {"call": {"tool": "ledger_write", "args": {"entry": "recorded 42"}}},
        {"final": "Recorded the quarterly number."},
    ]
)


# -- notifications: a reviewer's own email and digest settings ---------------------------


@require_http_methods(["GET", "POST"])
@login_required
def notifications(request: HttpRequest) -> HttpResponse:
    """A reviewer's own notification settings: the pending-calls email digest, an email
    per call, and the Slack member id whose clicks decide as them."""
    reviewer = access.can_decide(request.user)
    if request.method == "POST":
        on = request.POST.get("email_digest") == "on"
        NotificationPreference.set_digest(request.user, on)
        NotificationPreference.objects.filter(user=request.user).update(
            email_each_call=request.POST.get("email_each_call") == "on"
        )
        if request.POST.get("slack_unlink") == "on":
            NotificationPreference.objects.filter(user=request.user).exclude(slack_member_id="").update(
                slack_member_id="", slack_linked_at=timezone.now()
            )
        member = request.POST.get("slack_member_id", "").strip()
        current = NotificationPreference.objects.get(user=request.user).slack_member_id
        if member and member != current:
            # Typing an id proves nothing: it changes no link (anyone could type another's).
            messages.error(
                request,
                "Slack not linked: a Slack account is linked only with proof that it is yours. Click Approve or "
                "Reject on any Airlock message in Slack and open the link Slack shows you alone.",
            )
            return redirect("notifications")
        messages.success(request, "Digest emails are on." if on else "Digest emails are off.")
        return redirect("notifications")
    pref = NotificationPreference.objects.filter(user=request.user).first()
    return render(
        request,
        "agents/notifications.html",
        {
            "reviewer": reviewer,
            "digest_on": NotificationPreference.digest_on(request.user),
            "each_call": bool(pref and pref.email_each_call),
            "slack_member_id": pref.slack_member_id if pref else "",
        },
    )


@require_http_methods(["GET", "POST"])
@login_required
def slack_link(request: HttpRequest, token: str) -> HttpResponse:
    """Link the Slack member a proof link names (agents.notifications.slack: Slack showed
    it to that member alone, after a signed click) to the logged-in user. GET asks, POST
    links; a member linked to someone else moves, and they are told."""
    try:
        member_id, name = slack.link_member(token)
    except slack.LinkInvalid as exc:
        return render(request, "agents/slack_link.html", {"message": str(exc)}, status=410)
    held = slack.linked_user(member_id)
    if request.method == "POST":
        slack.link_move(user=request.user, member_id=member_id, how="with proof from Slack (a signed click)")
        messages.success(request, f"Slack member {member_id} is linked to you: your clicks in Slack decide as you.")
        return redirect("notifications")
    others = held is not None and held.pk != request.user.pk
    context = {"member_id": member_id, "name": name, "held_by": held.get_username() if others else ""}
    return render(request, "agents/slack_link.html", context)
