from __future__ import annotations

from typing import Any

from django import forms

from agents.access import MAX_ID
from agents.lib import jsonsafe

from .cards import CLAIMED, RISKS, SORTS, Filters

# The grouped view's last page a link may name (more is a typo, not a queue).
PAGE_MAX = 10_000

NOTE_MAX = 4_000
ARGS_MAX = 100_000
Q_MAX = 200  # a search longer than this matches no card anyway


class DecisionForm(forms.Form):
    note = forms.CharField(required=False, max_length=NOTE_MAX, strip=True)
    # "Approve and allow for this run" sends remember=tool (docs/policy.md, grants).
    remember = forms.ChoiceField(required=False, choices=[("", "no"), ("call", "this call"), ("tool", "the tool")])
    # Present only when the card's editor is open: the arguments to run instead.
    args = forms.CharField(required=False, max_length=ARGS_MAX, strip=True)
    # The hash of the call the card showed: the answer counts only for that call.
    args_hash = forms.CharField(required=False, max_length=64, strip=True)

    def clean_args(self) -> Any:
        text = self.cleaned_data.get("args") or ""
        if not text:
            return None
        try:
            value = jsonsafe.parse(text)
        except jsonsafe.JsonError as exc:
            why = exc.message if exc.problem == "invalid" else f"refused: {exc.message}"
            raise forms.ValidationError(f"the arguments are {why}") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("the arguments must be a JSON object")
        return value


class FilterForm(forms.Form):
    """The queue's GET filters. A value that is not one of the choices (or too long) is
    not used, and the page says so (`Filters.ignored`) rather than answering an error page."""

    agent = forms.CharField(required=False, max_length=64)
    tool = forms.CharField(required=False, max_length=100)
    risk = forms.ChoiceField(required=False, choices=[("", "any")] + [(r, r) for r in RISKS])
    sort = forms.ChoiceField(required=False, choices=[(value, label) for value, (label, _o) in SORTS.items()])
    # A view, not a filter: 1 (the checkbox's value), true or on groups; 0, false or off does not.
    group = forms.CharField(required=False, max_length=8)
    # The grouped view's page (`?page=`), from 1 to PAGE_MAX.
    page = forms.CharField(required=False, max_length=12)
    claimed = forms.ChoiceField(
        required=False, choices=[("", "any"), *CLAIMED.items()],
        error_messages={"invalid_choice": "claimed takes me (Mine) or none (Unclaimed)."},
    )
    q = forms.CharField(
        required=False, max_length=Q_MAX, strip=True,
        error_messages={"max_length": f"a search takes at most {Q_MAX} characters."},
    )

    def clean_group(self) -> bool:
        value = self.cleaned_data["group"].lower()
        if value in ("", "0", "false", "off"):
            return False
        if value in ("1", "true", "on"):
            return True
        raise forms.ValidationError("group takes 1 (similar calls together) or 0.")

    def clean_page(self) -> int:
        value = self.cleaned_data["page"]
        if not value:
            return 1
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
        if not (value.isascii() and value.isdigit()) or int(value) < 1:
            raise forms.ValidationError("page takes a page number (1, 2, ...), so this is the first page.")
        return min(int(value), PAGE_MAX)

    def filters(self) -> Filters:
        self.is_valid()
        data = self.cleaned_data  # only the fields that were valid
        ignored = [f"{name}={str(self.data.get(name, ''))[:40]!r}: {' '.join(errors)}" for name, errors in self.errors.items()]
        return Filters(
            agent=data.get("agent", ""), tool=data.get("tool", ""), risk=data.get("risk", ""), sort=data.get("sort", ""),
            group=bool(data.get("group")), page=data.get("page", 1),
            claimed=data.get("claimed", ""), q=data.get("q", ""), ignored=ignored,
        )


def keep_ids(values: list[str]) -> list[int]:
    """Approval ids a polling page says it shows (`keep`: decided there; `shown`: pending)."""
    ids = []
    for value in values[:200]:
        # ASCII digits only ("²" is a digit to isdigit(), not to int()), and no id past a
        # bigint, which no row has and SQLite cannot even compare.
        if value.isascii() and value.isdigit() and int(value) <= MAX_ID:
            ids.append(int(value))
    return ids


def seen_hashes(values: list[str]) -> dict[int, str]:
    """`pk:args_hash` pairs a polling page sends for its pending cards: the call each shows."""
    seen = {}
    for value in values[:200]:
        pk, _, digest = value.partition(":")
        ids = keep_ids([pk])
        if ids and len(digest) == 64:
            seen[ids[0]] = digest
    return seen


class BatchForm(forms.Form):
    """A group card's answer: approve or reject the checked rows (`ids`) with one note;
    `seen` carries each shown row's `id:args_hash`, binding the answer to that call."""

    decision = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")])
    note = forms.CharField(required=False, max_length=NOTE_MAX, strip=True)
    group_key = forms.CharField(required=False, max_length=32)

    def picked(self, data: Any) -> tuple[list[int], dict[int, str]]:
        """The checked ids (distinct, in the page's order) and the hashes of those shown."""
        ids = list(dict.fromkeys(keep_ids(data.getlist("ids"))))
        return ids, seen_hashes(data.getlist("seen"))
def claim_tokens(values: list[str]) -> dict[int, str]:
    """`pk:token` pairs a polling page sends for its pending cards: the claim each shows
    (cards.ClaimLine.token_of)."""
    shown = {}
    for value in values[:200]:
        pk, _, token = value.partition(":")
        ids = keep_ids([pk])
        if ids and 0 < len(token) <= 40:
            shown[ids[0]] = token
    return shown
