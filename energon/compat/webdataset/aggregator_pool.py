"""``megatron.energon.flavors.webdataset.aggregator_pool``: worker processes produce items for
submitted tasks; one aggregator consumes them (in the calling process) and returns a result. This is
how the reference's preparation is organised; energon's preparation has its own pipeline
(:mod:`energon.prepare.dataset`), and this class serves code that uses the pattern directly."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["AggregatorPool", "BaseAggregator"]

T_input_data = TypeVar("T_input_data")
T_aggregation_data = TypeVar("T_aggregation_data")
T_result = TypeVar("T_result")


class BaseAggregator(Generic[T_aggregation_data, T_result]):
    """What consumes the items: ``on_start``, ``on_item`` (per batch), ``on_finish``, then
    ``get_final_result_data``."""

    def on_start(self, aggregator_pool: AggregatorPool) -> None:
        """Called once before any item."""

    def on_item(self, items: list[T_aggregation_data], aggregator_pool: AggregatorPool) -> None:
        """Called for each batch of items the workers produced."""

    def on_finish(self, aggregator_pool: AggregatorPool) -> None:
        """Called once after the last item."""

    def get_final_result_data(self) -> T_result:
        return None  # type: ignore[return-value]


def _produce(args: tuple[Callable[[Any], Iterable[Any]], Any, int]) -> list[list[Any]]:
    produce, task, batch_size = args
    batches, batch = [], []
    for item in produce(task):
        batch.append(item)
        if len(batch) >= batch_size:
            batches.append(batch)
            batch = []
    if batch:
        batches.append(batch)
    return batches


class AggregatorPool(Generic[T_input_data, T_aggregation_data, T_result]):
    """``num_workers`` processes run ``user_produce_data(task)`` for every submitted task (in
    order of submission); the aggregator gets their items in batches of ``batch_size``."""

    def __init__(
        self,
        num_workers: int,
        user_produce_data: Callable[[T_input_data], Iterable[Any]],
        aggregator: BaseAggregator[T_aggregation_data, T_result],
        *,
        batch_size: int = 1,
    ) -> None:
        self.num_workers = num_workers
        self.user_produce_data = user_produce_data
        self.aggregator = aggregator
        self.batch_size = batch_size
        self.tasks: list[T_input_data] = []

    def submit_task(self, task: T_input_data) -> None:
        self.tasks.append(task)

    def process(self) -> T_result:
        """Run every submitted task and return the aggregator's result."""
        self.aggregator.on_start(self)
        jobs = [(self.user_produce_data, task, self.batch_size) for task in self.tasks]
        if self.num_workers <= 1:
            results: Iterable[list[list[Any]]] = map(_produce, jobs)
            self._consume(results)
        else:
            with multiprocessing.get_context().Pool(self.num_workers) as pool:
                self._consume(pool.imap(_produce, jobs))
        self.aggregator.on_finish(self)
        return self.aggregator.get_final_result_data()

    def _consume(self, results: Iterable[list[list[Any]]]) -> None:
        for batches in results:
            for batch in batches:
                self.aggregator.on_item(batch, self)
