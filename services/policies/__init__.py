"""Aggregation policies, one module per family, registered by name.

Use :func:`codedgd.services.policies.registry.create` to build one by the name users type.
"""

from codedgd.services.policies import auto as auto
from codedgd.services.policies import baselines
from codedgd.services.policies import comm_efficient as comm_efficient
from codedgd.services.policies import cyclic as cyclic
from codedgd.services.policies import erasurehead as erasurehead
from codedgd.services.policies import frc as frc
from codedgd.services.policies import hetero as hetero
from codedgd.services.policies import lag as lag
from codedgd.services.policies import lag_coded as lag_coded
from codedgd.services.policies import ring as ring
from codedgd.services.policies import robust as robust
from codedgd.services.policies import tree as tree
from codedgd.services.policies.base import Estimate, Param, Plan, Policy, RoundSpec, WorkerPlan
from codedgd.services.policies.registry import create, names, policy_class, register

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
