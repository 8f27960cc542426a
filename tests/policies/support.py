"""Drive a policy like the coordinator does, with messages encoded like the worker does."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from codedgd.services.codes.encoding import encode
from codedgd.services.policies import Estimate, Plan, Policy, create


def planned(
    name: str, n: int, params: Mapping[str, Any] | None = None, seed: int = 0
) -> tuple[Policy, Plan]:
    """A policy from the registry and its plan for n workers (k = n)."""
    policy = create(name, params or {}, seed=seed)
    return policy, policy.plan(n, policy.default_partitions(n))


def messages(plan: Plan, grads: np.ndarray) -> list[np.ndarray]:
    """Every worker's message for per-partition gradient sums ``grads`` (k, ℓ)."""
    out = []
    for wp in plan.workers:
        payload = encode(grads[list(wp.partitions)], wp.coefficients)
        assert payload.shape == (plan.payload_length(len(out), grads.shape[1]),)
        out.append(payload)
    return out


def run_round(
    policy: Policy, msgs: list[np.ndarray], order: Iterable[int], dim: int, t: int = 0
) -> Estimate:
    """begin_round, offer in ``order`` until decodable, decode (fails if never decodable)."""
    spec = policy.begin_round(t, np.zeros(dim))
    contacted = set(spec.workers)
    for w in order:
        assert w in contacted
        if policy.offer(w, msgs[w]):
            return policy.decode()
    raise AssertionError(f"{policy.name}: not decodable after offering {list(order)}")


def relative_error(estimate: np.ndarray, target: np.ndarray) -> float:
    return float(np.linalg.norm(estimate - target) / np.linalg.norm(target))
