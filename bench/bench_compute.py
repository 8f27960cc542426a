"""How fast is a worker's gradient next to the bare scipy expression?

A worker's round is dominated by one logistic-regression gradient sum over its
rows, ``X.T @ (sigmoid(X @ θ) − y)`` on a CSR matrix. This bench times
:meth:`LogisticRegression.grad_sum` (and the worker's whole
``Computer.compute`` when that module is present) against that expression,
interleaved in one run so machine noise hits every variant alike, and prints a
markdown table with each variant's ratio to the plain expression. It also times
the alternatives considered for Xᵀr, which is why the model uses ``X.T @ r``.

Data: the Amazon Employee Access one-hot matrix (26,215 x 241,915, 44 non-zeros
a row) from ``codedgd.services.data.load_dataset`` when that loader and the data
directory are available, otherwise a seeded random CSR matrix of the same shape
with the same one-hot structure (one non-zero in each of 44 column blocks).

    python bench/bench_compute.py [--data auto|amazon|synthetic] [--data-dir DIR] [--repeats N]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.special import expit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from codedgd.services.models import LogisticRegression

N_ROWS, N_COLS, NNZ_PER_ROW = 26_215, 241_915, 44


def synthetic_one_hot(seed: int = 0) -> tuple[sp.csr_matrix, np.ndarray]:
    """A one-hot-like CSR matrix of the Amazon shape: one 1.0 in each of 44 column blocks."""
    rng = np.random.default_rng(seed)
    edges = np.linspace(0, N_COLS, NNZ_PER_ROW + 1).astype(np.int64)
    widths = np.diff(edges)
    cols = edges[:-1] + (rng.random((N_ROWS, NNZ_PER_ROW)) * widths).astype(np.int64)
    indptr = np.arange(0, N_ROWS * NNZ_PER_ROW + 1, NNZ_PER_ROW, dtype=np.int32)
    X = sp.csr_matrix(
        (np.ones(cols.size), cols.ravel().astype(np.int32), indptr), shape=(N_ROWS, N_COLS)
    )
    y = (rng.random(N_ROWS) < 0.94).astype(np.float64)  # Amazon is 94 % positive
    return X, y


def amazon(data_dir: str | None) -> tuple[sp.csr_matrix, np.ndarray]:
    """The real training matrix through the project's loader (raises if unavailable)."""
    # Looked up at run time: the loader may not exist yet in this checkout.
    load_dataset = importlib.import_module("codedgd.services.data").load_dataset
    kwargs = {"data_dir": data_dir} if data_dir else {}
    ds = load_dataset("amazon", {}, seed=0, **kwargs)
    return sp.csr_matrix(ds.X_train), np.asarray(ds.y_train, dtype=np.float64)


def load(kind: str, data_dir: str | None) -> tuple[str, sp.csr_matrix, np.ndarray]:
    if kind in ("auto", "amazon"):
        try:
            X, y = amazon(data_dir)
            return "amazon (codedgd.services.data.load_dataset)", X, y
        except Exception as exc:
            if kind == "amazon":
                raise
            print(f"(amazon loader unavailable: {type(exc).__name__}: {exc}; using synthetic)")
    X, y = synthetic_one_hot()
    return "synthetic one-hot, seeded", X, y


def time_interleaved(
    variants: dict[str, Callable[[], object]], repeats: int
) -> dict[str, list[float]]:
    """Round-robin timing: each repeat runs every variant once, in a rotating order."""
    names = list(variants)
    for fn in variants.values():  # warm caches and lazy imports
        fn()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=("auto", "amazon", "synthetic"), default="auto")
    parser.add_argument("--data-dir", default=os.environ.get("CODEDGD_DATA_DIR"))
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args(argv)

    source, X, y = load(args.data, args.data_dir)
    n, d = X.shape
    theta = np.random.default_rng(1).standard_normal(d) * 0.01
    model = LogisticRegression()

    XT_csr = sp.csr_matrix(X.T)  # precomputed transpose (gather kernel)

    def plain() -> np.ndarray:
        return np.asarray(X.T @ (expit(X @ theta) - y))

    def r_matmul_X() -> np.ndarray:
        return np.asarray((expit(X @ theta) - y) @ X)

    def precomputed_transpose() -> np.ndarray:
        return np.asarray(XT_csr @ (expit(X @ theta) - y))

    variants: dict[str, Callable[[], object]] = {
        "plain scipy `X.T @ (expit(X@θ) - y)`": plain,
        "LogisticRegression.grad_sum": lambda: model.grad_sum(theta, X, y),
        "`(expit(X@θ) - y) @ X`": r_matmul_X,
        "precomputed CSR of Xᵀ": precomputed_transpose,
    }
    try:
        from codedgd.services.compute.gradient import Computer, PartitionRows

        computer = Computer(model, [PartitionRows(0, X, y)], np.ones((1, 1)))
        variants["worker Computer.compute (1 partition)"] = lambda: computer.compute(theta)
    except Exception as exc:  # the worker module is optional for this bench
        print(f"(worker Computer not benchmarked: {type(exc).__name__}: {exc})")

    np.testing.assert_allclose(model.grad_sum(theta, X, y), plain(), rtol=1e-10, atol=1e-10)
    times = time_interleaved(variants, args.repeats)
    base = statistics.median(times[next(iter(variants))])

    print(
        f"\ndata: {source}: {n:,} x {d:,} CSR, {X.nnz / n:.1f} non-zeros a row; "
        f"{args.repeats} interleaved repeats\n"
    )
    print("| variant | median ms | min ms | ratio to plain (median) |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med * 1e3:.2f} | {min(ts) * 1e3:.2f} | {med / base:.2f} |")

    start = time.perf_counter()
    L = model.smoothness(X)
    print(f"\nsmoothness 0.25·λ_max(XᵀX) = {L:.4g} in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
