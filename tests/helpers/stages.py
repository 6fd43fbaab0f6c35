"""In-memory upstreams for stage unit tests: a leaf whose samples are small dicts, specs over such
leaves, and the save-restore-continue check every stage must pass."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from energon.errors import ErrorPolicy, SampleException, reraise_exception
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stage import Item, Stage
from energon.plan.sources import Source


class _MemoryBuilder:
    kind = "field_map"
    sample_type = None


class MemoryLeaf:
    """``n`` samples ``{"__key__": "<name>/<i>", "n": i}`` in shards of ``shard_size``; loading one
    of ``broken`` raises a :class:`SampleException`. ``kind`` (when given) tags pointer keys."""

    builder = _MemoryBuilder()
    split_part = "train"
    remote = False
    kind = "webdataset"

    def __init__(
        self,
        n: int,
        *,
        name: str = "mem",
        shard_size: int = 10,
        broken: Sequence[int] = (),
        excluded: Sequence[int] = (),
        kind: str | None = None,
    ) -> None:
        self.n = n
        self.root = name
        self.shard_starts = list(range(0, n, shard_size)) or [0]
        self.broken = frozenset(broken)
        self.excluded = frozenset(excluded)
        self.subflavors: dict = {}
        if kind is not None:
            self.kind = kind

    def __len__(self) -> int:
        return self.n

    def prefetch(self, first: int, end: int, later: bool = False) -> None:
        pass

    def fingerprint(self) -> dict:
        return {"path": self.root, "split_part": self.split_part, "n": self.n}

    def config(self) -> dict:
        return self.fingerprint()

    def load(self, index: int, decoder: object, restore_key: tuple) -> dict:
        if index in self.broken:
            raise SampleException(f"{self.root} sample {index} is broken")
        return {"__key__": f"{self.root}/{index}", "__restore_key__": restore_key, "n": index}


def memory_spec(
    leaves: Sequence[MemoryLeaf],
    *,
    mode: str = "none",
    training: bool = True,
    weights: Sequence[float] | None = None,
    repetitions: Sequence[float] | None = None,
    num_streams: int = 2,
    **kwargs: object,
) -> PipelineSpec:
    """A spec over in-memory leaves (whole ranges), as ``get_train_dataset`` would build it."""
    sources = [
        Source(
            leaf,
            0,
            len(leaf),
            weight=weights[i] if weights else 1.0,
            repetitions=repetitions[i] if repetitions else 1.0,
        )
        for i, leaf in enumerate(leaves)
    ]
    settings: dict = {
        "batch_size": None,
        "max_samples_per_sequence": 4,
        "parallel_shard_iters": 3,
        "error_handler": reraise_exception,
    }
    settings.update(kwargs)
    return PipelineSpec(
        sources=sources,
        mode=mode,
        training=training,
        seed=7,
        num_streams=num_streams,
        **settings,
    )


def counting_policy(name: str = "hook") -> ErrorPolicy:
    """A policy that skips and counts every failure (no logging)."""
    return ErrorPolicy(name, lambda exc, sample=None, sources=None: None, tolerance=0)


def take(stage: Stage, n: int) -> list[Item]:
    """Up to ``n`` items (fewer when a finite pass ends)."""
    items = []
    for _ in range(n):
        try:
            items.append(stage.next())
        except StopIteration:
            break
    return items


def save(stages: Sequence[Stage]) -> list:
    """Every stage's state, through JSON (as a state file holds them)."""
    return json.loads(json.dumps([stage.state() for stage in stages]))


def restore(stages: Sequence[Stage], states: list) -> None:
    for stage, state in zip(stages, states):
        stage.restore(state)


def assert_resumes_exactly(
    build: Callable[[], Sequence[Stage]], splits: Sequence[int], total: int
) -> list[list]:
    """For every split point: run ``split`` items, save all states, restore them into a freshly built
    chain and run the rest; the items must equal those of an uninterrupted run. Returns the saved
    states (so tests can check that the interesting cases were hit)."""
    reference = take(build()[-1], total)
    saved = []
    for split in splits:
        first = build()
        head = take(first[-1], split)
        states = save(first)
        second = build()
        restore(second, states)
        tail = take(second[-1], total - len(head))
        assert head + tail == reference, f"resuming after {split} items diverged"
        assert save(second) == save(build_and_run(build, total)), f"end states differ ({split})"
        saved.append(states)
    return saved


def build_and_run(build: Callable[[], Sequence[Stage]], n: int) -> Sequence[Stage]:
    stages = build()
    take(stages[-1], n)
    return stages
