"""Forms for the run pages: the list's filters and the launch form.

The launch form only parses what the browser sends (numbers, JSON); every rule about a
launch (known agent, non-empty task, limits no looser than the profile's, script shape)
belongs to `agents.actions.runs.run_launch`, whose errors the view puts back on the fields.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from django import forms
from django.conf import settings
from django.forms.fields import InvalidJSONInput, JSONString

from agents.engine import policy as engine_policy
from agents.engine import states
from agents.engine.limits import LimitError
from agents.lib import jsonsafe
from agents.models import AgentProfile, Run


class LimitText(NamedTuple):
    label: str
    help: str


# Each limit's words, wherever a page names it: the launch form, the run page's table,
# the retry's and the fork's fields. One entry per key of agents.engine.limits.DEFAULTS.
LIMITS = {
    "max_steps": LimitText("Steps", "model calls and tool calls each count one"),
    "max_cost_micros": LimitText("Cost (micro-dollars)", "1,000,000 = $1"),
    "max_tokens": LimitText("Tokens", "input + output, over the whole run"),
    "deadline_seconds": LimitText("Deadline (seconds from launch or fork)", "wall clock from the start"),
    "max_consecutive_errors": LimitText("Consecutive tool errors", "tool errors in a row"),
    "max_identical_calls": LimitText("Identical calls", "times the same call may run"),
}


def limit_rows(run: Run) -> list[dict[str, Any]]:
    """The run's effective limits beside what its profile allows now (the most a retry
    or a fork may raise them to, docs/retry.md); a broken profile row allows nothing."""
    mine = (run.engine or {}).get("limits") or {}
    try:
        ceiling: dict[str, Any] = run.profile.base_limits().to_dict()
    except LimitError:
        ceiling = {}
    return [
        {"name": name, "label": text.label, "value": mine.get(name), "ceiling": ceiling.get(name)}
        for name, text in LIMITS.items()
    ]


class LimitFields(forms.Form):
    """A number field per limit (blank: not given), and a limit the action refused put
    back on its field: the one code of the launch form and the retry's and fork's form."""

    # The action's error codes (agents.actions), and the field each one belongs to.
    ERROR_FIELDS: dict[str, str] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, text in LIMITS.items():
            self.fields[name] = forms.IntegerField(required=False, label=text.label, help_text=text.help)
        # What agents/limit_fields.html shows per field; a retry or a fork adds the run's
        # value and the profile's ceiling.
        self.limit_rows: list[dict[str, Any]] = [{"field": f, "value": None, "ceiling": None} for f in self.limit_fields()]

    def limit_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in LIMITS]

    def limits(self) -> dict[str, int] | None:
        chosen = {name: self.cleaned_data[name] for name in LIMITS if self.cleaned_data.get(name) is not None}
        return chosen or None

    def add_action_error(self, code: str, detail: Any) -> None:
        field: str | None = self.ERROR_FIELDS.get(code)
        if code == "invalid_limits":
            # LimitError names the limit it refused first ("max_steps may only ...").
            field = next((name for name in LIMITS if str(detail).startswith(name)), None)
        if field is not None and field not in self.fields:
            field = None
        self.add_error(field, str(detail))


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


class LaunchForm(LimitFields):
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
        if not settings.AIRLOCK_ALLOW_SCRIPTED:
            del self.fields["script"]

    def clean_script(self) -> Any:
        return _json_or_none(self.cleaned_data.get("script", ""))

    def clean_policy(self) -> Any:
        return _json_or_none(self.cleaned_data.get("policy", ""))

    def launch_kwargs(self) -> dict[str, Any]:
        data = self.cleaned_data
        profile = self.profiles[data["agent"]]
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
            "limits": self.limits(),
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


class ForkForm(LimitFields):
    """A retry's or a fork's `limits` (docs/retry.md: the parent's, each may rise to the
    profile's): blank keeps the parent's. run_fork checks the values against the
    profile, with the API's words; `from_seq` (the step) only for "Fork from here"."""

    from_seq = forms.IntegerField(min_value=0, error_messages={"required": "name the step to fork from"})

    ERROR_FIELDS = {"invalid_fork_point": "from_seq"}

    def __init__(self, *args: Any, run: Run, retry: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if retry:
            del self.fields["from_seq"]
        rows = {row["name"]: row for row in limit_rows(run)}
        # Each field with this run's value and the profile's ceiling (the template's hints).
        self.limit_rows = [{**rows[f.name], "field": f} for f in self.limit_fields()]
