"""Policies by name: the names users type (``--policy frc``)."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any

from codedgd.services.errors import ConfigError
from codedgd.services.policies.base import Param, Policy

_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name``."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"policy name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        near = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(near)}?" if near else ""
        raise ConfigError(
            f"unknown policy {name!r}.{hint} Available: {', '.join(sorted(_REGISTRY))} "
            "(see `codedgd policies`)."
        ) from None


def coerce_params(cls: type[Policy], params: Mapping[str, Any]) -> dict[str, Any]:
    """Check names and types of user-given parameters against ``cls.parameters``."""
    known = {p.name: p for p in cls.parameters}
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key not in known:
            valid = ", ".join(known) or "none"
            raise ConfigError(
                f"policy {cls.name!r} has no parameter {key!r}; its parameters: {valid}"
            )
        out[key] = _coerce(cls.name, known[key], value)
    return out


def _coerce(policy: str, p: Param, value: Any) -> Any:
    try:
        if p.type is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if p.type is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        return p.type(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"policy {policy!r}: parameter {p.name!r} must be {p.type.__name__}, got {value!r}"
        ) from None


def create(name: str, params: Mapping[str, Any] | None = None, *, seed: int = 0) -> Policy:
    """Build a policy by name with checked parameters; ``seed`` feeds its random choices."""
    cls = policy_class(name)
    kwargs = coerce_params(cls, params or {})
    if "seed" in inspect.signature(cls).parameters:
        kwargs["seed"] = seed
    return cls(**kwargs)


def _load_builtins() -> None:
    # Importing the package registers every built-in policy module.
    import codedgd.services.policies  # noqa: F401
