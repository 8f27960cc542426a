"""codedgd's Python client: the public API, in dataclasses (protobuf never leaks).

    from codedgd.client import Client, JobConfig, Component

    async with Client("127.0.0.1:50051") as client:
        job_id = await client.submit(JobConfig(workers=4, policy=Component("cyclic", {"s": 1})))
        async for record in client.watch(job_id):
            print(record.round, record.loss)

:class:`Client` talks to a running coordinator; :func:`run_local` runs one job with a
coordinator and worker processes on this machine (what ``codedgd run`` does);
:class:`Simulator` runs the same job on a virtual clock (``codedgd simulate``). The names
are imported on first use, so ``import codedgd.client`` (and the ``codedgd`` command) stays
cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from codedgd.client.api import Client, CoordinatorStatus, CoordinatorUnavailable, JobState
    from codedgd.client.local import LocalRun, run_local
    from codedgd.services.errors import CodedGDError, ConfigError, JobFailed
    from codedgd.services.job import Component, JobConfig
    from codedgd.services.models.saved import SavedModel, load_model, save_model
    from codedgd.services.records import RoundRecord, read_results
    from codedgd.services.sim import CostModel, Simulator

_EXPORTS = {
    "Client": "codedgd.client.api",
    "CoordinatorStatus": "codedgd.client.api",
    "CoordinatorUnavailable": "codedgd.client.api",
    "JobState": "codedgd.client.api",
    "LocalRun": "codedgd.client.local",
    "run_local": "codedgd.client.local",
    "CodedGDError": "codedgd.services.errors",
    "ConfigError": "codedgd.services.errors",
    "JobFailed": "codedgd.services.errors",
    "Component": "codedgd.services.job",
    "JobConfig": "codedgd.services.job",
    "RoundRecord": "codedgd.services.records",
    "SavedModel": "codedgd.services.models.saved",
    "load_model": "codedgd.services.models.saved",
    "save_model": "codedgd.services.models.saved",
    "read_results": "codedgd.services.records",
    "CostModel": "codedgd.services.sim",
    "Simulator": "codedgd.services.sim",
}


def __getattr__(name: str) -> Any:
    """Import an exported name on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'codedgd.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "Client",
    "CodedGDError",
    "Component",
    "ConfigError",
    "CoordinatorStatus",
    "CoordinatorUnavailable",
    "CostModel",
    "JobConfig",
    "JobFailed",
    "JobState",
    "LocalRun",
    "RoundRecord",
    "SavedModel",
    "Simulator",
    "load_model",
    "read_results",
    "run_local",
    "save_model",
]
