"""One rank's share of a balanced step as packed sequences ready for Megatron.

The rank's encoded samples are packed first-fit decreasing (:class:`SequencePacker`, on their true
token counts) into ``P`` sequences of at most ``max_length`` tokens and laid out as a padded
``[P, max_length]`` batch. ``cu_seqlens`` holds the segment boundaries in the flattened
``P * max_length`` token stream (each pack's trailing padding is a segment of its own, so
variable-length attention never mixes padding with real tokens); ``padding_mask`` is True on
padding; ``loss_mask`` is 0 there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from energon.samples import Sample
from energon.structs import edataclass
from energon.task_encoder.packing import PackedSequence, SequencePacker


@edataclass
class BalancedBatch(Sample):
    tokens: torch.Tensor  # [P, max_length], padding 0
    position_ids: torch.Tensor  # [P, max_length], restarting at each member
    padding_mask: torch.Tensor  # [P, max_length] bool, True on padding
    loss_mask: torch.Tensor  # [P, max_length] float, the members' loss masks, 0 on padding
    cu_seqlens: torch.Tensor  # int32 boundaries in the flattened P * max_length stream
    seq_lengths: torch.Tensor  # int32 length of each segment of cu_seqlens
    max_seqlen: int
    samples: list  # the encoded members, pack by pack (their images, videos, ...)
    labels: torch.Tensor | None = None  # [P, max_length] when the members have labels
    rank_cost: float = 0.0  # this rank's estimated cost of the step
    # every rank's estimated cost of the step (same on all ranks): a list, or read from a plan
    # store when used (energon.balance.store.StepCosts, equal to the list)
    step_costs: Sequence[float] | None = None
    # this rank's over-long samples of the step, as Balance.over_length handled them
    truncated: int = 0
    split: int = 0
    dropped: int = 0


def pack_balanced(
    samples: Sequence[Any],
    max_length: int,
    *,
    packer: SequencePacker | None = None,
    groups: Sequence[Any] | None = None,
) -> list[tuple[PackedSequence, list[Any]]]:
    """Packs of ``samples`` (first-fit decreasing; with ``groups``, one group per pack), each with
    its members (an over-long sample split into several packs is a member of the first only; one
    dropped by ``over_length="drop"`` of none)."""
    packer = packer or SequencePacker(max_length)
    if groups is None:
        buckets = [list(samples)]
    else:
        by_group: dict[Any, list[Any]] = {}
        for sample, group in zip(samples, groups):
            by_group.setdefault(group, []).append(sample)
        buckets = list(by_group.values())
    packs = []
    for bucket in buckets:
        for members in packer.select(bucket):
            for n, pack in enumerate(packer.pack(members)):
                packs.append((pack, members if n == 0 else []))  # a split sample: listed once
    return packs


def layout_batch(
    packs: Sequence[tuple[PackedSequence, list[Any]]], max_length: int, **extra: Any
) -> BalancedBatch:
    """The padded ``[P, max_length]`` batch of ``packs``."""
    count = max(1, len(packs))
    tokens = torch.zeros(count, max_length, dtype=torch.long)
    positions = torch.zeros(count, max_length, dtype=torch.long)
    padding = torch.ones(count, max_length, dtype=torch.bool)
    loss = torch.zeros(count, max_length, dtype=torch.float32)
    has_labels = bool(packs) and all(pack.labels is not None for pack, _ in packs)
    labels = torch.full((count, max_length), -100, dtype=torch.long) if has_labels else None
    lengths: list[int] = []
    members: list[Any] = []
    keys: list[str] = []
    for row, (pack, group) in enumerate(packs):
        n = int(pack.tokens.shape[0])
        tokens[row, :n] = pack.tokens
        positions[row, :n] = pack.position_ids
        padding[row, :n] = False
        loss[row, :n] = pack.loss_mask if pack.loss_mask is not None else 1.0
        if labels is not None:
            labels[row, :n] = pack.labels
        lengths.extend(int(x) for x in pack.seq_lengths)
        if n < max_length:
            lengths.append(max_length - n)
        members.extend(group)
        keys.append(pack.__key__)
    if not packs:
        lengths.append(max_length)
    seq_lengths = torch.tensor(lengths, dtype=torch.int32)
    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu_seqlens[1:] = seq_lengths.cumsum(0)
    first = members[0] if members else None
    subflavors = (
        (first.get("__subflavors__") if isinstance(first, dict) else first.__subflavors__)
        if first is not None
        else None
    )
    return BalancedBatch(
        __key__=keys,
        __restore_key__=(),
        __subflavors__=subflavors,
        tokens=tokens,
        position_ids=positions,
        padding_mask=padding,
        loss_mask=loss,
        labels=labels,
        cu_seqlens=cu_seqlens,
        seq_lengths=seq_lengths,
        max_seqlen=int(seq_lengths.max()) if len(lengths) else 0,
        samples=members,
        **extra,
    )
