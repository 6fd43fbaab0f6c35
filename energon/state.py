"""The saved position of a loader: plain data, versioned, fingerprinted, elastic.

A rank's state says where the global micro-batch sequence stood for that rank (``origin``: every
position below it was consumed when the current layout started; ``consumed``: how many of the rank's
own positions ``origin + rank + k * world_size`` were consumed since) and holds a small snapshot of each
logical stream it read (cursors, RNG counters, buffered sample pointers). Nothing is pickled: a state
is JSON-serialisable and loads with ``torch.load(weights_only=True)``.

Because streams, not ranks or workers, define the order, a list of per-rank states can be merged and
re-split for any other number of ranks (``redistribute_states``); the number of workers never matters.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from energon import atomic
from energon import state_fields as fields
from energon.balance.tail import TAIL_FIELD, check_tail, settled, tail_origin
from energon.errors import StateError
from energon.format.shard_table import listed_shards_fingerprint
from energon.pipeline import snapshot
from energon.pipeline.error_account import account_totals, merge_totals
from energon.pipeline.keys import retag_legacy_pointers
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.spec import fingerprint_digest
from energon.plan.edits import edits_from_json
from energon.plan.schedules import WeightChange

STATE_FORMAT = "energon-loader-state"
# 2: pointer keys name their leaf's kind ("webdataset", "jsonl", ...); 1 tagged all "Webdataset"
STATE_VERSION = 2
READABLE_VERSIONS = (1, 2)  # older versions are translated by upgrade_state

_REQUIRED = {
    "format": str,
    "version": int,
    "fingerprint": dict,
    "fingerprint_digest": str,
    "num_streams": int,
    "world_size": int,
    "rank": int,
    "origin": int,
    "consumed": int,
    "pass_offset": int,
    "streams": list,
}


def make_rank_state(
    *,
    fingerprint: dict[str, Any],
    fingerprint_digest: str,
    num_streams: int,
    world_size: int,
    rank: int,
    origin: int,
    consumed: int,
    pass_offset: int,
    streams: dict[int, StreamSnapshot],
    micro_batch_size: int | None,
    version: int = STATE_VERSION,
    weight_changes: list[dict[str, Any]] | None = None,
    edits: dict[str, Any] | None = None,
    errors: list[dict[str, Any]] | None = None,
    balance_tail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``weight_changes``: the blend weight changes made online (``loader.set_blend_weights``), as
    plain data; part of the position (not of the fingerprint), the same in every rank's state.
    ``edits`` (cursor edits as JSON, :mod:`energon.plan.edits`) only when the state was edited
    (skip, exclude, migrate), so unedited states look as they always did. ``errors``: per-source
    totals of samples lost to errors in finished passes (the current pass's are in the stream
    snapshots). ``balance_tail``: the tail of a balanced window interrupted by an elastic restore
    (:mod:`energon.balance.tail`), only while the ranks are inside it."""
    extra = {"edits": edits} if edits is not None else {}
    state = {
        "format": STATE_FORMAT,
        "version": version,
        "fingerprint": fingerprint,
        "fingerprint_digest": fingerprint_digest,
        "num_streams": num_streams,
        "world_size": world_size,
        "rank": rank,
        "origin": origin,
        "consumed": consumed,
        "pass_offset": pass_offset,
        "micro_batch_size": micro_batch_size,
        "streams": [[s, streams[s]] for s in sorted(streams)],
        "errors": errors,
        **extra,
    }
    if weight_changes:
        state["weight_changes"] = weight_changes
    if balance_tail is not None:
        state[TAIL_FIELD] = balance_tail
    return state


def weight_changes(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The online blend weight changes recorded in a rank state (none in older states)."""
    changes = state.get("weight_changes", [])
    if not isinstance(changes, list) or not all(
        isinstance(c, dict) and isinstance(c.get("position"), int) for c in changes
    ):
        raise StateError("loader state field 'weight_changes' is damaged")
    return changes


def parsed_weight_changes(state: dict[str, Any]) -> tuple[WeightChange, ...]:
    """The online blend weight changes of a rank state, as the plan's objects."""
    try:
        return tuple(WeightChange.from_config(c) for c in weight_changes(state))
    except (KeyError, TypeError, ValueError) as e:
        raise StateError(f"loader state field 'weight_changes' is damaged: {e}") from e


def check_state_shape(state: Any) -> dict[str, Any]:
    """Reject anything that is not a well-formed rank state, saying what is wrong. A balanced
    state whose ranks finished the tail of an elastic restore comes back settled
    (:func:`energon.balance.tail.settled`)."""
    if isinstance(state, dict) and "dataloader_state_dict" in state:
        state = state["dataloader_state_dict"]  # Megatron-LM's wrapping
    if not isinstance(state, dict):
        raise StateError(f"a loader state must be a dict, got {type(state).__name__}")
    if state.get("format") != STATE_FORMAT:
        raise StateError(
            f"not an energon loader state: expected a dict with format {STATE_FORMAT!r} (what "
            f"save_state_rank returns), got one with format {state.get('format')!r} and keys "
            f"{sorted(state)[:8]}"
        )
    if state.get("version") not in READABLE_VERSIONS:
        raise StateError(
            f"unsupported loader state version {state.get('version')!r} (this energon reads "
            f"versions {', '.join(map(str, READABLE_VERSIONS))})"
        )
    for name, kind in _REQUIRED.items():
        if not isinstance(state.get(name), kind) or (kind is int and isinstance(state[name], bool)):
            raise StateError(
                f"loader state field {name!r} is missing or not a {kind.__name__} (the state is damaged)"
            )
    for entry in state["streams"]:
        if not (isinstance(entry, list | tuple) and len(entry) == 2 and isinstance(entry[1], dict)):
            raise StateError("loader state field 'streams' is damaged")
    edits_from_json(state.get("edits"))  # raises StateError saying what is wrong
    _check_ranges(state)
    _check_fingerprint(state)
    check_tail(state)
    return settled(_compact_shard_lists(state))


def _check_ranges(state: dict[str, Any]) -> None:
    """Values that no loader can have saved (negative, out of range, inconsistent)."""
    fields.int_field(state, "num_streams", "", low=1)
    world_size = fields.int_field(state, "world_size", "", low=1)
    fields.int_field(state, "rank", "", high=world_size - 1)
    for name in ("consumed", "pass_offset"):
        fields.int_field(state, name, "")
    # a balanced tail ends where its window ended: it may start before position 0 (check_tail)
    fields.int_field(state, "origin", "", low=-(2**62) if state.get(TAIL_FIELD) else 0)
    if state.get("micro_batch_size") is not None:
        fields.int_field(state, "micro_batch_size", "", low=1)
    seen: set[int] = set()
    for i, entry in enumerate(state["streams"]):
        where = f"streams[{i}]"
        if not (isinstance(entry, list | tuple) and len(entry) == 2 and isinstance(entry[1], dict)):
            raise fields.bad_field(where, entry, "[stream id, snapshot]")
        stream = fields.as_int(entry[0], f"{where}[0]", high=state["num_streams"] - 1)
        if stream in seen:
            raise StateError(f"loader state field 'streams' holds stream {stream} twice")
        seen.add(stream)
        snapshot.check_shape(entry[1], f"streams[{stream}]")


def _check_fingerprint(state: dict[str, Any]) -> None:
    """The fingerprint must be the one its digest was made from: restore compares digests, so an
    edited fingerprint would otherwise pass unnoticed (and mislead ``checkpoint info``)."""
    if fingerprint_digest(state["fingerprint"]) != state["fingerprint_digest"]:
        raise StateError(
            "loader state field 'fingerprint' does not match 'fingerprint_digest' (the state "
            "was edited or damaged)"
        )


def _compact_shard_lists(state: dict[str, Any]) -> dict[str, Any]:
    """States saved before the shard table listed every shard of every dataset in their
    fingerprint (``[[name, count], ...]``); today a leaf says ``{count, samples, sha256}`` of
    the same list. Such a state gets today's form (and its digest), so it restores as before."""
    fingerprint, changed = _compacted(state["fingerprint"])
    if not changed:
        return state
    return dict(state, fingerprint=fingerprint, fingerprint_digest=fingerprint_digest(fingerprint))


def _compacted(value: Any) -> tuple[Any, bool]:
    if isinstance(value, list):
        items = [_compacted(v) for v in value]
        return [v for v, _ in items], any(c for _, c in items)
    if not isinstance(value, dict):
        return value, False
    out, changed = {}, False
    for key, item in value.items():
        if key == "shards" and _is_shard_list(item):
            out[key] = listed_shards_fingerprint([n for n, _ in item], [c for _, c in item])
            changed = True
        else:
            out[key], inner = _compacted(item)
            changed = changed or inner
    return out, changed


def _is_shard_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], int)
        for e in value
    )


def check_position(state: dict[str, Any], pass_end: int | None, finite: bool) -> None:
    """The rank's position and each stream's snapshot must agree, so that restoring replays at
    most a few items per stream and skips none that nobody consumed.

    A stream ``s`` has ``n_s(P)`` positions below the rank's next position ``P``. A rank that
    saved the state has emitted all of them but those of the other ranks since its own last one
    (fewer than ``world_size``), unless the stream ran dry in a ``finite`` pass (where the pass
    has a planned end, ``pass_end``, ``P`` must lie inside it); a redistributed state may be a few steps ahead. Anything
    else (a consumed count of 1e15, an ``emitted`` far from the position) is a damaged state.
    """
    num_streams, world_size, rank = state["num_streams"], state["world_size"], state["rank"]
    position = rank_next_position(state)
    if pass_end is not None and position > pass_end + world_size:
        raise fields.bad_field(
            "consumed", state["consumed"], f"a position inside the pass (it has {pass_end})"
        )
    snapshots = stream_snapshots(state)
    lag = world_size + -(-_window_positions(state) // num_streams)
    step = math.gcd(num_streams, world_size)
    first = (state["origin"] + rank) % step  # the rank reads positions origin + rank + k W
    for stream in range(first, num_streams, step):
        before = max(0, -(-(position - stream) // num_streams))
        emitted = snapshot.emitted(snapshots[stream]) if stream in snapshots else 0
        if not finite and before - emitted > lag:  # (a finite pass: streams
            # that ran dry legitimately lag behind, and restoring them replays nothing)
            raise StateError(
                f"loader state field 'consumed' ({state['consumed']}) puts this rank at position "
                f"{position}, but stream {stream} has emitted only {emitted} of its {before} items "
                "before it: restoring would replay them (the state is damaged)"
            )
        if emitted - before > lag + num_streams:
            raise StateError(
                f"loader state field 'streams[{stream}].emitted' ({emitted}) is far ahead of this "
                f"rank's position {position} ({before} items of the stream before it; the state "
                "is damaged)"
            )


def _window_positions(state: dict[str, Any]) -> int:
    """Positions by which a balanced state's snapshots may lag behind its position: they are
    those of the start of the rank's window (or of the window a tail came from)."""
    balance = state["fingerprint"].get("balance")
    if not isinstance(balance, dict):
        return 0
    ranks = [state["world_size"]]
    tail = state.get(TAIL_FIELD)
    if tail is not None:
        ranks += [r for r, _ in tail["layers"]]
    return int(balance.get("window", 1)) * max(ranks)


def upgrade_state(state: dict[str, Any], pointer_kinds: list[str]) -> dict[str, Any]:
    """A well-formed state of any readable version as a state of the current version.

    Version 1 tagged every sample pointer ``"Webdataset"``; its pointers get the kind of their
    source's leaf (``pointer_kinds``, known only to the loader that restores the state).
    """
    if state["version"] == STATE_VERSION:
        return state
    streams = [[s, retag_legacy_pointers(snap, pointer_kinds)] for s, snap in state["streams"]]
    return dict(state, version=STATE_VERSION, streams=streams)


def fingerprint_differences(
    saved: dict[str, Any], current: dict[str, Any], limit: int = 12
) -> list[str]:
    """Human-readable list of what differs between two fingerprints, each at the innermost field
    that differs (``datasets[1].weight: saved 0.4 != now 0.5``), so that a long value cut short
    cannot hide the difference; an entry with another ``path`` is another dataset, shown whole.
    Shallow fields first, at most ``limit`` lines (then a count of the others)."""
    diffs = sorted(_differences("", saved, current), key=lambda d: d[0])
    lines = [text for _, text in diffs]
    if len(lines) > limit:
        lines = lines[:limit] + [f"... and {len(lines) - limit} more differences"]
    return lines


def _differences(where: str, a: Any, b: Any, depth: int = 0) -> list[tuple[int, str]]:
    """(depth, line) of every innermost difference of ``a`` (saved) and ``b`` (now)."""
    if a == b:
        return []
    if isinstance(a, dict) and isinstance(b, dict) and a.get("path") == b.get("path"):
        return [
            line
            for key in sorted(set(a) | set(b), key=str)
            for line in _differences(
                f"{where}.{key}" if where else str(key), a.get(key), b.get(key), depth + 1
            )
        ]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return [
            line
            for i in range(max(len(a), len(b)))
            for line in _differences(
                f"{where}[{i}]",
                a[i] if i < len(a) else _ABSENT,
                b[i] if i < len(b) else _ABSENT,
                depth + 1,
            )
        ]
    return [(depth, f"{where}: saved {_short(a)} != now {_short(b)}")]


class _Absent:
    """An entry one side of a list does not have."""

    def __repr__(self) -> str:
        return "(none)"


_ABSENT = _Absent()


def _short(value: Any, limit: int = 160) -> str:
    if value is _ABSENT:
        return repr(value)
    text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_compatible(state: dict[str, Any], fingerprint: dict[str, Any], digest: str) -> None:
    if state["fingerprint_digest"] == digest:
        return
    diffs = fingerprint_differences(state["fingerprint"], fingerprint)
    raise StateError(
        "the saved loader state belongs to a different dataset or loader configuration:\n  "
        + "\n  ".join(diffs or ["(fingerprint digest differs)"])
    )


def stream_snapshots(state: dict[str, Any]) -> dict[int, StreamSnapshot]:
    return {int(s): snap for s, snap in state["streams"]}


def rank_next_position(state: dict[str, Any]) -> int:
    """The global micro-batch position the rank that saved ``state`` yields next."""
    return state["origin"] + state["rank"] + state["consumed"] * state["world_size"]


def _is_consumed(position: int, states: list[dict[str, Any]]) -> bool:
    for st in states:
        if position < st["origin"]:
            return True
        offset = position - st["origin"] - st["rank"]
        if (
            offset >= 0
            and offset % st["world_size"] == 0
            and offset // st["world_size"] < st["consumed"]
        ):
            return True
    return False


def redistribute_states(states: list[dict[str, Any]], new_world_size: int) -> list[dict[str, Any]]:
    """Per-rank states of one save point -> per-rank states for ``new_world_size`` ranks.

    The consumed part of the global sequence is kept exactly: the new ranks continue at the first
    position nobody consumed; positions consumed beyond it (ranks that were a step ahead) are skipped
    because their streams' snapshots are already past them.

    Balanced states (``get_train_dataset(balance=...)``), saved by every rank after the same
    step: after a whole window the new ranks start a window; inside one, they start with its
    tail (:mod:`energon.balance.tail`): exactly the samples of the window's steps that the old
    ranks did not deliver, composed into steps for the new ranks.
    """
    if new_world_size < 1:
        raise StateError(f"new world size must be >= 1, got {new_world_size}")
    states = [check_state_shape(s) for s in states]
    if not states:
        raise StateError("no states to redistribute")
    first = states[0]
    for st in states[1:]:
        for field in ("fingerprint_digest", "num_streams", "world_size", "version"):
            if st[field] != first[field]:
                raise StateError(f"states disagree on {field}: {first[field]!r} vs {st[field]!r}")
        if weight_changes(st) != weight_changes(first):
            raise StateError(
                "states disagree on the blend weight changes: set_blend_weights was not called "
                "with the same values on every rank (use broadcast=True)"
            )
        if st.get("edits") != first.get("edits"):
            raise StateError(
                "states disagree on their cursor edits (edit all ranks' states together)"
            )
    ranks = sorted(st["rank"] for st in states)
    if ranks != list(range(first["world_size"])):
        raise StateError(f"need one state per rank 0..{first['world_size'] - 1}, got ranks {ranks}")
    num_streams = first["num_streams"]
    tail = None
    if "balance" in first["fingerprint"]:
        tail = _balanced_tail(states)
        merged, errors = _merge_balanced(states)
        if tail is None:
            origin = rank_next_position(first) - first["rank"]
            _check_prefix(merged, states, num_streams, origin)
        else:
            window = first["fingerprint"]["balance"].get("window", 1)
            origin = tail_origin(tail, window, new_world_size)
    else:
        origin = min(rank_next_position(st) for st in states)
        merged = merge_stream_snapshots(states)
        _check_prefix(merged, states, num_streams, origin)
        errors = merge_totals([st.get("errors") for st in states])
    out = []
    for rank in range(new_world_size):
        out.append(
            make_rank_state(
                fingerprint=first["fingerprint"],
                fingerprint_digest=first["fingerprint_digest"],
                num_streams=num_streams,
                world_size=new_world_size,
                rank=rank,
                origin=origin,
                consumed=0,
                pass_offset=0,
                streams=merged,
                micro_batch_size=first.get("micro_batch_size"),
                version=first["version"],
                weight_changes=weight_changes(first),
                edits=first.get("edits"),
                errors=errors if rank == 0 else None,  # counted once
                balance_tail=tail,
            )
        )
    return out


def _balanced_tail(states: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The tail (:mod:`energon.balance.tail`) that the new ranks start with: None after a whole
    window (the new ranks start a window), else the interrupted window's layers plus the steps
    the old ranks delivered of their own. Balanced steps split each global step over all ranks,
    so every rank must have been saved after the same step (as a training job saves them)."""
    tails = {json.dumps(st.get(TAIL_FIELD), sort_keys=True) for st in states}
    if len(tails) > 1:
        raise StateError(
            f"these balanced-mode states disagree on loader state field {TAIL_FIELD!r} (they "
            "were not restored from the same states)"
        )
    steps = {st["origin"] + st["consumed"] * st["world_size"] for st in states}
    if len(steps) > 1:
        raise StateError(
            "these balanced-mode states were saved at different steps (global positions "
            f"{sorted(steps)}): a balanced step is shared by all ranks, so save every rank's "
            "state after the same step to restore them on another number of ranks"
        )
    first = states[0]
    ranks, consumed = first["world_size"], first["consumed"]
    tail = first.get(TAIL_FIELD)
    if tail is not None:  # inside a tail: it gets one more layer
        return {"start": tail["start"], "layers": [*tail["layers"], [ranks, consumed]]}
    window = first["fingerprint"]["balance"].get("window", 1)
    if consumed % window == 0:
        return None
    start = first["origin"] + (consumed - consumed % window) * ranks
    return {"start": start, "layers": [[ranks, consumed % window]]}


def _merge_balanced(
    states: list[dict[str, Any]],
) -> tuple[dict[int, StreamSnapshot], list[dict[str, Any]] | None]:
    """The streams' snapshots and the error totals of balanced states. Each rank counts the
    samples it lost in its own accounts of the streams (energon.pipeline.balanced_executor), so all
    ranks' accounts are added up into the totals (kept by new rank 0, like the finished passes' totals
    of any merge: counted once) and the merged snapshots start with clean accounts."""
    merged = {
        s: snapshot.make_snapshot(snapshot.emitted(snap), snapshot.stage_states(snap))
        for s, snap in merge_stream_snapshots(states).items()
    }
    totals = [st.get("errors") for st in states]
    sources = len(states[0]["fingerprint"].get("datasets", []))
    for st in states:
        for snap in stream_snapshots(st).values():
            account = snapshot.error_state(snap)
            if account:
                totals.append(account_totals(account, sources))
    return merged, merge_totals(totals)


def merge_stream_snapshots(states: list[dict[str, Any]]) -> dict[int, StreamSnapshot]:
    """Each stream's snapshot that is furthest ahead among the ranks' states."""
    found: dict[int, list[StreamSnapshot]] = {}
    for st in states:
        for s, snap in stream_snapshots(st).items():
            found.setdefault(s, []).append(snap)
    return {s: snapshot.latest(snaps) for s, snaps in found.items()}


def _check_prefix(
    merged: dict[int, StreamSnapshot], states: list[dict[str, Any]], num_streams: int, origin: int
) -> None:
    """Each stream's consumed batches must be a prefix, or no snapshot can resume it exactly.

    Ranks saved at (about) the same step are a few positions apart; a spread beyond
    ``world_size x (num_streams + 2)`` positions is a damaged state (checking it position by
    position would take forever)."""
    horizon = max(rank_next_position(st) for st in states)
    world_size = states[0]["world_size"]
    if horizon - origin > world_size * (num_streams + 2):
        raise StateError(
            f"the per-rank states are {horizon - origin} positions apart (loader state fields "
            "'origin' / 'consumed'): save all ranks at the same step (or the states are damaged)"
        )
    for m in range(origin, horizon):
        s, i = m % num_streams, m // num_streams
        emitted = snapshot.emitted(merged[s]) if s in merged else 0
        if _is_consumed(m, states) != (i < emitted):
            raise StateError(
                "the per-rank states were saved at different steps in a way that cannot be merged "
                f"(stream {s} batch {i}); save all ranks at the same step for an elastic restore"
            )


def save_state_file(state: Any, path: str | os.PathLike, file_format: str = "json") -> None:
    """Write a state (or a list of per-rank states) atomically, as JSON or with ``torch.save``
    (``file_format="torch"``; the file still holds plain data only)."""
    if file_format not in ("json", "torch"):
        raise ValueError(f"file_format must be 'json' or 'torch', not {file_format!r}")
    with atomic.replacing(path) as tmp:
        if file_format == "torch":
            import torch

            torch.save(state, tmp)
        else:
            with open(tmp, "w") as f:
                json.dump(state, f)


def state_file_format(path: str | os.PathLike) -> str:
    """``"json"`` or ``"torch"``: how a state file was written (from its first byte)."""
    with open(path, "rb") as f:
        head = f.read(1)
    return "json" if head in (b"{", b"[") else "torch"


def load_state_file(path: str | os.PathLike) -> Any:
    """Read a state file written as JSON or with ``torch.save`` (never unpickling objects)."""
    path = os.fspath(path)
    if state_file_format(path) == "json":
        try:
            with open(path) as f:
                return json.load(f)
        except json.JSONDecodeError as e:
            raise StateError(f"{path}: damaged or truncated state file: {e}") from e
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise StateError(f"{path}: cannot read state file ({type(e).__name__}: {e})") from e


def dataset_consumption(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Per leaf dataset: samples its readers handed out in the streams of this state, and the
    furthest epoch reached (samples in shuffle buffers count as read)."""
    datasets = state["fingerprint"]["datasets"]
    out = [
        {"path": d["path"], "split_part": d["split_part"], "read": 0, "epoch": 0} for d in datasets
    ]
    for snap in stream_snapshots(state).values():
        for entry, read, epoch in zip(
            out, snapshot.samples_read(snap), snapshot.reader_epochs(snap)
        ):
            entry["read"] += read
            entry["epoch"] = max(entry["epoch"], epoch)
    return out
