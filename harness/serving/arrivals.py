"""Arrival patterns of the serving load: each is the `_target_` of a `conf/arrivals/*.yaml`
(`arrivals=gamma arrivals.burstiness=0.25`) and yields the gaps, in seconds, between one request
and the next at `rate` requests per second, drawn from the schedule's seeded generator so the
baseline and the P/D path get the same schedule. A new pattern is one function here and one YAML
beside the others; its parameters are the YAML's other keys (checked as the function's own
keyword arguments). load.py turns the gaps into the schedule."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np


class ArrivalError(ValueError):
    pass


def constant(rate: float, rng: np.random.Generator) -> Iterator[float]:
    """One request every 1/rate seconds."""
    while True:
        yield 1.0 / rate


def gamma(rate: float, rng: np.random.Generator, burstiness: float = 1.0) -> Iterator[float]:
    """Gamma-distributed gaps of mean 1/rate, as `vllm bench serve --burstiness` draws them:
    shape 1 is Poisson, below 1 burstier, above 1 steadier (coefficient of variation 1/sqrt(shape))."""
    if not burstiness > 0:
        raise ArrivalError(f"arrivals.burstiness must be > 0, got {burstiness}")
    while True:
        yield float(rng.gamma(burstiness, 1.0 / (rate * burstiness)))


def build(cfg) -> Callable[[float, np.random.Generator], Iterator[float]]:
    """The pattern a `conf/arrivals/*.yaml` names, its parameters bound."""
    from hydra.utils import instantiate

    return instantiate({k: v for k, v in cfg.items() if k != "name"}, _partial_=True)


def poisson(rate: float, rng: np.random.Generator) -> Iterator[float]:
    """Exponential gaps (a Poisson process): gamma's shape 1, drawn as gamma draws it, so a seed
    gives the schedules it gave before patterns had modules of their own."""
    return gamma(rate, rng, 1.0)
