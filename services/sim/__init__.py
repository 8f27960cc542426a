"""Discrete-event simulation of codedgd jobs on a virtual clock (see docs/simulator.md).

:func:`simulate` runs a job description exactly as ``codedgd run`` would (same
policy objects, same gradients, same optimizer) but takes round times from a
:class:`CostModel` and the job's straggler model instead of a real cluster.
"""

from codedgd.services.sim.cost import Calibration, CostModel, calibrate
from codedgd.services.sim.engine import SimulationResult, Simulator
from codedgd.services.sim.engines import ENGINES, make_simulator, simulate
from codedgd.services.sim.trace import (
    TraceDelay,
    trace_from_records,
    trace_from_results,
    write_trace,
)
from codedgd.services.sim.vectorized import VectorizedSimulator

__all__ = [
    "ENGINES",
    "Calibration",
    "CostModel",
    "SimulationResult",
    "Simulator",
    "TraceDelay",
    "VectorizedSimulator",
    "calibrate",
    "make_simulator",
    "simulate",
    "trace_from_records",
    "trace_from_results",
    "write_trace",
]
