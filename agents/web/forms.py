"""Forms for the run pages: the list's filters and the launch form.

The launch form only parses what the browser sends (numbers, JSON); every rule about a
launch (known agent, non-empty task, limits no looser than the profile's, script shape)
belongs to `agents.actions.runs.run_launch`, whose errors the view puts back on the fields.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.conf import settings
from django.forms.fields import InvalidJSONInput, JSONString

from agents.engine import policy as engine_policy
from agents.engine import states
from agents.engine.limits import DEFAULTS
from agents.lib import jsonsafe
from agents.models import AgentProfile

LIMIT_HELP = {
    "max_steps": "model calls and tool calls each count one",
    "max_cost_micros": "micro-dollars (1,000,000 = $1)",
    "max_tokens": "input + output, over the whole run",
    "deadline_seconds": "wall clock from launch",
    "max_consecutive_errors": "tool errors in a row",
    "max_identical_calls": "times the same call may run",
}


class RunFilterForm(forms.Form):
    """The list's filters; a value that does not parse is named in `problems()` (the page
    says which filter is wrong) and left out of `filters()`."""

    q = forms.CharField(required=False, max_length=200, label="Search task")
    state = forms.ChoiceField(required=False, choices=[("", "any state"), *[(s, s) for s in states.STATES]])
    agent = forms.CharField(required=False, max_length=64)
    tainted = forms.ChoiceField(
        required=False, label="Taint", choices=[("", "tainted or not"), ("yes", "tainted"), ("no", "clean")]
    )
    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def clean_agent(self) -> str:
        name: str = self.cleaned_data.get("agent", "")
        if name and not AgentProfile.objects.filter(name=name).exists():
            raise forms.ValidationError(f"there is no agent profile named “{name}”")
        return name

    # Query parameters of the list that are not filters: the page cursors, and the project
    # switcher's (agents/web/projects.py reads it before the view).
    NOT_FILTERS = ("before", "after", "project")

    def problems(self) -> list[str]:
        """One line per filter whose value was refused, naming the filter and the value,
        and one per parameter that is no filter at all (`?from=...`: ignoring it would
        show every run as if it had filtered)."""
        self.is_valid()
        lines = []
        for name, errors in self.errors.items():
            field = self.fields[name]
            label = field.label or name.capitalize()
            lines.append(f"{label} “{self.data.get(name, '')}”: {' '.join(errors)}")
        known = ", ".join(self.fields)
        for name in self.data:
            if name not in self.fields and name not in self.NOT_FILTERS:
                lines.append(f"“{name}” is not a filter of this list; the filters are {known}.")
        return lines

    def filters(self) -> dict[str, Any]:
        """The valid filters as ORM lookups."""
        self.is_valid()
        data = getattr(self, "cleaned_data", {})
        lookups: dict[str, Any] = {}
        if data.get("q"):
            lookups["task__icontains"] = data["q"]
        if data.get("state"):
            lookups["state"] = data["state"]
        if data.get("agent"):
            lookups["profile__name"] = data["agent"]
        if data.get("tainted"):
            lookups["tainted"] = data["tainted"] == "yes"
        if data.get("since"):
            lookups["created_at__gte"] = _midnight(data["since"])
        if data.get("until"):
            lookups["created_at__lt"] = _midnight(data["until"] + dt.timedelta(days=1))
        return lookups


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)


def _json_or_none(text: str) -> Any:
    text = text.strip()
    if not text:
        return None
    try:
        return jsonsafe.parse(text)
    except jsonsafe.JsonError as exc:
        raise forms.ValidationError(exc.message) from None


class SafeJSONField(forms.JSONField):
    """The admin's JSON boxes through `agents.lib.jsonsafe`: NaN, 1e400, nesting past the
    limit or a lone surrogate is a field error naming it, not a 500 when the row is
    written (nor a RecursionError while the form is shown again)."""

    def to_python(self, value: Any) -> Any:
        if self.disabled or value in self.empty_values or not isinstance(value, str) or isinstance(value, JSONString):
            return super().to_python(value)
        try:
            converted = jsonsafe.parse(value)
        except jsonsafe.JsonError as exc:
            raise forms.ValidationError(exc.message, code="invalid") from None
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled or not isinstance(data, str):
            return super().bound_data(data, initial)
        try:
            return jsonsafe.parse(data)
        except jsonsafe.JsonError:
            return InvalidJSONInput(data)

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return super().has_changed(initial, data)
        except forms.ValidationError:
            return True


class LaunchForm(forms.Form):
    agent = forms.ChoiceField(label="Agent profile", widget=forms.RadioSelect)
    # Neither `required` nor `max_length`: run_launch owns those rules and their wording.
    task = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 4}))
    approver = forms.ChoiceField(
        choices=[
            (engine_policy.HUMAN, "a human reviewer approves risky calls"),
            (engine_policy.NO_APPROVER, "no approver: risky calls are denied"),
        ],
        initial=engine_policy.HUMAN,
        widget=forms.RadioSelect,
    )
    script = forms.CharField(
        required=False,
        label="Script (JSON)",
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
        help_text='A list of decisions: {"call": {"tool": ..., "args": {...}}} or {"final": "..."}.',
    )

    policy = forms.CharField(
        required=False,
        label="Policy (JSON, optional)",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text='Tightens the profile\'s policy for this run only, e.g. {"rules": [{"tool": "refund", "then": "ask", '
        '"reason": "this customer is on watch"}], "irreversible_approvals": 2}. Rules may only ask or deny.',
    )

    def __init__(self, *args: Any, profiles: list[AgentProfile], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profiles = {p.name: p for p in profiles}
        self.fields["agent"].choices = [(p.name, p.name) for p in profiles]
        available = [p for p in profiles if not getattr(p, "unavailable", None)]
        if available:
            self.fields["agent"].initial = available[0].name
        for name in DEFAULTS:
            self.fields[name] = forms.IntegerField(
                required=False, label=name.replace("_", " "), help_text=LIMIT_HELP.get(name, "")
            )
        if not settings.AIRLOCK_ALLOW_SCRIPTED:
            del self.fields["script"]

    def limit_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in DEFAULTS]

    def clean_script(self) -> Any:
        return _json_or_none(self.cleaned_data.get("script", ""))

    def clean_policy(self) -> Any:
        return _json_or_none(self.cleaned_data.get("policy", ""))

    def launch_kwargs(self) -> dict[str, Any]:
        data = self.cleaned_data
        profile = self.profiles[data["agent"]]
        limits = {name: data[name] for name in DEFAULTS if data.get(name) is not None}
        script = data.get("script")
        if profile.provider == "scripted" and script is None:
            script = []
        elif profile.provider != "scripted":
            # The script box is hidden for other agents; leftovers in it are not an error.
            script = None
        return {
            "agent": profile,
            "task": data.get("task", ""),
            "approver": data["approver"],
            "limits": limits or None,
            "script": script,
            "policy": data.get("policy"),
        }

    # run_launch's error codes, and the field each one belongs to.
    ERROR_FIELDS = {
        "unknown_agent": "agent",
        "invalid_task": "task",
        "invalid_approver": "approver",
        "invalid_script": "script",
        "scripted_disabled": "agent",
        "invalid_policy": "policy",
        "invalid_profile": "agent",
    }

    def add_action_error(self, code: str, detail: Any) -> None:
        field: str | None = self.ERROR_FIELDS.get(code)
        if code == "invalid_limits":
            # LimitError names the limit it refused first ("max_steps may only ...").
            field = next((name for name in DEFAULTS if str(detail).startswith(name)), None)
        if field is not None and field not in self.fields:
            field = None
        self.add_error(field, str(detail))


class RetryForm(forms.Form):
    """A retry's or a fork's `limits` (docs/retry.md: the parent's, each may rise to the
    profile's): a field per limit, blank keeps the parent's. run_fork checks the values
    against the profile, with the API's words; `from_seq` only for "Fork from here"."""

    from_seq = forms.IntegerField(required=False, min_value=0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in DEFAULTS:
            self.fields[name] = forms.IntegerField(required=False, label=name.replace("_", " "))

    def limits(self) -> dict[str, int] | None:
        chosen = {name: self.cleaned_data[name] for name in DEFAULTS if self.cleaned_data.get(name) is not None}
        return chosen or None
