"""Discrete-event simulation of codedgd jobs on a virtual clock (see docs/simulator.md).

:func:`simulate` runs a job description exactly as ``codedgd run`` would (same
policy objects, same gradients, same optimizer) but takes round times from a
:class:`CostModel` and the job's straggler model instead of a real cluster.
"""

from codedgd.services.sim.cost import Calibration, CostModel, calibrate
from codedgd.services.sim.engine import SimulationResult, Simulator, simulate
from codedgd.services.sim.trace import (
    TraceDelay,
    trace_from_records,
    trace_from_results,
    write_trace,
)

__all__ = [
    "Calibration",
    "CostModel",
    "SimulationResult",
    "Simulator",
    "TraceDelay",
    "calibrate",
    "simulate",
    "trace_from_records",
    "trace_from_results",
    "write_trace",
]
