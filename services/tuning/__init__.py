"""``codedgd tune``: pick the policy for a cluster from its own recorded delays.

:func:`observe` reads a finished run's per-worker timings, :func:`fit_delays` fits
their distribution (shifted exponential, Pareto; the empirical one is replayed as it is),
and :func:`search` runs every candidate policy on the simulator with those delays
(docs/tuning.md); :func:`fit_link` fits the links between workers from the probe jobs'
records. Pure numpy and the simulator: no gRPC, no client.
"""

from codedgd.services.stragglers.fitted import (
    FAMILIES,
    MIN_TAIL_SHAPE,
    DelayFit,
    Fit,
    Observations,
    ResampledDelay,
    chance_limit,
    fit_delays,
    observe,
    observe_trace,
    parse_tail,
    tail_option,
)
from codedgd.services.tuning.links import LinkFit, fit_link, link_probe_job
from codedgd.services.tuning.search import (
    SEARCHED,
    TOPOLOGIES,
    Link,
    Outcome,
    auto_prior,
    auto_prior_names,
    auto_start,
    auto_tail,
    candidates,
    label,
    redraw,
    search,
    source_tree,
    step_sizes,
    tree_options,
)

__all__ = [
    "FAMILIES",
    "MIN_TAIL_SHAPE",
    "SEARCHED",
    "TOPOLOGIES",
    "DelayFit",
    "Fit",
    "Link",
    "LinkFit",
    "Observations",
    "Outcome",
    "ResampledDelay",
    "auto_prior",
    "auto_prior_names",
    "auto_start",
    "auto_tail",
    "candidates",
    "chance_limit",
    "fit_delays",
    "fit_link",
    "label",
    "link_probe_job",
    "observe",
    "observe_trace",
    "parse_tail",
    "redraw",
    "search",
    "source_tree",
    "step_sizes",
    "tail_option",
    "tree_options",
]
