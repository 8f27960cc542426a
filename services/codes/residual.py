"""Waiting past n−s arrivals when a least-squares decode is near-singular."""

from __future__ import annotations


class ResidualWait:
    """The wait-past-n−s rule of exact codes whose decode residual is checked.

    When the first ``wanted`` (n−s) arrivals decode above ``tol`` (a near-singular set),
    the round takes more arrivals until a set decodes within it or no one is left, and
    counts such rounds in ``extended_rounds``. Shared by cyclic and polynomial.
    """

    def __init__(self) -> None:
        self.good = False  # the arrivals so far decode within tol
        self.extended_rounds = 0

    def reset(self) -> None:
        self.good = False

    def judge(self, arrived: int, wanted: int, total: int, residual: float, tol: float) -> bool:
        """After an arrival with ``arrived`` >= ``wanted``: is the round over?

        True once the arrivals decode within ``tol``, or when all ``total`` arrived
        (then decode() refuses, naming the residual).
        """
        self.good = residual <= tol
        if not self.good and arrived == wanted:
            self.extended_rounds += 1
        return self.good or arrived == total

    def feasible(self, arrived: int, pending: int, wanted: int) -> bool:
        """Can the round still decode with ``pending`` more arrivals?"""
        if arrived >= wanted and not self.good:
            return pending > 0  # waiting past n−s for a better-conditioned set
        return arrived + pending >= wanted
