"""Small typed readers of the environment that fail loudly on a bad value."""

from __future__ import annotations

import ipaddress
import math
import os


class EnvError(ValueError):
    pass


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise EnvError(f"{name} must be a boolean (1/0, true/false, yes/no, on/off), not {raw!r}")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvError(f"{name} must be a whole number, not {raw!r}") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise EnvError(f"{name} must be a number, not {raw!r}") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_positive_float(name: str, default: float) -> float:
    """A finite number above zero (fractions allowed): for durations where 0 or "inf"
    would silently mean "never" or "forever"."""
    value = env_float(name, default)
    if not math.isfinite(value) or value <= 0:
        raise EnvError(f"{name} must be a number above 0, not {os.environ.get(name)!r}")
    return value


def env_cidrs(name: str) -> list[str]:
    """Comma-separated IP addresses or networks (`10.0.0.5`, `172.16.0.0/12`, `::1`),
    normalised (`10.0.0.5/32`); none by default. A host name is refused: it would have to
    be resolved on every request, and a wrong guess trusts a stranger."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise EnvError(f"{name} must list IP addresses or networks (CIDR), not {item!r}") from None
    return networks
