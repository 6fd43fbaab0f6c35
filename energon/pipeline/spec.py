"""``PipelineSpec``: everything a worker needs to build any logical stream (picklable, no open files)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from energon.errors import ErrorBudget, ErrorHandler, MetadatasetError
from energon.pipeline.blend_by import BlendBy
from energon.plan.edits import Exclusion, PlanEdits
from energon.plan.schedules import FlatWeights, Mixture, WeightChange, WeightFunction
from energon.plan.sharding import stream_count, stream_counts, stream_counts_array
from energon.task_encoder.base import DefaultTaskEncoder, TaskEncoder

if TYPE_CHECKING:
    from energon.balance.config import Balance
    from energon.decode.sample_decoder import SampleDecoder
    from energon.plan.sources import Source


@dataclasses.dataclass
class PipelineSpec:
    """``sources`` are :class:`energon.plan.sources.Source` (a leaf, its sample range, weight,
    repetitions); ``mode`` says how a stream mixes them: ``"none"`` (one source), ``"concat"``
    (one after the other: validation), ``"weight"`` (blend) or ``"repetitions"`` (epochized blend)."""

    sources: list[Source]
    mode: str
    training: bool
    seed: int
    num_streams: int
    batch_size: int | None
    batch_drop_last: bool = False
    shuffle_buffer_size: int | None = None
    max_samples_per_sequence: int | None = None
    parallel_shard_iters: int | None = None
    shuffle_over_epochs: int | None = 1
    repeat: bool = True
    task_encoder: TaskEncoder = dataclasses.field(default_factory=DefaultTaskEncoder)
    decoder: SampleDecoder | None = None
    error_handler: ErrorHandler | None = None
    failure_tolerance: int = 100
    error_budget: ErrorBudget | None = None  # None: ErrorBudget() (not in the fingerprint)
    virtual_epoch_length: int = 0
    limit: int | None = None  # a pass ends after this many batches per rank (LimitDataset)
    limit_resets: bool = True  # ... and the next pass starts from the beginning again
    num_streams_fixed: bool = False
    packing_buffer_size: int | None = None
    group_max_wait: int | None = None
    even_ranks: bool = True  # validation: equalise batch counts across ranks (world_size > 1)
    # weight blends whose weights follow schedules (None: the sources' fixed weights)
    mixture: Mixture | None = None
    # blend weights changed online (loader.set_blend_weights), by position; not in the fingerprint
    weight_changes: tuple[WeightChange, ...] = ()
    global_batch_size: int | None = None  # samples per training step, to convert steps
    edits: PlanEdits | None = None  # cursor edits of a restored state (energon.plan.edits)
    balance: Balance | None = None  # compute-balanced steps across ranks (energon.balance)
    # threads that decode a batch's JPEGs (energon.decode.threads); not in the fingerprint
    decode_threads: int = 1
    # what a weight blend's weights share: samples (default) or a size per sample
    blend_by: BlendBy = dataclasses.field(default_factory=BlendBy)

    def blend_weights(self) -> WeightFunction:
        """The configured raw weight of each source as a function of the global sample clock."""
        if self.mixture is not None:
            return self.mixture
        return FlatWeights.constant([source.weight for source in self.sources])

    @property
    def data_dependent_counts(self) -> bool:
        """Whether the items of a stream can not be counted from its samples: packing and grouping
        decide batches from the data, and a hook that is a generator function may yield any number
        of outputs per input. Validation then agrees its length at run time (docs/ordering.md)."""
        te = self.task_encoder
        return (
            bool(self.packing_buffer_size)
            or self.balance is not None
            or te.is_active("batch_group_criterion")
            or any(
                te.is_active(hook) and _is_generator_function(getattr(te, hook))
                for hook in COUNT_CHANGING_HOOKS
            )
        )

    @property
    def planned_validation(self) -> bool:
        """A validation pass whose length every rank knows in advance: ranks must be even and the
        item count follows from the sample counts. Streams that run short (skipped samples, fewer
        samples than batches) get flagged filler items at their planned positions."""
        return (
            not self.training
            and not self.repeat
            and self.even_ranks
            and not self.data_dependent_counts
        )

    @property
    def leaves(self) -> list[Any]:
        return [source.leaf for source in self.sources]

    def pointer_kinds(self) -> list[str]:
        """The kind of each source's leaf: the tag of its pointer keys (see pipeline/keys.py)."""
        return [source.leaf.kind for source in self.sources]

    def source_rotations(self) -> list[int]:
        """Each source's remainder samples start where the previous source's stopped (balance),
        unless cursor edits fixed them (a migrated source keeps its old ranges)."""
        if self.edits is not None and self.edits.sources is not None:
            return [identity.rotation for identity in self.edits.sources]
        rotations, total = [], 0
        for source in self.sources:
            rotations.append(total % self.num_streams)
            total += len(source)
        return rotations

    def source_ids(self) -> list[int]:
        """The number each source's readers are seeded with: its position, unless cursor edits
        fixed it (a migrated source keeps its old number, so its slice order stays the same)."""
        if self.edits is not None and self.edits.sources is not None:
            return [identity.id for identity in self.edits.sources]
        return list(range(len(self.sources)))

    def exclusions(self) -> list[Exclusion | None]:
        """Per source: the samples cursor edits exclude from now on (None: none)."""
        if self.edits is None or not self.edits.exclude:
            return [None] * len(self.sources)
        return [
            self.edits.exclusion_for(source.leaf.fingerprint()["path"], source.leaf.split_part)
            for source in self.sources
        ]

    def source_stream_counts(self) -> list[list[int]]:
        """[source][stream] -> samples of that source in that stream's range."""
        return [
            stream_counts(length, self.num_streams, rotation)
            for length, rotation, _, _ in self._count_terms()
        ]

    def source_stream_quotas(self) -> list[list[int]]:
        """[source][stream] -> samples per pass of an epochized blend (repetitions, exact globally).

        The fractional part of ``repetitions`` is spread over the streams so that the total is
        ``floor(len(source) * repetitions)``, not a sum of per-stream roundings (reference S17).
        """
        quotas = []
        for length, rotation, whole, extra in self._count_terms():
            counts = stream_counts_array(length, self.num_streams, rotation)
            spread = stream_counts_array(extra, self.num_streams, rotation)
            quotas.append((counts * whole + spread).tolist())
        return quotas

    def _count_terms(self) -> tuple[tuple[int, int, int, int], ...]:
        """Per source: (samples, rotation, whole repetitions, extra samples of the fraction)."""
        terms = []
        for source, rotation in zip(self.sources, self.source_rotations()):
            whole = int(source.repetitions)
            extra = int(len(source) * source.repetitions) - len(source) * whole
            terms.append((len(source), rotation, whole, extra))
        return tuple(terms)

    @property
    def _counts_repetitions(self) -> bool:
        return self.mode == "repetitions" and self.training

    def stream_sample_counts(self) -> list[int]:
        """Samples per stream in one pass (sample-level excludes not subtracted)."""
        return _stream_totals(
            self._count_terms(), self.num_streams, self._counts_repetitions
        ).tolist()

    def stream_quotas(self, stream: int) -> list[int]:
        """``[q[stream] for q in source_stream_quotas()]``, computed for one stream."""
        quotas = []
        for length, rotation, whole, extra in self._count_terms():
            n = stream_count(length, self.num_streams, rotation, stream)
            quotas.append(n * whole + stream_count(extra, self.num_streams, rotation, stream))
        return quotas

    def stream_sample_count(self, stream: int) -> int:
        """``stream_sample_counts()[stream]``, computed for one stream (O(sources))."""
        if self._counts_repetitions:
            return sum(self.stream_quotas(stream))
        return sum(
            stream_count(length, self.num_streams, rotation, stream)
            for length, rotation, _, _ in self._count_terms()
        )

    def batches_of(self, samples: int) -> int:
        """Items a stream of ``samples`` samples emits: one per sample unbatched, else its
        batches (a last partial one dropped with ``batch_drop_last``)."""
        if self.batch_size is None:
            return samples
        if self.batch_drop_last:
            return samples // self.batch_size
        return -(-samples // self.batch_size)

    def stream_val_batches(self, stream: int) -> int:
        """Items stream ``stream`` emits in a validation pass: the common count when ranks must be
        even, else its own natural count (a single rank needs no padding)."""
        if self.even_ranks:
            return self.val_batches_per_stream()
        return self.batches_of(self.stream_sample_count(stream))

    def val_batches_per_stream(self) -> int:
        """Every stream emits at most this many items in a validation pass whose counts follow
        from the samples (the positions of streams with fewer are filled when ranks must be
        even). With ``batch_drop_last`` only each stream's last partial batch is dropped."""
        return self.batches_of(max(self.stream_sample_counts()))

    def fingerprint(self) -> dict[str, Any]:
        """What must be equal for a saved state to mean the same thing in this pipeline."""
        te = self.task_encoder
        edited = {}
        if self.edits is not None and self.edits.changes_plan:
            edited = {"edits": self.edits.fingerprint()}
        return {
            **edited,
            "datasets": [source.fingerprint() for source in self.sources],
            "mode": self.mode,
            "training": self.training,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "batch_drop_last": self.batch_drop_last,
            "shuffle_buffer_size": self.shuffle_buffer_size,
            "max_samples_per_sequence": self.max_samples_per_sequence,
            "parallel_shard_iters": self.parallel_shard_iters,
            "shuffle_over_epochs": self.shuffle_over_epochs,
            "repeat": self.repeat,
            "packing_buffer_size": self.packing_buffer_size,
            "group_max_wait": self.group_max_wait,
            "task_encoder": f"{type(te).__module__}.{type(te).__qualname__}",
            **({"mixture": self.mixture.config()} if self.mixture is not None else {}),
            **({"balance": self.balance.fingerprint()} if self.balance is not None else {}),
            **({"blend_by": self.blend_by.name} if self.blend_by.by_size else {}),
        }

    def config(self) -> dict[str, Any]:
        return {
            **self.fingerprint(),
            "num_streams": self.num_streams,
            "virtual_epoch_length": self.virtual_epoch_length,
            "limit": self.limit,
            "limit_resets": self.limit_resets,
            "datasets": [source.config() for source in self.sources],
            **({"global_batch_size": self.global_batch_size} if self.global_batch_size else {}),
            **(
                {"weight_changes": [c.config() for c in self.weight_changes]}
                if self.weight_changes
                else {}
            ),
        }


@functools.lru_cache(maxsize=8)
def _stream_totals(terms: tuple, num_streams: int, repetitions: bool) -> np.ndarray:
    """Samples per stream over all sources (numpy: a blend of 100 sources over 32,768 streams is
    3 million additions, asked for by several parts of one process: cached on the plain terms)."""
    totals = np.zeros(num_streams, dtype=np.int64)
    for length, rotation, whole, extra in terms:
        counts = stream_counts_array(length, num_streams, rotation)
        if repetitions:
            counts = counts * whole + stream_counts_array(extra, num_streams, rotation)
        totals += counts
    totals.flags.writeable = False
    return totals


#: Hooks that may turn one input into several outputs when they are generator functions.
COUNT_CHANGING_HOOKS = ("encode_sample", "preencode_sample", "postencode_sample", "encode_batch")


def _is_generator_function(fn: Any) -> bool:
    return inspect.isgeneratorfunction(inspect.unwrap(fn))


def fingerprint_digest(fingerprint: dict[str, Any]) -> str:
    text = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_blend_streams(
    spec: PipelineSpec, weights: WeightFunction, what: str, start: int = 0
) -> None:
    """Raise if at some time from global sample ``start`` on some logical stream holds no sample
    of any source with a positive weight in ``weights`` (a source with fewer samples than streams
    is absent from some)."""
    names = [f"{s.leaf.fingerprint()['path']} [{s.leaf.split_part}]" for s in spec.sources]
    counts = spec.source_stream_counts()
    for t in sorted({start, *(t for t in weights.check_times() if t > start)}):
        raw = weights.weights_at(t)
        if not any(w > 0 for w in raw):
            raise MetadatasetError(f"{what}: the weights are all 0 at global sample {t}")
        for stream in range(spec.num_streams):
            if any(w > 0 and c[stream] > 0 for w, c in zip(raw, counts)):
                continue
            weighted = [n for n, w in zip(names, raw) if w > 0]
            raise MetadatasetError(
                f"{what}: at global sample {t} only {', '.join(weighted)} have weight, and logical "
                f"stream {stream} of {spec.num_streams} has none of their samples (they have "
                "fewer samples than there are streams): give another dataset weight there, or use "
                "fewer logical streams"
            )
