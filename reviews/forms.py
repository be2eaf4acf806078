from __future__ import annotations

from django import forms

from .cards import RISKS, Filters

NOTE_MAX = 4_000


class DecisionForm(forms.Form):
    note = forms.CharField(required=False, max_length=NOTE_MAX, strip=True)
    # "Approve and allow for this run" sends remember=tool (docs/policy.md, grants).
    remember = forms.ChoiceField(required=False, choices=[("", "no"), ("call", "this call"), ("tool", "the tool")])


class FilterForm(forms.Form):
    """The queue's GET filters; an unknown value is ignored rather than an error page."""

    agent = forms.CharField(required=False, max_length=64)
    tool = forms.CharField(required=False, max_length=100)
    risk = forms.ChoiceField(required=False, choices=[("", "any")] + [(r, r) for r in RISKS])

    def filters(self) -> Filters:
        self.is_valid()
        data = self.cleaned_data  # only the fields that were valid
        return Filters(agent=data.get("agent", ""), tool=data.get("tool", ""), risk=data.get("risk", ""))


def keep_ids(values: list[str]) -> list[int]:
    """Approval ids a polling page says it shows (`keep`: decided there; `shown`: pending)."""
    ids = []
    for value in values[:200]:
        if value.isdigit():
            ids.append(int(value))
    return ids
