"""Compute-balanced batches across data-parallel ranks (opt-in: ``get_train_dataset(balance=...)``).

A *balanced step* pools the sample pointers of the ``R`` micro-batch positions of one global step,
costs each sample from its index metadata (no data read, :mod:`energon.balance.cost`), splits the
pool over the ``R`` ranks so that every rank's cost is near-equal (:mod:`energon.balance.assign`)
and lets each rank load and pack only its share (:mod:`energon.balance.executor`,
:mod:`energon.balance.packed`). Every rank computes the same split from the plan alone.
"""

from energon.balance.assign import balance_costs
from energon.balance.config import Balance
from energon.balance.cost import CostFunction, MultimodalCost, SampleCost
from energon.balance.packed import BalancedBatch, pack_balanced

__all__ = [
    "Balance",
    "BalancedBatch",
    "CostFunction",
    "MultimodalCost",
    "SampleCost",
    "balance_costs",
    "pack_balanced",
]
