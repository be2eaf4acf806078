"""Budgets the engine enforces before every step, whatever the prompt says."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields
from typing import Any

DEFAULTS: dict[str, int] = {
    "max_steps": 20,
    "max_cost_micros": 2_000_000,
    "max_tokens": 100_000,
    "deadline_seconds": 15 * 60,
    "max_consecutive_errors": 3,
    "max_identical_calls": 1,
}

# Identical calls failing with the same error this many times in a row end the run,
# even where max_identical_calls allows more repeats.
IDENTICAL_ERROR_STREAK = 3

# The longest task a launch takes, in characters: the form, the API and the commands
# all refuse a longer one through run_launch, with the same words.
TASK_MAX_CHARS = 100_000


# The most a profile may allow: far past any run's needs (the benchmark's 10,000 steps
# and a billion tokens fit), and a deadline that still falls on a date. A value above
# is a typo, refused where the profile is saved.
CEILINGS: dict[str, int] = {
    "max_steps": 100_000,
    "max_cost_micros": 1_000_000_000_000,  # a million dollars
    "max_tokens": 10_000_000_000,
    "deadline_seconds": 366 * 86_400,
    "max_consecutive_errors": 1_000,
    "max_identical_calls": 1_000,
}


class LimitError(ValueError):
    """Limits that are not positive whole numbers, or looser than allowed."""


@dataclass(frozen=True)
class Limits:
    max_steps: int = DEFAULTS["max_steps"]
    max_cost_micros: int = DEFAULTS["max_cost_micros"]
    max_tokens: int = DEFAULTS["max_tokens"]
    deadline_seconds: int = DEFAULTS["deadline_seconds"]
    max_consecutive_errors: int = DEFAULTS["max_consecutive_errors"]
    max_identical_calls: int = DEFAULTS["max_identical_calls"]

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Limits:
        data = data or {}
        unknown = set(data) - set(DEFAULTS)
        if unknown:
            raise LimitError(f"unknown limit(s): {', '.join(sorted(map(str, unknown)))} (known: {', '.join(DEFAULTS)})")
        values = {**DEFAULTS, **data}
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LimitError(f"{name} must be a whole number of at least 1, not {value!r}")
        return cls(**values)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def tightened(self, requested: dict[str, Any] | None) -> Limits:
        """These limits with `requested` applied; a looser value is refused."""
        merged = Limits.from_dict({**self.to_dict(), **(requested or {})})
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(merged, f.name)
            if theirs > mine:
                raise LimitError(f"{f.name} may only tighten the profile's {mine}, not {theirs}")
        return merged


def of_profile(data: Any) -> Limits:
    """A profile's limits: an object of known limit names (others keep their default),
    each a whole number from 1 to its ceiling; LimitError in the launch API's words."""
    if data is None:
        raise LimitError("limits must be an object: write {} for the defaults")
    if not isinstance(data, dict):
        raise LimitError(f'limits must be an object like {{"max_steps": 10}}, not {type(data).__name__} {data!r}')
    limits = Limits.from_dict(data)
    for name, ceiling in CEILINGS.items():
        if getattr(limits, name) > ceiling:
            raise LimitError(f"{name} must be at most {ceiling}, not {getattr(limits, name)}")
    return limits


def of_run(limits: dict[str, Any] | None) -> Limits:
    """A run's limits, parsed once per distinct set: every step checks them."""
    try:
        return _parsed(tuple(sorted((limits or {}).items())))
    except TypeError:  # an unhashable value: let from_dict say what is wrong with it
        return Limits.from_dict(limits)


@functools.lru_cache(maxsize=256)
def _parsed(items: tuple[tuple[str, Any], ...]) -> Limits:
    return Limits.from_dict(dict(items))


def exceeded(state: Any, now: float) -> str | None:
    """The reason the run may not take another step, naming the limit, or None."""
    limits = of_run(state.limits)
    if state.deadline and now >= state.deadline:
        return f"deadline passed ({limits.deadline_seconds} s after launch)"
    if state.steps >= limits.max_steps:
        return f"step budget exhausted ({state.steps} of max_steps {limits.max_steps})"
    if state.cost_micros >= limits.max_cost_micros:
        return (
            f"cost budget exhausted ({state.cost_micros} of max_cost_micros "
            f"{limits.max_cost_micros} micro-dollars)"
        )
    if state.tokens >= limits.max_tokens:
        return f"token ceiling reached ({state.tokens} of max_tokens {limits.max_tokens})"
    if state.consecutive_errors >= limits.max_consecutive_errors:
        return (
            f"too many consecutive tool errors ({state.consecutive_errors} of "
            f"max_consecutive_errors {limits.max_consecutive_errors})"
        )
    return None
