"""`codedgd policies` and `codedgd stragglers`: what a job can name, with its options."""

from __future__ import annotations

import argparse
from typing import Any

from codedgd.client.cli.options import EPILOG


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "policies", help="list the aggregation policies and their parameters", epilog=EPILOG
    )
    p.set_defaults(func=cmd_policies)
    p = sub.add_parser(
        "stragglers",
        help="list the straggler models (--stragglers) and their options",
        epilog=EPILOG,
    )
    p.set_defaults(func=cmd_stragglers)


def cmd_policies(args: argparse.Namespace) -> int:
    from codedgd.services.policies import names, policy_class

    for name in names():
        cls = policy_class(name)
        print(f"{name}  ({'exact' if cls.exact else 'approximate'})")
        print(f"    {cls.summary}")
        for p in cls.parameters:
            print(f"    --param {p.name}=<{p.type.__name__}>  {p.help} (default {p.default!r})")
    return 0


def cmd_stragglers(args: argparse.Namespace) -> int:
    from codedgd.services.stragglers import STRAGGLER_MODELS

    for name, info in STRAGGLER_MODELS.items():
        print(name)
        print(f"    {info.description}")
        for p in info.parameters:
            default = "required" if p.required else f"default {p.default!r}"
            print(f"    --straggler-opt {p.name}=<{p.type.__name__}>  {p.help} ({default})")
    return 0
