"""Restore keys: the small tuples that say how to regenerate one item of a stream.

Buffers and saved states hold keys, never decoded data, and every sample or batch a loader yields
carries its key in ``__restore_key__``. This module is the only place that knows their shapes:

=================================================  ===================================================
``(kind, source, index)``                          sample ``index`` of source ``source`` of the
                                                   stream, a leaf of kind ``kind``
                                                   (``"webdataset"``, ``"jsonl"``, ``"tokens"``,
                                                   ``"join"``): a pointer
``("Map", hook, sample_index, sub, input, batch)``  output ``sub`` (0 unless the hook is a
                                                   generator) of ``hook`` called on the item that key
                                                   ``input`` names, under ``current_batch_index``
                                                   ``batch`` (None if unknown)
``("Pack", pack_index, sub, members)``             output ``sub`` of the packer called on ``members``
``("Piece", start, stop, key)``                    units ``[start, stop)`` (``stop`` None: to the end)
                                                   of the item ``key`` names: a member of a pack that
                                                   holds only part of a sample split across packs
``("Batch", batch_index, members)``                the batch of the items that the keys ``members``
                                                   name
``("Stream", stream_id, item, key)``               the loader-level key of a yielded item: item
                                                   number ``item`` of logical stream ``stream_id``,
                                                   made from ``key``
``(node, child, key)``                             an item that a node of a compat composition
                                                   (``node``: ``"BlendDataset"``,
                                                   ``"ConcatDataset"``) took from its child number
                                                   ``child``, which made it from ``key``
``("IterMapDataset", output, members)``             output ``output`` of a compat ``IterMapDataset``,
                                                   made from the inputs the keys ``members`` name
=================================================  ===================================================

(The reference's ``add_sample_restore_key`` / ``set_sample_restore_key`` give a user's own
wrapper keys of the user's own shape, and the reference-shaped low-level readers of
``energon.compat.webdataset`` key their samples ``("Webdataset", index)`` as the reference does:
those are the reference's API, not shapes of energon's streams.)

A regenerated item sees the same ``current_sample_index`` / ``current_batch_index`` as the original.

Keys are plain data. JSON turns their tuples into lists; :func:`as_key` turns them back. Keys read
back from a saved state are checked on use: a key of the wrong shape is a ``StateError``.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from energon.errors import StateError

Key: TypeAlias = tuple  # nested tuples of str and int, shaped as the table above says

MAP, PACK, BATCH, STREAM, PIECE = "Map", "Pack", "Batch", "Stream", "Piece"
LEGACY_POINTER_KIND = "Webdataset"  # loader state version 1 tagged every pointer so


def pointer_key(kind: str, source: int, index: int) -> Key:
    return (kind, source, index)


def pointer_keys(kinds: list[str], sources: list[int], indices: list[int]) -> list[Key]:
    """:func:`pointer_key` of many pointers at once (``kinds[s]``: the kind of source ``s``)."""
    return [(kinds[s], s, i) for s, i in zip(sources, indices)]


def child_key(node: str, child: int, key: Key) -> Key:
    return (node, child, key)


def members_key(node: str, output: int, members: tuple[Key, ...]) -> Key:
    return (node, output, members)


def members_parts(key: Any, node: str) -> tuple[Key, ...]:
    """The member keys of a :func:`members_key` of ``node``."""
    if not (isinstance(key, tuple) and len(key) == 3 and key[0] == node and _is_key_tuple(key[2])):
        raise _malformed(key, f"a key of {node} (an output number and its members' keys)")
    return key[2]


def child_parts(key: Any, node: str, children: int) -> tuple[int, Key]:
    """(child, key inside it) of a :func:`child_key` of ``node`` with ``children`` children."""
    if not (
        isinstance(key, tuple)
        and len(key) == 3
        and key[0] == node
        and _is_int(key[1])
        and 0 <= key[1] < children
        and isinstance(key[2], tuple)
    ):
        raise _malformed(key, f"a key of {node} (one of its {children} children and a key)")
    return key[1], key[2]


def map_key(hook: str, sample_index: int, sub: int, input_key: Key, batch_index: int | None) -> Key:
    return (MAP, hook, sample_index, sub, input_key, batch_index)


def pack_key(pack_index: int, sub: int, members: tuple[Key, ...]) -> Key:
    return (PACK, pack_index, sub, members)


def piece_key(start: int, stop: int | None, key: Key) -> Key:
    return (PIECE, start, stop, key)


def piece_parts(key: Key) -> tuple[int, int | None, Key]:
    """(start, stop, key of the whole item) of a piece key."""
    if not (
        isinstance(key, tuple)
        and len(key) == 4
        and key[0] == PIECE
        and _is_int(key[1])
        and key[1] >= 0
        and (key[2] is None or (_is_int(key[2]) and key[2] > key[1]))
        and isinstance(key[3], tuple)
        and key[3][:1] != (PIECE,)
    ):
        raise _malformed(key, "a Piece key")
    return key[1], key[2], key[3]


def is_piece(key: Key) -> bool:
    return len(key) == 4 and key[0] == PIECE


def batch_key(batch_index: int, members: tuple[Key, ...]) -> Key:
    return (BATCH, batch_index, members)


def stream_key(stream_id: int, item_index: int, key: Key) -> Key:
    return (STREAM, stream_id, item_index, key)


def pointer_target(key: Key) -> tuple[int, int]:
    """(source, index) of a pointer key (the hot path: no checks, see :func:`checked_pointer`)."""
    _, source, index = key
    return source, index


def checked_pointer(key: Any) -> tuple[str, int, int]:
    """(kind, source, index) of a pointer key read back from a state, checked for its shape."""
    if not (
        isinstance(key, tuple)
        and len(key) == 3
        and isinstance(key[0], str)
        and _is_int(key[1])
        and _is_int(key[2])
    ):
        raise _malformed(key, "a sample pointer (kind, source, index)")
    return key[0], key[1], key[2]


def map_parts(key: Key) -> tuple[int, int, Key, int | None]:
    """(sample_index, sub, input key, batch index) of a map key (keys of states saved before the
    batch index was recorded have none)."""
    if not (
        isinstance(key, tuple)
        and len(key) in (5, 6)
        and key[0] == MAP
        and _is_int(key[2])
        and _is_int(key[3])
        and key[3] >= 0
        and isinstance(key[4], tuple)
        and (len(key) == 5 or key[5] is None or _is_int(key[5]))
    ):
        raise _malformed(key, "a Map key")
    _, _, sample_index, sub, input_key = key[:5]
    return sample_index, sub, input_key, (key[5] if len(key) > 5 else None)


def pack_parts(key: Key) -> tuple[int, int, tuple[Key, ...]]:
    """(pack_index, sub, member keys) of a pack key."""
    if not (
        isinstance(key, tuple)
        and len(key) == 4
        and key[0] == PACK
        and _is_int(key[1])
        and _is_int(key[2])
        and key[2] >= 0
        and _is_key_tuple(key[3])
    ):
        raise _malformed(key, "a Pack key")
    _, pack_index, sub, members = key
    return pack_index, sub, members


def batch_members(key: Key) -> tuple[Key, ...]:
    if not (
        isinstance(key, tuple)
        and len(key) == 3
        and key[0] == BATCH
        and _is_int(key[1])
        and _is_key_tuple(key[2])
    ):
        raise _malformed(key, "a Batch key")
    return key[2]


def is_pointer(key: Key) -> bool:
    return (
        len(key) == 3
        and key[0] not in (MAP, PACK, BATCH, STREAM, PIECE)
        and isinstance(key[2], int)
    )


def is_group(key: Key) -> bool:
    """Whether an item was made from several samples (a pack or a batch, or a hook's output on
    one)."""
    while key[0] in (MAP, PIECE):
        key = map_parts(key)[2] if key[0] == MAP else piece_parts(key)[2]
    return key[0] in (PACK, BATCH)


def outputs_of(key: Key) -> list[Key]:
    """The items a yielded micro-batch is made of: a batch's members (also through a hook such as
    ``encode_batch``), or the item itself when there is no batching."""
    inner = key
    while inner[0] == MAP:
        inner = map_parts(inner)[2]
    return list(batch_members(inner)) if inner[0] == BATCH else [key]


def pointers_of(key: Key) -> list[Key]:
    """The sample pointers an item was made from, in order (a sample: one; a pack or a batch: its
    members'; a hook's output: its input's)."""
    return [pointer for pointer, _ in pointer_parts(key)]


def pointer_parts(key: Key) -> list[tuple[Key, tuple[int, int | None] | None]]:
    """The sample pointers an item was made from, in order, each with the part of the sample it
    holds: ``(start, stop)`` where packing split the sample across packs, else None."""
    if is_pointer(key):
        return [(key, None)]
    if key[0] == PIECE:
        start, stop, inner = piece_parts(key)
        return [(pointer, (start, stop)) for pointer, _ in pointer_parts(inner)]
    if key[0] == MAP:
        return pointer_parts(map_parts(key)[2])
    if key[0] == PACK:
        members = pack_parts(key)[2]
    elif key[0] == BATCH:
        members = batch_members(key)
    elif key[0] == STREAM:
        return pointer_parts(key[3])
    else:
        raise ValueError(f"not a restore key: {key!r}")
    return [part for member in members for part in pointer_parts(member)]


def pointers_in(data: Any) -> list[Key]:
    """Every sample pointer inside a stage's state (keys nested in plain data, lists or tuples)."""
    if isinstance(data, dict):
        return [p for value in data.values() for p in pointers_in(value)]
    if isinstance(data, list | tuple):
        key = as_key(data)
        if (
            len(key) == 3
            and isinstance(key[0], str)
            and _is_int(key[1])
            and _is_int(key[2])
            and is_pointer(key)
        ):
            return [key]
        return [p for value in data for p in pointers_in(value)]
    return []


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_key_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and all(isinstance(k, tuple) for k in value)


def _malformed(key: Any, expected: str) -> StateError:
    shown = repr(key)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return StateError(f"restore key {shown} is not {expected} (the state is damaged)")


def parse_stream_key(data: Any) -> tuple[int, int, Key]:
    """(stream_id, item index, key inside the stream) of a loader-level key, also one that went
    through JSON."""
    key = as_key(data)
    if not (
        isinstance(key, tuple)
        and len(key) == 4
        and key[0] == STREAM
        and isinstance(key[1], int)
        and isinstance(key[2], int)
        and isinstance(key[3], tuple)
    ):
        raise ValueError(f"not a restore key of this loader: {data!r}")
    return key[1], key[2], key[3]


def as_key(data: Any) -> Any:
    """Keys come back from JSON as lists; turn them into tuples again, recursively."""
    if isinstance(data, list | tuple):
        return tuple(as_key(x) for x in data)
    return data


def retag_legacy_pointers(data: Any, kinds: list[str]) -> Any:
    """Saved keys (JSON data) with every version-1 pointer ``["Webdataset", source, index]`` tagged
    with the real kind of its source."""
    if isinstance(data, dict):
        return {name: retag_legacy_pointers(value, kinds) for name, value in data.items()}
    if not isinstance(data, list | tuple):
        return data
    if (
        len(data) == 3
        and data[0] == LEGACY_POINTER_KIND
        and isinstance(data[1], int)
        and isinstance(data[2], int)
        and 0 <= data[1] < len(kinds)
    ):
        return [kinds[data[1]], data[1], data[2]]
    return [retag_legacy_pointers(x, kinds) for x in data]


def attach_restore_key(value: Any, key: Key) -> None:
    """Record ``key`` on samples/batches that carry a ``__restore_key__``."""
    if isinstance(value, dict):
        if "__restore_key__" in value:
            value["__restore_key__"] = key
    elif hasattr(value, "__restore_key__"):
        try:
            value.__restore_key__ = key
        except (AttributeError, TypeError):
            pass
