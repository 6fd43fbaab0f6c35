"""The windows whose compositions are pinned in ``fixtures/compose_digests.json``: digests of
``compose_steps`` as it composed them before its leveling was made incremental (commit c20548c),
so that a faster composition is checked to give bit-identical plans."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from energon.balance.assign import compose_steps

# (distribution, ranks, steps, samples per rank and step, seed)
CASES = [
    ("lognormal1", 8, 8, 16, 0),
    ("lognormal1", 64, 8, 16, 1),
    ("lognormal1", 512, 4, 16, 2),
    ("lognormal1", 1024, 2, 8, 3),
    ("lognormal2", 8, 8, 16, 4),
    ("lognormal2", 64, 4, 8, 5),
    ("lognormal2", 256, 4, 16, 6),
    ("pareto", 16, 8, 16, 7),
    ("pareto", 128, 4, 8, 8),
    ("bimodal", 32, 8, 16, 9),
    ("bimodal", 256, 2, 16, 10),
    ("integers", 64, 4, 16, 11),  # many equal costs: ties broken by position
    ("integers", 200, 3, 5, 12),
    ("zeros", 16, 2, 4, 13),  # some free samples
    ("constant", 48, 3, 4, 14),
    ("uniform", 3, 1, 2, 15),
    ("uniform", 100, 1, 1, 16),  # as many samples as ranks
    ("lognormal1", 7, 5, 1, 17),  # fewer samples than... just enough
    ("lognormal2", 1, 4, 8, 18),  # one rank
    # windows whose repair moves samples between steps
    ("pareto", 8, 8, 4, 2),
    ("pareto", 4, 8, 2, 2),
    ("lognormal2", 4, 4, 8, 1),
    ("lognormal2", 4, 8, 2, 1),
    ("bimodal", 4, 4, 4, 0),
]


def case_costs(kind: str, count: int, seed: int) -> list[float]:
    """``count`` sample costs of one distribution family."""
    rng = np.random.default_rng(seed)
    if kind == "lognormal1":
        return rng.lognormal(0, 1, size=count).tolist()
    if kind == "lognormal2":
        return rng.lognormal(0, 2, size=count).tolist()
    if kind == "pareto":
        return (100 * (1 + rng.pareto(1.1, size=count))).tolist()
    if kind == "bimodal":
        heavy = rng.random(count) < 0.1
        return np.where(heavy, rng.uniform(50, 150, count), rng.uniform(0.5, 1.5, count)).tolist()
    if kind == "integers":
        return rng.integers(1, 6, size=count).astype(float).tolist()
    if kind == "zeros":
        return np.where(rng.random(count) < 0.3, 0.0, rng.uniform(1, 10, count)).tolist()
    if kind == "constant":
        return [2.5] * count
    assert kind == "uniform"
    return rng.uniform(1, 1000, size=count).tolist()


def plan_digest(kind: str, ranks: int, steps: int, per_rank: int, seed: int) -> str:
    """SHA-256 of the composition of one case's window (its ``[step][rank]`` index lists)."""
    costs = case_costs(kind, ranks * steps * per_rank, seed)
    plan = compose_steps(costs, ranks, steps)
    return hashlib.sha256(json.dumps(plan).encode()).hexdigest()


def case_name(case: tuple) -> str:
    return "-".join(str(part) for part in case)
