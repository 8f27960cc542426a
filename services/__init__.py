"""codedgd server side: coordinator, worker, policies, codes, models, data, simulator.

Everything a user configures is described by :class:`codedgd.services.job.JobConfig`;
the public entry points live in the ``client`` package.
"""
