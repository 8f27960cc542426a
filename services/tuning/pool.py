"""Where a run's processes ran: one machine whose cores they shared, or machines apart.

A worker says which machine it runs on in its Hello, and the coordinator records it with
the place it takes, beside its own (``RoundRecord.machines``,
``RoundRecord.coordinator_machine``; :mod:`codedgd.services.machine`). A pool on one
machine pays every message's CPU on its shared cores, which ``codedgd tune`` then charges
every candidate (``--cores``); a pool of a machine per process does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from codedgd.services.machine import Machine, one_machine
from codedgd.services.records import RoundRecord


@dataclass(frozen=True)
class Pool:
    """The machines a run's records name: each place's last holder's, the coordinator's."""

    n: int
    places: dict[int, Machine]  # place → its holder's machine (absent: not said)
    coordinator: Machine | None

    @property
    def known(self) -> bool:
        """Whether the coordinator and every place named their machine."""
        return self.coordinator is not None and len(self.places) == self.n

    @property
    def one(self) -> Machine | None:
        """The one machine every process ran on (None: not one, or not known)."""
        if not self.known:
            return None
        return one_machine(self.coordinator, (self.places[w] for w in range(self.n)))

    @property
    def machines(self) -> int:
        """How many machines the processes ran on (when :attr:`known`)."""
        pool = [*self.places.values(), *([self.coordinator] if self.coordinator else [])]
        return len({m.id for m in pool})

    def describe(self) -> str:
        one = self.one
        if one is not None:
            return f"the coordinator and its {self.n} workers ran on one machine ({one.cores()})"
        return (
            f"the coordinator and its {self.n} workers ran on {self.machines} machines"
            if self.known
            else "where the processes ran is not recorded"
        )


def pool_of(records: Sequence[RoundRecord], n: int) -> Pool:
    """The machines of a run's places (each one's latest holder that named one) and of its
    coordinator, from its records; nothing from the simulator's or older files."""
    places: dict[int, Machine] = {}
    coordinator: Machine | None = None
    for record in records:
        for w, machine in record.machines.items():
            if 0 <= w < n and machine.known:
                places[w] = machine
        for w in record.holders:
            if w not in record.machines:
                places.pop(w, None)  # a new holder that named no machine
        if record.coordinator_machine is not None and record.coordinator_machine.known:
            coordinator = record.coordinator_machine
    return Pool(n, places, coordinator)
