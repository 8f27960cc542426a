"""How often waiting past n−s rescues an ill-conditioned decode (polynomial, cyclic).

For random arrival orders, each round goes through the registry-built policy as in a
real round (``begin_round``, ``offer`` in order until decodable, ``decode``): counts the
rounds whose first n−s arrivals decoded above ``tol`` (the policy's ``extended_rounds``)
and how many of those then decoded within it from more arrivals, and the worst relative
error of the decoded gradient.

    python -m bench.bench_residual_wait                 # polynomial, points=ordered, n=24, s=10
    python -m bench.bench_residual_wait --policy cyclic --param h=gaussian --n 20 --s 8
"""

from __future__ import annotations

import argparse

import numpy as np

from codedgd.services.codes.encoding import encode
from codedgd.services.errors import DecodeError
from codedgd.services.policies import create


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--policy", default="polynomial", choices=["polynomial", "cyclic"])
    p.add_argument("--n", type=int, default=24)
    p.add_argument("--s", type=int, default=10)
    p.add_argument(
        "--param",
        action="append",
        default=[],
        help="KEY=VALUE (default points=ordered, m=2 for polynomial)",
    )
    p.add_argument("--orders", type=int, default=200, help="random arrival orders")
    p.add_argument("--dim", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    params: dict[str, object] = {"s": a.s}
    if a.policy == "polynomial":
        params.update({"m": 2, "points": "ordered"})
    for item in a.param:
        key, _, value = item.partition("=")
        params[key] = value
    policy = create(a.policy, params)
    plan = policy.plan(a.n, a.n)
    rng = np.random.default_rng(a.seed)
    grads = rng.standard_normal((a.n, a.dim))
    msgs = [encode(grads[list(w.partitions)], w.coefficients) for w in plan.workers]
    target = grads.sum(axis=0)
    refused = 0
    worst = 0.0
    for t in range(a.orders):
        policy.begin_round(t, np.zeros(a.dim))
        for w in rng.permutation(a.n).tolist():
            if policy.offer(w, msgs[w]):
                break
        try:
            estimate = policy.decode()
        except DecodeError:
            refused += 1
            continue
        error = np.linalg.norm(estimate.gradient - target) / np.linalg.norm(target)
        worst = max(worst, float(error))
    extended = int(policy.extended_rounds)
    print(f"{a.policy} {params} n={a.n}: {a.orders} arrival orders")
    print(f"  first n-s decoded above tol: {extended}")
    print(f"  of those, decoded within tol after waiting: {extended - refused}")
    print(f"  refused (no one left): {refused}")
    print(f"  worst relative error of a decoded gradient: {worst:.2g}")


if __name__ == "__main__":
    main()
