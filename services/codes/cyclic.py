"""Cyclic repetition gradient code (Tandon et al., ICML 2017, Algorithm 2), pure numpy.

Worker i holds partitions S_i = {i, i+1, .., i+s} (mod n) and sends
f_i = Σ_{j∈S_i} B[i, j]·g_j. B is built from a matrix H ∈ R^{s×n} with H·1 = 0:
row i has B[i, i] = 1 and B[i, S_i∖{i}] = −(H[:, S_i∖{i}])⁻¹ H[:, i], so every row
of B lies in the null space of H, an (n−s)-dimensional space that contains 1. For a
generic H any n−s rows of B span it, hence for every set F of n−s survivors there is
a with aᵀB_F = 1ᵀ and Σ_{i∈F} a_i f_i = Σ_j g_j = g.

Two choices of H:

- ``gaussian``: the paper's: i.i.d. N(0, 1) first n−1 columns, last column minus their
  sum. The s×s blocks it inverts are occasionally ill-conditioned, which puts large
  entries in B and loses digits in the decode as n grows.
- ``orthonormal`` (default): a Gaussian matrix projected onto 1^⊥ and orthonormalised
  (QR), so H has orthonormal rows and still H·1 = 0; of ``draws`` (16) seeded draws the
  one whose worst s×s block H[:, S_i∖{i}] is best conditioned is kept, since those
  blocks are what B inverts. Measured better conditioned than the paper's H
  (see docs/codes.md); still random, so still generic.

Decoding solves B_Fᵀ a = 1 by least squares in float64, caches a per survivor set and
returns the residual max |aᵀB_F − 1ᵀ| so callers can refuse a bad decode.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from codedgd.services.codes.residual import ResidualWait
from codedgd.services.errors import DecodeError

H_KINDS = ("orthonormal", "gaussian")

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A small least-recently-used cache (decoding vectors per survivor set)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


def cyclic_support(n_workers: int, s: int, worker: int) -> tuple[int, ...]:
    """S_i = (i, i+1, .., i+s) mod n: the partitions worker i holds, in this order."""
    return tuple((worker + t) % n_workers for t in range(s + 1))


def gaussian_h(n_workers: int, s: int, rng: np.random.Generator) -> np.ndarray:
    """The paper's H: N(0, 1) first n−1 columns, the last one minus their sum."""
    H = np.empty((s, n_workers), dtype=np.float64)
    H[:, :-1] = rng.standard_normal((s, n_workers - 1))
    H[:, -1] = -H[:, :-1].sum(axis=1)
    return H


def orthonormal_h(n_workers: int, s: int, rng: np.random.Generator) -> np.ndarray:
    """An H with orthonormal rows orthogonal to 1 (so H·1 = 0), from a random Gaussian."""
    G = rng.standard_normal((n_workers, s))
    G -= G.mean(axis=0)  # columns in 1^⊥
    Q, _ = np.linalg.qr(G)  # orthonormal columns spanning the same subspace of 1^⊥
    H: np.ndarray = np.ascontiguousarray(Q.T)
    return H


def block_condition(H: np.ndarray) -> float:
    """max_i cond(H[:, S_i∖{i}]): the worst s×s block the construction of B inverts."""
    s, n = H.shape
    if s == 0:
        return 1.0
    index = (np.arange(n)[:, None] + np.arange(1, s + 1)[None, :]) % n  # (n, s)
    blocks = np.transpose(H[:, index], (1, 0, 2))  # (n, s, s): block i = H[:, S_i∖{i}]
    return float(np.max(np.linalg.cond(blocks)))


def make_h(
    kind: str, n_workers: int, s: int, rng: np.random.Generator, draws: int | None = None
) -> np.ndarray:
    """H of the given kind; of ``draws`` seeded draws keep the best :func:`block_condition`.

    ``draws`` defaults to 16 for ``orthonormal`` and 1 (the paper's H) for ``gaussian``.
    """
    if kind not in H_KINDS:
        raise ValueError(f"unknown H kind {kind!r}: choose one of {', '.join(H_KINDS)}")
    build = orthonormal_h if kind == "orthonormal" else gaussian_h
    count = draws if draws is not None else (16 if kind == "orthonormal" else 1)
    best: tuple[float, np.ndarray] | None = None
    for _ in range(max(count, 1)):
        H = build(n_workers, s, rng)
        score = block_condition(H) if count > 1 else 0.0
        if best is None or score < best[0]:
            best = (score, H)
    assert best is not None
    return best[1]


def cyclic_matrix(H: np.ndarray) -> np.ndarray:
    """The n×n cyclic encoding matrix B built from H (s×n, H·1 = 0); s = 0 gives I."""
    s, n = H.shape
    B = np.zeros((n, n), dtype=np.float64)
    for i in range(n):
        B[i, i] = 1.0
        if s == 0:
            continue
        others = [(i + t) % n for t in range(1, s + 1)]
        B[i, others] = -np.linalg.solve(H[:, others], H[:, i])
    return B


@dataclass(frozen=True)
class DecodingVector:
    """a with aᵀB_F ≈ 1ᵀ for the survivors ``workers`` (a[k] belongs to workers[k])."""

    workers: tuple[int, ...]  # ascending
    a: np.ndarray  # read-only float64
    residual: float  # max |aᵀB_F − 1ᵀ|
    condition: float  # 2-norm condition number of B_F (largest / smallest singular value)


class CyclicCode:
    """The cyclic repetition code B(n, s) with its cached least-squares decoder."""

    def __init__(
        self,
        n_workers: int,
        s: int,
        *,
        h: str = "orthonormal",
        rng: np.random.Generator | None = None,
        draws: int | None = None,
        cache_size: int = 4096,
    ) -> None:
        if not 0 <= s < n_workers:
            raise ValueError(f"cyclic code needs 0 <= s < n, got s={s}, n={n_workers}")
        self.n = n_workers
        self.s = s
        self.h_kind = h
        rng = rng if rng is not None else np.random.default_rng(0)
        self.H = make_h(h, n_workers, s, rng, draws)
        self.B = cyclic_matrix(self.H)
        self._cache: LRU[tuple[int, ...], DecodingVector] = LRU(cache_size)

    @classmethod
    def from_matrix(cls, B: np.ndarray, s: int, *, cache_size: int = 4096) -> CyclicCode:
        """The code whose encoding matrix is ``B`` (n×n): what a worker that receives B
        (an inner node of a CodedReduce tree) decodes its children with."""
        n = int(B.shape[0])
        if B.shape != (n, n) or not 0 <= s < n:
            raise ValueError(f"a cyclic code needs an n×n B and 0 <= s < n, got {B.shape}, s={s}")
        code = cls.__new__(cls)
        code.n, code.s, code.h_kind = n, s, "given"
        code.H = np.zeros((s, n))
        code.B = np.array(B, dtype=np.float64)
        code._cache = LRU(cache_size)
        return code

    def support(self, worker: int) -> tuple[int, ...]:
        return cyclic_support(self.n, self.s, worker)

    def coefficients(self, worker: int) -> np.ndarray:
        """Worker i's coefficients, one row per partition of :meth:`support`, one chunk."""
        return self.B[worker, list(self.support(worker))].reshape(-1, 1).copy()

    def decoding_vector(self, survivors: Sequence[int]) -> DecodingVector:
        """Least-squares a for the survivor set (any order; cached by the set)."""
        key = tuple(sorted(survivors))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        BF = self.B[list(key)]
        a, _, _, sv = np.linalg.lstsq(BF.T, np.ones(self.n), rcond=None)
        a = np.asarray(a, dtype=np.float64)
        residual = float(np.max(np.abs(a @ BF - 1.0)))
        condition = float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf")
        a.flags.writeable = False
        out = DecodingVector(key, a, residual, condition)
        self._cache.put(key, out)
        return out

    def weights(self, arrival_order: Sequence[int]) -> tuple[np.ndarray, DecodingVector]:
        """The decoding weights aligned with ``arrival_order`` (and the cached vector)."""
        vec = self.decoding_vector(arrival_order)
        idx = np.searchsorted(np.asarray(vec.workers), np.asarray(arrival_order))
        return vec.a[idx], vec

    @property
    def cache(self) -> LRU[tuple[int, ...], DecodingVector]:
        return self._cache


class CyclicRound:
    """One round's decode of a cyclic code's messages, wherever it runs.

    The coordinator's ``cyclic`` and ``codedreduce`` policies decode their workers'
    messages with it, and so does every inner node of a CodedReduce tree (its
    children's partial sums): one implementation of the rule. Messages arrive by
    position (the code's row); once n−s have arrived the survivors' decoding vector a
    (aᵀB_F = 1ᵀ, least squares, cached per set) is judged: within ``tol`` the round is
    decodable; above it (a near-singular B_F) it takes each further arrival until a set
    decodes within tol, or every position arrived and :meth:`combine` refuses.
    """

    def __init__(self, code: CyclicCode, tol: float) -> None:
        self.code = code
        self.tol = tol
        self.wait = ResidualWait()
        self.arrived: list[int] = []
        self._rows: np.ndarray | None = None

    @property
    def wanted(self) -> int:
        return self.code.n - self.code.s

    def reset(self, length: int) -> None:
        """A new round of messages of ``length`` floats (the buffer is reused)."""
        if self._rows is None or self._rows.shape != (self.code.n, length):
            self._rows = np.empty((self.code.n, length), dtype=np.float64)
        self.arrived = []
        self.wait.reset()

    @property
    def decodable(self) -> bool:
        return self.wait.good or len(self.arrived) == self.code.n

    def add(self, position: int, message: np.ndarray) -> bool:
        """A message of ``position``; True once the round is over (see the class doc).

        Arrivals after the round is decodable are not kept (not needed).
        """
        if self._rows is None:
            raise DecodeError("cyclic round used before reset()")
        if self.wait.good:
            return True
        self._rows[len(self.arrived)] = message
        self.arrived.append(position)
        if len(self.arrived) < self.wanted:
            return False
        _, vec = self.code.weights(self.arrived)  # cached per set: combine() reuses it
        return self.wait.judge(len(self.arrived), self.wanted, self.code.n, vec.residual, self.tol)

    def feasible(self, pending: int) -> bool:
        """Can the round still decode with ``pending`` more arrivals?"""
        return self.wait.feasible(len(self.arrived), pending, self.wanted)

    def combine(self) -> tuple[np.ndarray, DecodingVector]:
        """Σ_{i∈F} a_i·message_i and the decoding vector; DecodeError if not within tol."""
        if self._rows is None or len(self.arrived) < self.wanted:
            raise DecodeError(f"{len(self.arrived)} of the {self.wanted} messages needed")
        a, vec = self.code.weights(self.arrived)
        if not vec.residual <= self.tol:
            raise DecodeError(
                f"decode residual max|a^T B_F - 1^T| = {vec.residual:.3g} exceeds "
                f"tol={self.tol:g} for survivors {list(vec.workers)} (condition number "
                f"{vec.condition:.3g}), and no other worker is left to wait for"
            )
        out: np.ndarray = a @ self._rows[: len(self.arrived)]
        return out, vec
