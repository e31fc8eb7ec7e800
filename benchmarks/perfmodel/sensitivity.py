"""Which uncertain constant moves a projection how far: the same trace priced with one constant moved.

The moves are chosen ranges, not measured bounds. They span what an uncalibrated efficiency, a faster
or slower host, and a rougher estimate of the elementwise and logits traffic could plausibly be.
"""
from __future__ import annotations

import dataclasses

from benchmarks.perfmodel.host_model import HostModel
from benchmarks.perfmodel.projection import Constants


def sensitivity_variants(constants: Constants, host: HostModel) -> dict[str, tuple[Constants, HostModel]]:
    """The host-model projection's uncertain constants, each moved alone."""
    c, r = constants, dataclasses.replace
    return {
        "as measured": (c, host),
        "efficiency 0.3": (r(c, efficiency=0.3), host), "efficiency 0.9": (r(c, efficiency=0.9), host),
        "bandwidth efficiency 0.7": (r(c, bandwidth_efficiency=0.7), host),
        "seconds/op x0.25": (c, host.scaled(seconds_per_op=0.25)),
        "seconds/op x0.5": (c, host.scaled(seconds_per_op=0.5)),
        "seconds/op x2": (c, host.scaled(seconds_per_op=2.0)),
        "gap +0.5 ms": (c, r(host, gap_s=host.gap_s + 5e-4)),
        "elementwise bytes x0.5": (r(c, elementwise_bytes_per_hidden=c.elementwise_bytes_per_hidden / 2), host),
        "elementwise bytes x2": (r(c, elementwise_bytes_per_hidden=c.elementwise_bytes_per_hidden * 2), host),
        "logit bytes x2": (r(c, logit_bytes=c.logit_bytes * 2), host),
        "no host (GPU time only)": (c, r(host, seconds_per_op=0.0, gap_s=0.0)),
    }
