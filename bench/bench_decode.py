"""Decoding of the gradient codes: numerical error, conditioning and time, against n and ℓ.

Everything goes through the registry-built policies and the worker's own encoder, as in a
real round: ``policy.plan`` → each worker's message ``encode(g[partitions], coefficients)``
→ ``begin_round`` / ``offer`` in a random order with the stragglers never arriving →
``decode``.

Accuracy: the per-partition gradient sums g_j have i.i.d. N(0, 1) entries (no common
direction, so ‖Σ g_j‖ is small against the messages: a pessimistic setting). For each n,
each code and each of ``--seeds`` code seeds, the worst relative error ‖ĝ − g‖/‖g‖ over
``--sets`` random straggler sets plus every *contiguous* run of s stragglers (neighbouring
workers for the cyclic code; neighbouring evaluation points for the polynomial code) is
recorded with the condition number of the system solved (cyclic: B_F; polynomial: the
Chebyshev–Vandermonde V_F; group-mds: the worst m×m Γ block of the round). The table shows
the median and the maximum over seeds.

Time: decode seconds per round (``policy.decode()`` alone) with random messages of length
ℓ/m in separate arrays, the decoding weights cached (steady state; a new straggler set adds
one small solve, shown as "first"). The cyclic, polynomial and group-mds policies copy each
message into their round buffer inside ``offer`` (between arrivals), not counted here.

    python -m bench.bench_decode                        # writes docs/img/codes-decode.{md,png}
    python -m bench.bench_decode --quick                # a smoke run, nothing written
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from codedgd.services.codes.encoding import encode
from codedgd.services.policies import Plan, Policy, create
from codedgd.services.policies.comm_efficient import GroupMDS, Polynomial
from codedgd.services.policies.cyclic import CyclicRepetition

S, M = 3, 2  # stragglers tolerated and chunks: d = s + m = 5 divides every n below

CODES: list[tuple[str, str, dict[str, Any]]] = [
    ("cyclic (orthonormal H)", "cyclic", {"s": S, "h": "orthonormal", "tol": 1.0}),
    ("cyclic (Gaussian H)", "cyclic", {"s": S, "h": "gaussian", "tol": 1.0}),
    ("polynomial (interleaved)", "polynomial", {"s": S, "m": M, "tol": 1e300}),
    ("polynomial (ordered)", "polynomial", {"s": S, "m": M, "points": "ordered", "tol": 1e300}),
    ("group-mds", "group-mds", {"s": S, "m": M}),
]
TIMED: list[tuple[str, str, dict[str, Any]]] = [
    ("frc", "frc", {"s": 4}),
    ("erasurehead", "erasurehead", {"r": 5}),
    ("cyclic", "cyclic", {"s": S}),
    ("polynomial", "polynomial", {"s": S, "m": M}),
    ("group-mds", "group-mds", {"s": S, "m": M}),
]


@dataclass(frozen=True)
class Accuracy:
    code: str
    n: int
    errors: list[float]  # worst relative error per seed
    conditions: list[float]  # worst condition number per seed


def _messages(plan: Plan, grads: np.ndarray) -> list[np.ndarray]:
    return [encode(grads[list(wp.partitions)], wp.coefficients) for wp in plan.workers]


def _condition(policy: Policy) -> float:
    if isinstance(policy, CyclicRepetition | GroupMDS | Polynomial):
        return float(policy.last_condition)
    return 1.0


def _straggler_sets(policy: Policy, n: int, count: int, rng: np.random.Generator) -> list[set[int]]:
    sets = [set(rng.choice(n, size=S, replace=False).tolist()) for _ in range(count)]
    if isinstance(policy, Polynomial) and policy.code is not None:
        by_point = np.argsort(policy.code.alpha).tolist()  # neighbouring evaluation points
        sets += [set(by_point[i : i + S]) for i in range(n - S + 1)]
    else:
        sets += [{(i + t) % n for t in range(S)} for i in range(n)]
    return sets


def accuracy(
    name: str, params: dict[str, Any], n: int, seed: int, sets: int
) -> tuple[float, float]:
    policy = create(name, params, seed=seed)
    plan = policy.plan(n, n)
    rng = np.random.default_rng(10_000 + seed)
    dim = 64
    grads = rng.standard_normal((n, dim))
    target = grads.sum(axis=0)
    msgs = _messages(plan, grads)
    worst_err = worst_cond = 0.0
    for t, lost in enumerate(_straggler_sets(policy, n, sets, rng)):
        policy.begin_round(t, np.zeros(dim))
        order = rng.permutation([w for w in range(n) if w not in lost]).tolist()
        for w in order:
            if policy.offer(w, msgs[w]):
                break
        est = policy.decode()
        err = float(np.linalg.norm(est.gradient - target) / np.linalg.norm(target))
        worst_err = max(worst_err, err)
        worst_cond = max(worst_cond, _condition(policy))
    return worst_err, worst_cond


def decode_seconds(
    name: str, params: dict[str, Any], n: int, dim: int, repeats: int
) -> tuple[float, float]:
    """(first decode incl. the solve for a new straggler set, median cached decode) seconds."""
    policy = create(name, params, seed=0)
    plan = policy.plan(n, n)
    rng = np.random.default_rng(0)
    length = plan.payload_length(0, dim)
    payloads = rng.standard_normal((n, length))  # distinct memory per worker, as on the wire
    lost = set(rng.choice(n, size=min(S, n - 1), replace=False).tolist())
    order = [w for w in rng.permutation(n).tolist() if w not in lost]

    def one_round(t: int) -> float:
        policy.begin_round(t, np.zeros(dim))
        for w in order:
            if policy.offer(w, payloads[w]):
                break
        start = time.perf_counter()
        policy.decode()
        return time.perf_counter() - start

    first = one_round(0)
    cached = [one_round(t) for t in range(1, repeats + 1)]
    return first, statistics.median(cached)


def _fmt(x: float) -> str:
    return f"{x:.1e}" if x != 0 else "0"


def accuracy_table(rows: Sequence[Accuracy], ns: Sequence[int]) -> str:
    out = [
        "| code | " + " | ".join(f"n = {n}" for n in ns) + " |",
        "|---|" + "---|" * len(ns),
    ]
    codes = list(dict.fromkeys(r.code for r in rows))
    for what, pick in (("max relative error", "errors"), ("condition number", "conditions")):
        out.append(f"| **{what}** (median / max over seeds) |" + " |" * len(ns))
        for code in codes:
            cells = []
            for n in ns:
                r = next(x for x in rows if x.code == code and x.n == n)
                values: list[float] = getattr(r, pick)
                cells.append(f"{_fmt(statistics.median(values))} / {_fmt(max(values))}")
            out.append(f"| {code} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def time_table(
    times: dict[tuple[str, int, int], tuple[float, float]], ns: Sequence[int], dims: Sequence[int]
) -> str:
    out = [
        "| code | ℓ | " + " | ".join(f"n = {n}" for n in ns) + " |",
        "|---|---|" + "---|" * len(ns),
    ]
    for code in dict.fromkeys(k[0] for k in times):
        for d in dims:
            cells = []
            for n in ns:
                first, cached = times[(code, n, d)]
                cells.append(f"{cached * 1e3:.2f} ({first * 1e3:.2f})")
            out.append(f"| {code} | {d:,} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot(
    rows: Sequence[Accuracy],
    times: dict[tuple[str, int, int], tuple[float, float]],
    ns: Sequence[int],
    dims: Sequence[int],
    path: Path,
) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return False
    colors = {
        "cyclic (orthonormal H)": "C0",
        "cyclic (Gaussian H)": "C1",
        "polynomial (interleaved)": "C2",
        "polynomial (ordered)": "C3",
        "group-mds": "C4",
        "cyclic": "C0",
        "polynomial": "C2",
        "frc": "C7",
        "erasurehead": "C5",
    }
    # Constrained layout and two-line titles: the three titles never run into each other.
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8), layout="constrained")
    codes = list(dict.fromkeys(r.code for r in rows))
    for code in codes:
        mine = [next(x for x in rows if x.code == code and x.n == n) for n in ns]
        for ax, pick in ((axes[0], "errors"), (axes[1], "conditions")):
            med = [statistics.median(getattr(r, pick)) for r in mine]
            top = [max(getattr(r, pick)) for r in mine]
            ax.plot(ns, med, marker="o", label=code, color=colors.get(code))
            ax.plot(ns, top, linestyle=":", color=colors.get(code))
    axes[0].set_title("max relative error of ĝ\n(solid: median, dotted: max over seeds)")
    axes[1].set_title("condition number of the system solved\n(polynomial: both layouts)")
    big = max(dims)
    for code in dict.fromkeys(k[0] for k in times):
        ms = [times[(code, n, big)][1] * 1e3 for n in ns]
        axes[2].plot(ns, ms, marker="o", label=code, color=colors.get(code))
    axes[2].set_title(f"decode time per round, ℓ = {big:,}\n(cached weights)")
    axes[2].set_ylabel("ms")
    for ax in axes:
        ax.set_xlabel("n workers")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=8)
    fig.suptitle(f"Decoding the gradient codes, s = {S}, m = {M}", fontsize="medium")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, action="append", help="worker counts (default 10 20 50 100)")
    p.add_argument("--dim", type=int, action="append", help="ℓ for timing (default 1e3 1e4 1e5)")
    p.add_argument("--seeds", type=int, default=8, help="code seeds per n (default 8)")
    p.add_argument("--sets", type=int, default=20, help="random straggler sets per seed")
    p.add_argument("--repeats", type=int, default=7, help="timed decodes per point")
    p.add_argument("--out", type=Path, default=Path("docs/img"), help="where to write")
    p.add_argument("--quick", action="store_true", help="small smoke run, writes nothing")
    args = p.parse_args(argv)
    ns = args.n or ([10, 20] if args.quick else [10, 20, 50, 100])
    dims = args.dim or ([1000] if args.quick else [1_000, 10_000, 100_000])
    seeds = 2 if args.quick else args.seeds
    sets = 3 if args.quick else args.sets
    started = time.perf_counter()

    rows: list[Accuracy] = []
    for (label, name, params), n in itertools.product(CODES, ns):
        results = [accuracy(name, params, n, seed, sets) for seed in range(seeds)]
        rows.append(Accuracy(label, n, [e for e, _ in results], [c for _, c in results]))
        print(
            f"{label:26s} n={n:4d}  error median {statistics.median(rows[-1].errors):.1e} "
            f"max {max(rows[-1].errors):.1e}  cond max {max(rows[-1].conditions):.1e}"
        )

    times: dict[tuple[str, int, int], tuple[float, float]] = {}
    for (label, name, params), n, dim in itertools.product(TIMED, ns, dims):
        times[(label, n, dim)] = decode_seconds(name, params, n, dim, args.repeats)
        first, cached = times[(label, n, dim)]
        print(
            f"{label:12s} n={n:4d} ℓ={dim:8d}  decode {cached * 1e3:8.3f} ms "
            f"(first {first * 1e3:.3f} ms)"
        )

    md = [
        "<!-- written by: python -m bench.bench_decode -->",
        f"Decoding accuracy, s = {S}, m = {M} (d = {S + M}); {seeds} code seeds, each the worst "
        f"of {sets} random straggler sets plus every contiguous run of s stragglers; "
        "g_j with i.i.d. N(0, 1) entries, ℓ = 64.",
        "",
        accuracy_table(rows, ns),
        "",
        "Decode time per round in ms: median with cached weights (first decode of a new "
        "straggler set, including its solve, in parentheses). frc: s = 4; erasurehead: r = 5, "
        f"K = n/2; cyclic, polynomial, group-mds: s = {S}, m = {M}.",
        "",
        time_table(times, ns, dims),
        "",
        f"Total bench time {time.perf_counter() - started:.0f} s.",
    ]
    text = "\n".join(md) + "\n"
    print()
    print(text)
    if args.quick:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "codes-decode.md").write_text(text)
    if plot(rows, times, ns, dims, args.out / "codes-decode.png"):
        print(f"wrote {args.out / 'codes-decode.png'}")
    print(f"wrote {args.out / 'codes-decode.md'}")


if __name__ == "__main__":
    main()
