"""Communication-efficient polynomial gradient code (Ye & Abbe style), pure numpy.

The project's reconstruction of Ye & Abbe (ICML 2018, arXiv 1802.03475): cyclic placement
with d ≥ s + m partitions per worker, polynomial encoding, and decoding from any n − s
arrivals by one (n−s)×(n−s) Vandermonde solve. Each worker sends ⌈ℓ/m⌉ numbers.

Construction (evaluation form). Worker i holds S_i = {i, .., i+d−1} (mod n) and owns an
evaluation point α_i; m further points β_0..β_{m−1} are reserved. Every gradient is cut
into m chunks g_j^(u). For partition j let Z_j(x) = Π_{k ∉ holders(j)} (x − α_k) (degree
n − d) and ℓ_u the Lagrange basis on the β points (degree m − 1). The polynomial

    p(x) = Σ_j Σ_u q_{j,u}(x)·g_j^(u),   q_{j,u}(x) = ℓ_u(x)·Z_j(x) / Z_j(β_u),

has degree ≤ n − d + m − 1 ≤ n − s − 1, takes the value p(β_u) = Σ_j g_j^(u) = g^(u) at
β_u, and at α_i only involves the partitions worker i holds (Z_j(α_i) = 0 otherwise).
Worker i sends p(α_i), i.e. coefficients C_i[j, u] = q_{j,u}(α_i). Any n − d + m
arrivals determine p (Ye & Abbe extract the leading coefficients in the monomial basis;
the values at β are the same information in the Lagrange basis, and far better
conditioned in floating point). Decoding: with V_F[i, v] = T_v(α_i) (Chebyshev basis,
v < n−d+m) and Φ[u, v] = T_v(β_u), the weights are D = Φ V_F⁻¹ and g^(u) = Σ_i D[u, i]·f_i.

Any other placement works the same way (``supports``: worker i holds supports[i] of k
partitions): with d the fewest holders of any partition, every Z_j has degree <= n − d, so
any n − d + m arrivals decode. The heterogeneity-aware code
(:mod:`codedgd.services.codes.hetero`) places partitions in proportion to speed and
encodes this way.

Points: the n + m Chebyshev nodes of [−1, 1], β at evenly spread nodes, α the rest.
``points="interleaved"`` (default) maps consecutive workers (who share partitions) to
nodes far apart, which keeps the encoding coefficients O(10) and the decode accurate on
random straggler sets up to n = 100; ``points="ordered"`` maps worker i to the i-th node
and shows the instability the group code avoids (see docs/codes.md). Clusters of
stragglers at neighbouring nodes still make V_F ill-conditioned as s grows: the
condition number and the residual of every decode are returned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.polynomial import chebyshev

from codedgd.services.codes.cyclic import LRU

POINT_LAYOUTS = ("interleaved", "ordered")


@dataclass(frozen=True)
class PolynomialDecode:
    """Decoding weights for the survivors ``workers`` (column k belongs to workers[k])."""

    workers: tuple[int, ...]  # ascending
    weights: np.ndarray  # (m, |F|) read-only
    residual: float  # max |Σ_i D[u,i] C_i[j,u'] − δ_{uu'}| over partitions j and chunks
    condition: float  # 2-norm condition number of the Chebyshev–Vandermonde V_F


def chebyshev_nodes(count: int) -> np.ndarray:
    """cos(π(2k+1)/(2·count)), k = 0..count−1: descending in (−1, 1)."""
    return np.cos(np.pi * (2 * np.arange(count) + 1) / (2 * count))


def interleave_step(n_workers: int, d: int) -> int:
    """The smallest step >= n/d coprime with n: worker i goes to node i·step mod n."""
    step = max(1, n_workers // d)
    while math.gcd(step, n_workers) != 1:
        step += 1
    return step


class PolynomialCode:
    """The polynomial code for n workers tolerating s stragglers with messages ℓ/m long."""

    def __init__(
        self,
        n_workers: int,
        s: int,
        m: int,
        d: int | None = None,
        *,
        points: str = "interleaved",
        cache_size: int = 4096,
        supports: Sequence[Sequence[int]] | None = None,
        n_partitions: int | None = None,
    ) -> None:
        self.k = n_workers
        self._supports: tuple[tuple[int, ...], ...] | None = None
        self._holders: tuple[tuple[int, ...], ...] | None = None
        if supports is not None:
            # Any placement: worker i holds supports[i] of n_partitions partitions; d is
            # the fewest holders of a partition (Z_j has n − |holders(j)| roots).
            if len(supports) != n_workers or n_partitions is None or n_partitions < 1:
                raise ValueError("a placement needs one support per worker and n_partitions")
            self.k = int(n_partitions)
            self._supports = tuple(tuple(int(j) for j in sup) for sup in supports)
            holders: list[list[int]] = [[] for _ in range(self.k)]
            for i, sup in enumerate(self._supports):
                if len(set(sup)) != len(sup) or not all(0 <= j < self.k for j in sup):
                    raise ValueError(f"worker {i}'s partitions {sup} repeat or leave 0..k-1")
                for j in sup:
                    holders[j].append(i)
            self._holders = tuple(tuple(h) for h in holders)
            d = min(len(h) for h in self._holders)
        d = s + m if d is None else d
        if s < 0 or m < 1 or d < s + m or d > n_workers:
            raise ValueError(
                f"polynomial code needs s >= 0, m >= 1 and s+m <= d <= n; "
                f"got s={s}, m={m}, d={d}, n={n_workers}"
            )
        if points not in POINT_LAYOUTS:
            raise ValueError(f"points={points!r}: choose one of {', '.join(POINT_LAYOUTS)}")
        self.n = n_workers
        self.s = s
        self.m = m
        self.d = d
        self.points = points
        self.need = n_workers - d + m  # arrivals that determine p (degree need − 1)
        nodes = chebyshev_nodes(n_workers + m)
        beta_at = [int((u + 0.5) * (n_workers + m) / m) for u in range(m)]
        rest = np.delete(nodes, beta_at)
        step = interleave_step(n_workers, d) if points == "interleaved" else 1
        self.beta = nodes[beta_at].copy()
        self.alpha = rest[(np.arange(n_workers) * step) % n_workers]
        self.encoding = self._encoding_tensor()  # (n workers, k partitions, m)
        self._phi = chebyshev.chebvander(self.beta, self.need - 1)  # (m, need)
        self._cache: LRU[tuple[int, ...], PolynomialDecode] = LRU(cache_size)

    @property
    def tolerates(self) -> int:
        """Stragglers survived: n − need = d − m (>= s)."""
        return self.d - self.m

    def support(self, worker: int) -> tuple[int, ...]:
        if self._supports is not None:
            return self._supports[worker]
        return tuple((worker + t) % self.n for t in range(self.d))

    def holders(self, partition: int) -> tuple[int, ...]:
        if self._holders is not None:
            return self._holders[partition]
        return tuple((partition - t) % self.n for t in range(self.d))

    def coefficients(self, worker: int) -> np.ndarray:
        """(d, m): rows follow :meth:`support`."""
        return self.encoding[worker, list(self.support(worker)), :].copy()

    def _encoding_tensor(self) -> np.ndarray:
        n, m = self.n, self.m
        alpha, beta = self.alpha, self.beta
        # ℓ_u(α_i) for every worker i and chunk u.
        lag = np.ones((n, m))
        for u in range(m):
            for v in range(m):
                if v != u:
                    lag[:, u] *= (alpha - beta[v]) / (beta[u] - beta[v])
        E = np.zeros((n, self.k, m), dtype=np.float64)
        for j in range(self.k):
            holders = list(self.holders(j))
            roots = np.delete(alpha, holders)  # Z_j's roots: the workers not holding j
            for u in range(m):
                ratio = np.prod(
                    (alpha[holders, None] - roots[None, :]) / (beta[u] - roots[None, :]), axis=1
                )
                E[holders, j, u] = lag[holders, u] * ratio
        return E

    def decode_weights(self, survivors: Sequence[int]) -> PolynomialDecode:
        """Weights D over all of ``survivors`` (at least ``need``; cached by set).

        With exactly ``need`` survivors D V = Φ is one square solve. With more, D is
        the least-norm solution: every extra evaluation point lowers ‖D‖, hence the
        rounding it amplifies, so a set too ill-conditioned to decode within a
        tolerance can be rescued by the next arrival.
        """
        key = tuple(sorted(survivors))
        if len(key) < self.need or len(set(key)) != len(key):
            raise ValueError(f"need {self.need} distinct survivors, got {len(set(key))}")
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        V = chebyshev.chebvander(self.alpha[list(key)], self.need - 1)  # (|F|, need)
        if len(key) == self.need:
            D = np.linalg.solve(V.T, self._phi.T).T  # D V = Φ
        else:
            D = np.linalg.lstsq(V.T, self._phi.T, rcond=None)[0].T
        effective = np.einsum("ui,ijv->ujv", D, self.encoding[list(key)])
        target = np.eye(self.m)[:, None, :]
        residual = float(np.max(np.abs(effective - target)))
        D.flags.writeable = False
        out = PolynomialDecode(key, D, residual, float(np.linalg.cond(V)))
        self._cache.put(key, out)
        return out

    def weights(
        self, arrival_order: Sequence[int], count: int | None = None
    ) -> tuple[np.ndarray, PolynomialDecode]:
        """(m, k) weights aligned with the first k = ``count`` (default ``need``) arrivals."""
        first = list(arrival_order)[: self.need if count is None else count]
        dec = self.decode_weights(first)
        idx = np.searchsorted(np.asarray(dec.workers), np.asarray(first))
        return dec.weights[:, idx], dec

    @property
    def cache(self) -> LRU[tuple[int, ...], PolynomialDecode]:
        return self._cache
