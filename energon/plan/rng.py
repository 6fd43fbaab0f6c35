"""Counter-based random numbers that never touch the global RNGs.

Every random decision in energon is a pure function of a 64-bit key (derived from the seed and the
names of what is being randomised) and a counter. The whole state of a generator is therefore one
integer, which makes states tiny, JSON-serialisable and identical on every platform and Python build.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, MutableSequence, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

import numpy as np

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def stable_seed(*parts: Any) -> int:
    """A 64-bit seed from JSON-able parts; stable across processes (unlike ``hash()``)."""
    text = _plain_json(parts)
    if text is None:
        text = json.dumps(parts, separators=(",", ":"), sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def stable_seeds(parts: tuple[Any, ...], counters: Iterable[int]) -> list[int]:
    """``[stable_seed(*parts, c) for c in counters]``, the hash of the common text prefix
    computed once (a stream's slice orders take one seed per epoch)."""
    prefix = _plain_json(parts)
    counters = list(counters)
    if prefix is None or any(type(c) is not int for c in counters):
        return [stable_seed(*parts, c) for c in counters]
    start = hashlib.blake2b((prefix[:-1] + ("," if parts else "")).encode(), digest_size=8)
    seeds = []
    for counter in counters:
        hashed = start.copy()
        hashed.update(b"%d]" % counter)
        seeds.append(int.from_bytes(hashed.digest(), "little"))
    return seeds


def _plain_json(parts: tuple[Any, ...]) -> str | None:
    """The text ``json.dumps`` makes of ``parts`` where they are all plain ints and strings
    (most seeds: a seed, a name, a counter), written without an encoder (several times
    cheaper; seeds are drawn per epoch of every stream); None for any other part."""
    texts = []
    for part in parts:
        kind = type(part)
        if kind is int:
            texts.append(int.__repr__(part))
        elif kind is str:
            texts.append(encode_basestring_ascii(part))
        else:
            return None
    return "[" + ",".join(texts) + "]"


def _mix64(z: int) -> int:
    """The splitmix64 finaliser: a bijective scramble of 64 bits."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _mix64_array(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class CounterRng:
    """splitmix64 over ``key + counter * golden``; the state is ``counter``."""

    __slots__ = ("key", "counter")

    def __init__(self, key: int, counter: int = 0) -> None:
        self.key = key & _MASK
        self.counter = counter

    def next_u64(self) -> int:
        self.counter += 1
        return _mix64((self.key + self.counter * _GOLDEN) & _MASK)

    def randbelow(self, n: int) -> int:
        """Uniform integer in ``[0, n)`` (multiply-shift; bias below 2**-40 for n < 2**24)."""
        self.counter += 1  # next_u64, inlined: twice per sample in a shuffled stream
        return (_mix64((self.key + self.counter * _GOLDEN) & _MASK) * n) >> 64

    def random(self) -> float:
        """Uniform float in ``[0, 1)`` with 53 bits of precision."""
        return (self.next_u64() >> 11) * (1.0 / (1 << 53))

    def choice_weighted(self, weights: Sequence[float]) -> int:
        """Index drawn with probability proportional to ``weights`` (all >= 0, sum > 0)."""
        if len(weights) == 1:
            return 0
        target = self.random() * sum(weights)
        acc = 0.0
        for i, w in enumerate(weights):
            acc += w
            if target < acc:
                return i
        return max(i for i, w in enumerate(weights) if w > 0)

    def shuffle(self, items: MutableSequence) -> None:
        """In-place Fisher-Yates shuffle."""
        for i in range(len(items) - 1, 0, -1):
            j = self.randbelow(i + 1)
            items[i], items[j] = items[j], items[i]


def permutation(key: int, n: int) -> np.ndarray:
    """A permutation of ``range(n)`` determined by ``key`` alone (vectorised; no state)."""
    return permutations([key], n)[0]


def permutations(keys: Sequence[int], n: int) -> np.ndarray:
    """``[permutation(key, n) for key in keys]`` as one ``[len(keys), n]`` array, in one pass."""
    counters = np.arange(1, n + 1, dtype=np.uint64)
    keys_array = np.array([k & _MASK for k in keys], dtype=np.uint64)[:, None]
    with np.errstate(over="ignore"):
        z = keys_array + counters[None, :] * np.uint64(_GOLDEN)
        return np.argsort(_mix64_array(z), axis=1, kind="stable")


def random_indices(key: int, count: int, high: int) -> np.ndarray:
    """``count`` independent uniform integers in ``[0, high)`` determined by ``key`` (with replacement)."""
    counters = np.arange(1, count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = _mix64_array(np.uint64(key & _MASK) + counters * np.uint64(_GOLDEN))
    return (z % np.uint64(max(high, 1))).astype(np.int64)
