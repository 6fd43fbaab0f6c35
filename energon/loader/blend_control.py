"""The blend of a running loader: what it observed (``loader.blend_report()``) and the weight
changes asked while it runs (``loader.set_blend_weights(...)``).

A weight change is part of the plan, not of the workers: it becomes a
:class:`~energon.plan.schedules.WeightChange` of the loader's spec at a global micro-batch
position (saved in the loader state, so a restored run repeats it), and workers that already ran
ahead under the old weights are restarted from the consumed position
(:meth:`energon.loader.transport.WorkerTransport.restart_from`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from energon.loader.blend_report import BlendReport, BlendTracker, source_names, source_rows
from energon.pipeline import snapshot
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.spec import PipelineSpec, check_blend_streams
from energon.plan.schedules import FlatWeights, WeightChange, WeightSchedule

BLEND_REPORT_WINDOW = 1000  # global samples per window of Loader.blend_report()


class BlendControl:
    """Counts the blend's picks per window of the global sample clock, and turns weight changes
    into specs. ``window``: samples per window of the report."""

    def __init__(self, window: int = BLEND_REPORT_WINDOW) -> None:
        self.window = window
        self._tracker: BlendTracker | None = None

    def start(self, spec: PipelineSpec, snapshots: Mapping[int, StreamSnapshot]) -> None:
        """Count from the streams' current snapshots (after a restore: the restored ones)."""
        self._tracker = None
        if spec.training and spec.mode == "weight":
            self._tracker = BlendTracker(len(spec.sources), spec.num_streams, self.window)
            for stream, snap in snapshots.items():
                self._tracker.prime(stream, snap)

    def observe(self, stream: int, snapshots: Callable[[], Mapping[int, StreamSnapshot]]) -> None:
        """``stream`` delivered an item; ``snapshots()`` gives every stream's latest snapshot. It
        is called only while a blend is counted: it unpacks the snapshots that came packed from
        workers, which a loader over one dataset never needs (that unpacking on every batch was
        about a tenth of the main process's CPU per text batch)."""
        if self._tracker is not None:
            self._tracker.observe(stream, snapshots()[stream])

    def report(
        self,
        spec: PipelineSpec,
        snapshots: Mapping[int, StreamSnapshot],
        streams: set[int],
        window: int | None,
    ) -> BlendReport:
        """See :meth:`energon.loader.data_loader.Loader.blend_report`; ``streams``: this rank's."""
        consumed = [0] * len(spec.sources)
        for snap in snapshots.values():
            for i, read in enumerate(snapshot.samples_read(snap)):
                consumed[i] += read
        tracker = self._tracker
        picked, expected = tracker.totals() if tracker is not None else (None, None)
        sizes = picked if tracker is not None and tracker.sized else None
        report = BlendReport(
            sources=source_rows(spec, consumed, expected, sizes),
            windows=tracker.windows() if tracker is not None else [],
            window=self.window,
            streams=sorted(streams),
            num_streams=spec.num_streams,
            changes=[c.config() for c in spec.weight_changes],
            unit=spec.blend_by.unit(),
        )
        return report if window is None else report.merged(window)


def checked_window(window: Any) -> int:
    """``window`` if it is a valid ``blend_window`` (an integer >= 1)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"blend_window must be an integer >= 1, got {window!r}")
    return window


def spec_with_weights(
    spec: PipelineSpec,
    weights: Sequence[Any] | Mapping[str, Any] | None,
    from_step: int | None,
    from_sample: int | None,
    boundary: int,
) -> tuple[PipelineSpec, int]:
    """``spec`` with the weights changed (None: back to the configured weights), and the global
    micro-batch where the change starts; ``boundary``: the first one the ranks have not consumed.
    See :meth:`energon.loader.data_loader.Loader.set_blend_weights`."""
    if not spec.training or spec.mode != "weight":
        raise ValueError(
            "set_blend_weights needs a training loader over a weight blend ('blend' with at "
            f"least two datasets); this loader's datasets are mixed as {spec.mode!r}"
        )
    position = _change_position(spec, from_step, from_sample, boundary)
    function = None if weights is None else _flat_weights(spec, weights)
    if function is not None:
        sample = position * (spec.batch_size or 1)
        step = f"step {from_step}: " if from_step is not None else ""
        where = f"set_blend_weights (from {step}micro-batch {position}, global sample {sample})"
        check_blend_streams(spec, function, where, start=sample)
    change = WeightChange(position, function)
    if change in spec.weight_changes:
        return spec, position
    kept = [c for c in spec.weight_changes if c.position != position]
    changes = tuple(sorted([*kept, change], key=lambda c: c.position))
    return dataclasses.replace(spec, weight_changes=changes), position


def _change_position(
    spec: PipelineSpec, from_step: int | None, from_sample: int | None, boundary: int
) -> int:
    """The global micro-batch where a weight change starts; ``boundary``: the first one the
    ranks have not consumed (the default, and the earliest allowed)."""
    micro = spec.batch_size or 1
    if from_step is not None and from_sample is not None:
        raise ValueError("give from_step or from_sample, not both")
    for name, value in (("from_step", from_step), ("from_sample", from_sample)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an integer, got {value!r}")
    if from_step is not None:
        if spec.global_batch_size is None:
            raise ValueError(
                "from_step needs the global batch size: pass global_batch_size= to "
                "get_train_dataset (or set it in the metadataset), or use from_sample="
            )
        from_sample = from_step * spec.global_batch_size
    if from_sample is None:
        return boundary
    if from_sample % micro:
        raise ValueError(
            f"from_sample={from_sample} is not a multiple of the micro-batch size {micro}"
        )
    position = from_sample // micro
    if position < boundary:
        raise ValueError(
            f"the weight change would start at global micro-batch {position} (sample "
            f"{from_sample}), but the ranks have consumed up to micro-batch {boundary} "
            f"(sample {boundary * micro}): a change can only start at or after the next step"
        )
    return position


def _flat_weights(spec: PipelineSpec, weights: Sequence[Any] | Mapping[str, Any]) -> FlatWeights:
    names = source_names(spec)
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise KeyError(f"unknown blend source(s) {unknown}; the sources are {names}")
        if len(set(names)) != len(names):
            raise ValueError(
                "some sources share a name (the same dataset twice): give a list of weights"
            )
        weights = [weights.get(name, 0.0) for name in names]
    weights = list(weights)
    if len(weights) != len(names):
        raise ValueError(f"{len(weights)} weights given for the blend's {len(names)} sources")
    schedules = []
    for i, weight in enumerate(weights):
        if isinstance(weight, WeightSchedule):
            try:
                schedules.append(weight.in_samples(spec.global_batch_size))
            except ValueError as e:
                raise ValueError(f"weight {i}: {e} (pass global_batch_size=...)") from e
        elif isinstance(weight, bool) or not isinstance(weight, int | float) or not weight >= 0:
            raise ValueError(f"weight {i} ({names[i]}) must be a number >= 0, got {weight!r}")
        else:
            schedules.append(WeightSchedule.constant(float(weight)))
    return FlatWeights(tuple(schedules))


def from_first_rank(values: list[Any], group: Any) -> list[Any]:
    """``values`` of the data-parallel group's first rank, on every rank of the group."""
    import torch.distributed as dist

    source = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(values, src=source, group=group)
    return values
