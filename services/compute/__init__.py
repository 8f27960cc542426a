"""What a worker computes in a round, shared by the worker service and the simulator.

:mod:`.gradient` computes a worker's encoded message (per-partition gradient sums, then
the plan's coefficients, :mod:`codedgd.services.codes.encoding`); :mod:`.lazy` is LAG-WK's
upload trigger, whose threshold parameter the ``lag-wk`` policy sends. Both sit below the
coordinator-side policies and the worker, so the rule each side applies has one home.
"""
