"""Compute-balanced batches across data-parallel ranks (opt-in: ``get_train_dataset(balance=...)``).

Balanced steps are planned a *window* at a time: the sample pointers of the ``R`` micro-batch
positions of each of ``Balance.window`` global steps are pooled, each sample is costed from its
index metadata (no data read, :mod:`energon.balance.cost`), the pool is composed into steps of
``R`` near-equal shares (:mod:`energon.balance.assign`, within the bound of
:mod:`energon.balance.bound`) and each rank loads and packs only its
share (:mod:`energon.pipeline.balanced_executor`, :mod:`energon.balance.packed`). Every rank
computes the same plan from the plan of the data alone, or, with ``Balance(plan_store=DIR)``,
each window is planned by one rank and read by the others (:mod:`energon.balance.plans`).
"""

from energon.balance.assign import balance_costs, compose_steps
from energon.balance.config import Balance
from energon.balance.cost import BalanceCostError, CostFunction, MultimodalCost, SampleCost
from energon.balance.fit import CostFit, FittedCost, fit_cost
from energon.balance.packed import BalancedBatch, pack_balanced
from energon.balance.plans import LocalPlans, PlanSource, SharedPlans, publish_plans

__all__ = [
    "Balance",
    "BalanceCostError",
    "BalancedBatch",
    "CostFit",
    "CostFunction",
    "FittedCost",
    "LocalPlans",
    "PlanSource",
    "MultimodalCost",
    "SampleCost",
    "SharedPlans",
    "balance_costs",
    "compose_steps",
    "fit_cost",
    "pack_balanced",
    "publish_plans",
]
