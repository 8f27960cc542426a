"""Which engine simulates a job: the event engine, or the vectorized one when it can.

:func:`simulate` and :func:`make_simulator` pick (``engine="auto"``) the vectorized engine
(:mod:`codedgd.services.sim.vectorized`) for every job it can run and the event engine
(:mod:`codedgd.services.sim.engine`) for the rest; both give the same rounds.
"""

from __future__ import annotations

from collections.abc import Callable

from codedgd.services.errors import ConfigError
from codedgd.services.job import JobConfig
from codedgd.services.job.prepare import Prepared, prepare
from codedgd.services.policies.auto import Auto
from codedgd.services.records import RoundRecord
from codedgd.services.sim.cost import CostModel
from codedgd.services.sim.engine import RoundCallback, SimulationResult, Simulator
from codedgd.services.sim.lookahead import Lookahead
from codedgd.services.sim.vectorized import VectorizedSimulator, not_vectorizable

ENGINES = ("auto", "events", "vectorized")


def make_simulator(
    config: JobConfig,
    cost: CostModel | None = None,
    *,
    engine: str = "auto",
    data_dir: str | None = None,
    prepared: Prepared | None = None,
    per_worker: bool = True,
) -> Simulator:
    """The simulator for a job: ``engine`` "events", "vectorized", or "auto" (vectorized
    whenever :func:`not_vectorizable` has nothing against it). An ``auto`` policy gets its
    look-ahead (:class:`~codedgd.services.sim.lookahead.Lookahead`) here."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown simulator engine {engine!r}: one of {', '.join(ENGINES)}")
    prepared = prepared if prepared is not None else prepare(config, data_dir)
    sim: Simulator
    if engine == "events" or (
        engine == "auto" and not_vectorizable(config, prepared, cost or CostModel())
    ):
        sim = Simulator(config, cost, data_dir=data_dir, prepared=prepared)
    else:
        sim = VectorizedSimulator(
            config, cost, data_dir=data_dir, prepared=prepared, per_worker=per_worker
        )
    policy = prepared.policy
    if isinstance(policy, Auto) and policy.chooser is None:
        # The auto policy looks ahead on this simulation's own cost model.
        policy.attach(Lookahead(config, prepared, sim.cost))
    return sim


def simulate(
    config: JobConfig,
    cost: CostModel | None = None,
    *,
    data_dir: str | None = None,
    on_record: Callable[[RoundRecord], None] | None = None,
    on_round: RoundCallback | None = None,
    engine: str = "auto",
    per_worker: bool = True,
) -> SimulationResult:
    """Simulate one job on a virtual clock with the engine :func:`make_simulator` picks.

    ``per_worker=False`` (vectorized engine only) leaves each record's per-worker response
    and compute times out.
    """
    sim = make_simulator(config, cost, engine=engine, data_dir=data_dir, per_worker=per_worker)
    return sim.run(on_record=on_record, on_round=on_round)
