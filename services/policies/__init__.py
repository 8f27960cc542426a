"""Aggregation policies, one module per family, registered by name.

Use :func:`services.policies.registry.create` to build one by the name users type.
"""

from services.policies import baselines
from services.policies import comm_efficient as comm_efficient
from services.policies import cyclic as cyclic
from services.policies import erasurehead as erasurehead
from services.policies import frc as frc
from services.policies import lag as lag
from services.policies.base import Estimate, Param, Plan, Policy, RoundSpec, WorkerPlan
from services.policies.registry import create, names, policy_class, register

__all__ = [
    "Estimate",
    "Param",
    "Plan",
    "Policy",
    "RoundSpec",
    "WorkerPlan",
    "baselines",
    "create",
    "names",
    "policy_class",
    "register",
]
