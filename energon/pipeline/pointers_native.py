"""The pointer stages of a stream stepped in C, next to the Python ones it copies: the fast inner
loop of the ledger, the balanced executor and simulate.

Describing a step of a large job from a state saved 10,000 steps earlier, or counting every
exposure up to a step, means producing tens of millions of sample pointers; the Python stages
(:mod:`energon.pipeline.pointers`) cost microseconds per pointer. This module holds a C version of
exactly their arithmetic (``SliceReader`` with its open-slice draw and leaf excludes, the
``WeightedSchedule`` / ``QuotaSchedule`` deficit rules in float64, the ``ShuffleBuffer`` swap-pop,
the ``ExcludeFilter``), compiled on first use (:mod:`energon.native`).

It works on the stage *objects* of a stream: :meth:`NativePointers.attach` reads their states and
constants, :meth:`NativePointers.advance` steps the C copy, :meth:`NativePointers.write_back` puts
the states back with the stages' own ``restore``. Anything it does not know exactly (another stage
or schedule class, a finite pass, padding, a reader without samples) makes ``attach`` return None
and the caller runs the Python stages: the result is the same, only slower. Slice orders are
computed by the readers themselves (``SliceReader.slice_order``): the C loop pauses when it needs
the order of an epoch it has not been given. Bit-identity with the Python stages is tested with
random configurations (tests/pipeline/test_pointers_native.py).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from energon import native
from energon.pipeline.keys import pointer_key, pointer_target
from energon.pipeline.pointers import ExcludeFilter, PointerSource, ShuffleBuffer
from energon.pipeline.stage import Stage
from energon.plan.mixing import QuotaSchedule, WeightedSchedule
from energon.plan.reader import SliceReader

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>

#define OK 0
#define NEED_ORDER 1
#define UNSUPPORTED 2

typedef unsigned __int128 u128;

typedef struct {
    const int64_t *bounds;
    int64_t num_slices;
    int64_t parallel;
    uint64_t rng_key;
    const int64_t *excluded;
    int64_t num_excluded;
    int64_t epoch, pos, rng, yielded, started;
    int64_t *active;
    int64_t n_active, cap;
    const int64_t *orders;      /* the slice orders of epochs orders_first.. (orders_count rows) */
    int64_t orders_first, orders_count;
} Reader;

typedef struct {
    int64_t num_readers;
    Reader *readers;
    int64_t mode;
    int64_t current, passes;
    const double *weights;
    const double *phases;
    const int64_t *quotas;
    int64_t quota_total;
    int64_t picks;
    int64_t *counts;
    int64_t pending;
    int64_t buf_size;
    uint64_t buf_key;
    int64_t buf_rng;
    int32_t *buf_src;
    int64_t *buf_idx;
    int64_t buf_n;
    int64_t has_filter;
    const int64_t *ex_offsets;
    const int64_t *ex_ranges;
    int64_t dropped;
    int64_t done;
    int64_t need_reader;
} Stepper;

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* CounterRng.randbelow: counter += 1, splitmix64(key + counter * golden), multiply-shift. */
static inline int64_t randbelow(uint64_t key, int64_t *counter, int64_t n) {
    *counter += 1;
    uint64_t z = mix64(key + (uint64_t)(*counter) * 0x9E3779B97F4A7C15ULL);
    return (int64_t)(((u128)z * (u128)(uint64_t)n) >> 64);
}

static const int64_t *order_of(const Reader *r, int64_t epoch) {
    if (epoch < r->orders_first || epoch >= r->orders_first + r->orders_count) return 0;
    return r->orders + (epoch - r->orders_first) * r->num_slices;
}

static void open_next_slice(Reader *r, const int64_t *order, int64_t at) {
    int64_t s = order[r->pos];
    r->pos += 1;
    int64_t cursor = r->bounds[s];
    if (cursor >= r->bounds[s + 1]) return;
    if (at < 0 || at > r->n_active) at = r->n_active;
    memmove(&r->active[2 * (at + 1)], &r->active[2 * at],
            sizeof(int64_t) * 2 * (size_t)(r->n_active - at));
    r->active[2 * at] = s;
    r->active[2 * at + 1] = cursor;
    r->n_active += 1;
}

static void start_epoch(Reader *r, const int64_t *order) {
    r->started = 1;
    r->pos = 0;
    r->n_active = 0;
    while (r->n_active < r->parallel && r->pos < r->num_slices) open_next_slice(r, order, -1);
}

static int64_t pick_slot(Reader *r) {
    if (r->n_active == 1) return 0;
    int64_t total = 0;
    for (int64_t i = 0; i < r->n_active; ++i)
        total += r->bounds[r->active[2 * i] + 1] - r->active[2 * i + 1];
    int64_t target = randbelow(r->rng_key, &r->rng, total);
    int64_t acc = 0;
    for (int64_t i = 0; i < r->n_active; ++i) {
        acc += r->bounds[r->active[2 * i] + 1] - r->active[2 * i + 1];
        if (acc > target) return i;
    }
    return r->n_active - 1;
}

static void refill(Reader *r, int64_t slot) {
    memmove(&r->active[2 * slot], &r->active[2 * (slot + 1)],
            sizeof(int64_t) * 2 * (size_t)(r->n_active - slot - 1));
    r->n_active -= 1;
    if (r->pos < r->num_slices) open_next_slice(r, order_of(r, r->epoch), slot);
}

static int next_index(Reader *r, int64_t *out) {
    if (!order_of(r, r->epoch) || !order_of(r, r->epoch + 1)) return NEED_ORDER;
    if (!r->started) start_epoch(r, order_of(r, r->epoch));
    if (r->n_active == 0) {
        if (r->bounds[r->num_slices] == r->bounds[0]) return UNSUPPORTED;
        r->epoch += 1;
        start_epoch(r, order_of(r, r->epoch));
        if (r->n_active == 0) return UNSUPPORTED;
    }
    int64_t slot = pick_slot(r);
    int64_t *entry = &r->active[2 * slot];
    int64_t index = entry[1];
    entry[1] += 1;
    if (entry[1] >= r->bounds[entry[0] + 1]) refill(r, slot);
    *out = index;
    return OK;
}

static int is_excluded(const int64_t *sorted, int64_t n, int64_t index) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] < index) lo = mid + 1; else hi = mid;
    }
    return lo < n && sorted[lo] == index;
}

static int reader_next(Reader *r, int64_t *out) {
    for (;;) {
        int64_t index;
        int status = next_index(r, &index);
        if (status != OK) return status;
        if (r->num_excluded == 0 || !is_excluded(r->excluded, r->num_excluded, index)) {
            r->yielded += 1;
            *out = index;
            return OK;
        }
    }
}

static int64_t weighted_next(Stepper *c) {
    int64_t t = c->picks + 1;
    int64_t best = -1;
    double best_deficit = -INFINITY;
    for (int64_t i = 0; i < c->num_readers; ++i) {
        double w = c->weights[i];
        if (w <= 0) continue;
        double deficit = w * ((double)t + c->phases[i]) - (double)c->counts[i];
        if (deficit > best_deficit) { best = i; best_deficit = deficit; }
    }
    c->picks += 1;
    c->counts[best] += 1;
    return best;
}

static int64_t quota_next(Stepper *c) {
    int64_t t = c->picks + 1;
    int64_t best = -1;
    double best_deficit = -INFINITY;
    for (int64_t i = 0; i < c->num_readers; ++i) {
        int64_t q = c->quotas[i];
        if (c->counts[i] >= q) continue;
        double deficit = (double)(q * t) / (double)c->quota_total - (double)c->counts[i];
        if (deficit > best_deficit) { best = i; best_deficit = deficit; }
    }
    c->picks += 1;
    c->counts[best] += 1;
    return best;
}

static int source_draw(Stepper *c, int32_t *src, int64_t *idx) {
    if (c->pending < 0) {
        if (c->mode == 0) {
            c->pending = c->current;
        } else if (c->mode == 1) {
            c->pending = weighted_next(c);
        } else {
            if (c->picks >= c->quota_total) {
                c->picks = 0;
                memset(c->counts, 0, sizeof(int64_t) * (size_t)c->num_readers);
                c->passes += 1;
            }
            c->pending = quota_next(c);
        }
    }
    int status = reader_next(&c->readers[c->pending], idx);
    if (status != OK) {
        c->need_reader = c->pending;
        return status;
    }
    *src = (int32_t)c->pending;
    c->pending = -1;
    return OK;
}

static int filtered(const Stepper *c, int32_t s, int64_t index) {
    const int64_t *r = c->ex_ranges;
    int64_t lo = c->ex_offsets[s], hi = c->ex_offsets[s + 1];
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (r[2 * mid + 1] <= index) lo = mid + 1; else hi = mid;
    }
    return lo < c->ex_offsets[s + 1] && r[2 * lo] <= index;
}

static int next_output(Stepper *c, int32_t *src, int64_t *idx) {
    for (;;) {
        int32_t s;
        int64_t i;
        int status;
        if (c->buf_size > 0) {
            while (c->buf_n < c->buf_size) {
                status = source_draw(c, &s, &i);
                if (status != OK) return status;
                c->buf_src[c->buf_n] = s;
                c->buf_idx[c->buf_n] = i;
                c->buf_n += 1;
            }
            int64_t j = randbelow(c->buf_key, &c->buf_rng, c->buf_n);
            s = c->buf_src[j];
            i = c->buf_idx[j];
            c->buf_src[j] = c->buf_src[c->buf_n - 1];
            c->buf_idx[j] = c->buf_idx[c->buf_n - 1];
            c->buf_n -= 1;
        } else {
            status = source_draw(c, &s, &i);
            if (status != OK) return status;
        }
        if (c->has_filter && filtered(c, s, i)) {
            c->dropped += 1;
            continue;
        }
        *src = s;
        *idx = i;
        return OK;
    }
}

/* Produce pointers until c->done == n. Pointers numbered >= out_from go to out_src/out_idx
   (if given); counts[s][index] += 1 for every pointer whose source has a count array. */
int energon_pointers_advance(Stepper *c, int64_t n, int32_t *out_src, int64_t *out_idx,
                             int64_t out_from, uint32_t **counts) {
    while (c->done < n) {
        int32_t s;
        int64_t i;
        int status = next_output(c, &s, &i);
        if (status != OK) return status;
        if (out_src && c->done >= out_from) {
            out_src[c->done - out_from] = s;
            out_idx[c->done - out_from] = i;
        }
        if (counts && counts[s]) counts[s][i] += 1;
        c->done += 1;
    }
    return OK;
}
"""

OK, NEED_ORDER, UNSUPPORTED = 0, 1, 2
ORDERS_PER_BLOCK = 1 << 16  # slice-order entries handed to a reader at once
#: per reader number: the first epoch and the slice orders of consecutive epochs from it on
OrdersCache = dict[int, tuple[int, np.ndarray]]
_P = ctypes.c_void_p
_I64 = ctypes.c_int64


class _Reader(ctypes.Structure):
    _fields_ = [
        ("bounds", _P),
        ("num_slices", _I64),
        ("parallel", _I64),
        ("rng_key", ctypes.c_uint64),
        ("excluded", _P),
        ("num_excluded", _I64),
        ("epoch", _I64),
        ("pos", _I64),
        ("rng", _I64),
        ("yielded", _I64),
        ("started", _I64),
        ("active", _P),
        ("n_active", _I64),
        ("cap", _I64),
        ("orders", _P),
        ("orders_first", _I64),
        ("orders_count", _I64),
    ]


class _Stepper(ctypes.Structure):
    _fields_ = [
        ("num_readers", _I64),
        ("readers", _P),
        ("mode", _I64),
        ("current", _I64),
        ("passes", _I64),
        ("weights", _P),
        ("phases", _P),
        ("quotas", _P),
        ("quota_total", _I64),
        ("picks", _I64),
        ("counts", _P),
        ("pending", _I64),
        ("buf_size", _I64),
        ("buf_key", ctypes.c_uint64),
        ("buf_rng", _I64),
        ("buf_src", _P),
        ("buf_idx", _P),
        ("buf_n", _I64),
        ("has_filter", _I64),
        ("ex_offsets", _P),
        ("ex_ranges", _P),
        ("dropped", _I64),
        ("done", _I64),
        ("need_reader", _I64),
    ]


_lock = threading.Lock()
_library: dict[str, Any] = {}


def library() -> Any:
    """The compiled stepper, or None (no compiler, or ``ENERGON_NO_NATIVE=1``)."""
    if native.disabled():
        return None
    with _lock:
        if "lib" not in _library:
            lib = native.load_library("pointers", SOURCE)
            if lib is not None:
                fn = lib.energon_pointers_advance
                fn.argtypes = [_P, _I64, _P, _P, _I64, _P]
                fn.restype = ctypes.c_int
            _library["lib"] = lib
        return _library["lib"]


def _ptr(array: np.ndarray) -> int:
    return array.ctypes.data


def _int64(values: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(values, dtype=np.int64))


class NativePointers:
    """A C copy of one stream's pointer stages (see the module docstring)."""

    def __init__(
        self, lib: Any, stages: Sequence[Stage], orders: OrdersCache | None = None
    ) -> None:
        self.lib = lib
        self.stages = list(stages)
        self._cache = orders if orders is not None else {}
        self.source: PointerSource = stages[0]  # type: ignore[assignment]
        self.buffer = next((s for s in stages if isinstance(s, ShuffleBuffer)), None)
        self.filter = next((s for s in stages if isinstance(s, ExcludeFilter)), None)
        self._keep: list[Any] = []  # arrays the C structs point into
        self._orders: list[np.ndarray | None] = []
        self._build()

    @classmethod
    def attach(
        cls, stages: Sequence[Stage], orders: OrdersCache | None = None
    ) -> NativePointers | None:
        """A C copy of these pointer stages, or None where the C loop would not be exact.

        ``orders``: a dict kept by a caller that attaches to the same stages again and again (the
        balanced executor, every window): the slice orders computed for them, reused while they
        cover the readers' epochs instead of recomputed at every attach."""
        lib = library()
        if lib is None or not _supported(stages):
            return None
        return cls(lib, stages, orders)

    # -- building the C state --------------------------------------------------------------------
    def _build(self) -> None:
        source = self.source
        state = source.state()
        readers = (_Reader * len(source.readers))()
        self._active = [
            self._fill_reader(slot, reader, reader_state)
            for slot, reader, reader_state in zip(readers, source.readers, state["readers"])
        ]
        self._orders = [None for _ in source.readers]
        self._readers = readers
        c = _Stepper()
        c.num_readers = len(source.readers)
        c.readers = ctypes.addressof(readers)
        c.current = int(state["current"])
        c.passes = int(state["passes"])
        c.pending = -1
        schedule = source.schedule
        counts = _int64(
            state["schedule"]["counts"] if state["schedule"] is not None else [0] * c.num_readers
        )
        self._counts = self._hold(counts)
        c.counts = _ptr(counts)
        c.picks = int(state["schedule"]["picks"]) if state["schedule"] is not None else 0
        if schedule is None:
            c.mode = 0
        elif type(schedule) is WeightedSchedule:
            c.mode = 1
            c.weights = _ptr(self._hold(np.asarray(schedule.weights, dtype=np.float64)))
            c.phases = _ptr(self._hold(np.asarray(schedule.phases, dtype=np.float64)))
        else:
            c.mode = 2
            c.quotas = _ptr(self._hold(_int64(schedule.quotas)))
            c.quota_total = int(schedule.total)
        if self.buffer is not None:
            buffer_state = self.buffer.state()
            size = self.buffer.size
            sources = np.zeros(size, dtype=np.int32)
            indices = np.zeros(size, dtype=np.int64)
            for i, key in enumerate(buffer_state["buffer"]):
                sources[i], indices[i] = pointer_target(tuple(key))
            self._buf_src, self._buf_idx = self._hold(sources), self._hold(indices)
            c.buf_size = size
            c.buf_key = self.buffer.rng.key
            c.buf_rng = int(buffer_state["rng"])
            c.buf_src, c.buf_idx = _ptr(sources), _ptr(indices)
            c.buf_n = len(buffer_state["buffer"])
        if self.filter is not None:
            offsets, ranges = [0], []
            for exclusion in self.filter.exclusions:
                pairs = list(exclusion.ranges) if exclusion is not None else []
                ranges += pairs
                offsets.append(len(ranges))
            c.has_filter = 1
            c.ex_offsets = _ptr(self._hold(_int64(offsets)))
            c.ex_ranges = _ptr(self._hold(_int64(ranges or [[0, 0]]).reshape(-1)))
            c.dropped = int(self.filter.state()["dropped"])
        self.c = c

    def _hold(self, array: np.ndarray) -> np.ndarray:
        self._keep.append(array)
        return array

    def _fill_reader(self, slot: _Reader, reader: SliceReader, state: dict[str, Any]) -> np.ndarray:
        """Fill one C reader; returns its array of open slices ([slice, cursor] pairs)."""
        bounds = self._hold(_int64(reader.bounds))
        slot.bounds = _ptr(bounds)
        slot.num_slices = reader.num_slices
        slot.parallel = reader.parallel
        slot.rng_key = reader.rng_key
        excluded = self._hold(_int64(sorted(reader.excluded)) if reader.excluded else _int64([0]))
        slot.excluded = _ptr(excluded)
        slot.num_excluded = len(reader.excluded)
        slot.epoch = int(state["epoch"])
        slot.pos = int(state["pos"])
        slot.rng = int(state["rng"])
        slot.yielded = int(state["yielded"])
        slot.started = int(bool(state["started"]))
        active = state["active"]
        cap = max(reader.parallel, len(active), 1)
        array = self._hold(np.zeros(2 * cap + 2, dtype=np.int64))
        for i, (slice_index, cursor) in enumerate(active):
            array[2 * i], array[2 * i + 1] = slice_index, cursor
        slot.active = _ptr(array)
        slot.n_active = len(active)
        slot.cap = cap
        slot.orders_count = 0
        return array

    def _provide_orders(self, reader_number: int, remaining: int) -> None:
        """Give the C reader the slice orders of its current epoch and of the epochs it can reach
        in the ``remaining`` pointers (a block at a time: each pause costs Python time)."""
        reader = self.source.readers[reader_number]
        slot = self._readers[reader_number]
        epoch = int(slot.epoch)
        cached = self._cache.get(reader_number)
        if cached is not None and cached[0] <= epoch and epoch + 2 <= cached[0] + len(cached[1]):
            first, orders = cached
        else:
            reachable = remaining // max(reader.num_samples, 1) + 2
            count = max(2, min(reachable, ORDERS_PER_BLOCK // max(reader.num_slices, 1)))
            first, orders = epoch, _int64(reader.slice_orders(epoch, count))
            self._cache[reader_number] = (first, orders)
        self._orders[reader_number] = orders
        slot.orders = _ptr(orders)
        slot.orders_first = first
        slot.orders_count = len(orders)

    # -- stepping ----------------------------------------------------------------------------------
    def advance(
        self,
        count: int,
        *,
        keep_from: int | None = None,
        counts: Sequence[np.ndarray | None] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Produce ``count`` more pointers. Returns the (source, index) arrays of pointers number
        ``keep_from`` and later (empty without ``keep_from``); ``counts[s]`` (uint32 arrays over
        source ``s``'s leaf) are incremented for every pointer produced."""
        c = self.c
        c.done = 0
        keep = 0 if keep_from is None else max(0, count - keep_from)
        out_src = np.zeros(keep, dtype=np.int32)
        out_idx = np.zeros(keep, dtype=np.int64)
        count_ptrs = None
        if counts is not None:
            count_ptrs = (ctypes.c_void_p * len(counts))(
                *[_ptr(a) if a is not None else None for a in counts]
            )
        while True:
            status = self.lib.energon_pointers_advance(
                ctypes.byref(c),
                count,
                _ptr(out_src) if keep else None,
                _ptr(out_idx) if keep else None,
                keep_from or 0,
                count_ptrs,
            )
            if status == OK:
                return out_src, out_idx
            if status != NEED_ORDER:
                raise RuntimeError("the native pointer stepper met a case it does not support")
            self._provide_orders(int(c.need_reader), count - int(c.done))

    def write_back(self) -> None:
        """Put the C state back into the stage objects (through their ``restore``)."""
        c = self.c
        source = self.source
        state = source.state()
        readers = []
        for slot, array, old in zip(self._readers, self._active, state["readers"]):
            active = array[: 2 * slot.n_active].reshape(-1, 2).tolist()
            readers.append(
                {
                    **old,
                    "epoch": int(slot.epoch),
                    "pos": int(slot.pos),
                    "active": active,
                    "rng": int(slot.rng),
                    "yielded": int(slot.yielded),
                    "started": bool(slot.started),
                }
            )
        schedule = state["schedule"]
        if schedule is not None:
            schedule = {**schedule, "picks": int(c.picks), "counts": self._counts.tolist()}
        source.restore(
            {
                **state,
                "current": int(c.current),
                "passes": int(c.passes),
                "schedule": schedule,
                "readers": readers,
            }
        )
        if self.buffer is not None:
            kinds = source.kinds
            keys = [
                pointer_key(kinds[s], int(s), int(i))
                for s, i in zip(
                    self._buf_src[: c.buf_n].tolist(), self._buf_idx[: c.buf_n].tolist()
                )
            ]
            self.buffer.put_back(keys, int(c.buf_rng))
        if self.filter is not None:
            self.filter.restore({**self.filter.state(), "dropped": int(c.dropped)})


def _may_be_picked(source: PointerSource) -> list[bool]:
    """Per reader: whether the pointer source can ever ask it for a sample."""
    schedule = source.schedule
    if schedule is None:
        current = source.state()["current"]
        return [i == current for i in range(len(source.readers))]
    if type(schedule) is WeightedSchedule:
        return [w > 0 for w in schedule.weights]
    return [q > 0 for q in schedule.quotas]


#: the state fields the C copy knows, per stage class: a stage whose state has others (a newer
#: schedule, another cursor) is stepped in Python
_KNOWN_STATES = {
    PointerSource: {"current", "passes", "schedule", "readers"},
    ShuffleBuffer: {"buffer", "rng", "exhausted"},
    ExcludeFilter: {"dropped"},
}
_KNOWN_READER_STATE = {"epoch", "pos", "active", "rng", "yielded", "started"}
_KNOWN_SCHEDULE_STATE = {"picks", "counts"}
_DERIVED_SCHEDULE_STATE = {"expected"}  # recomputed on restore


def _supported(stages: Sequence[Stage]) -> bool:
    """Whether the C loop reproduces these pointer stages exactly."""
    if not stages or type(stages[0]) is not PointerSource:
        return False
    rest = [type(s) for s in stages[1:]]
    if rest not in ([], [ShuffleBuffer], [ExcludeFilter], [ShuffleBuffer, ExcludeFilter]):
        return False
    if any(set(stage.state()) != _KNOWN_STATES[type(stage)] for stage in stages):
        return False
    source: PointerSource = stages[0]  # type: ignore[assignment]
    state = source.state()
    if any(set(reader) != _KNOWN_READER_STATE for reader in state["readers"]):
        return False
    if (
        state["schedule"] is not None
        and set(state["schedule"]) - _DERIVED_SCHEDULE_STATE != _KNOWN_SCHEDULE_STATE
    ):
        return False
    schedule = source.schedule
    if schedule is not None and type(schedule) not in (WeightedSchedule, QuotaSchedule):
        return False
    if type(schedule) is WeightedSchedule and schedule.dynamic:
        return False  # weights that change over time (schedules, online changes) step in Python
    if type(schedule) is QuotaSchedule:
        if not source.repeat or schedule.total <= 0:
            return False
        if max(schedule.quotas) * (schedule.total + 1) >= 2**53:
            return False  # q * t / total would no longer be float division of exact doubles
    picked = _may_be_picked(source)
    for reader, may_be_picked in zip(source.readers, picked):
        if type(reader) is not SliceReader:
            return False
        if not reader.repeat:
            return False
        if reader.num_samples == 0 and may_be_picked:
            return False  # Python moves on or stops there; the C loop does not
    if schedule is None and source.state()["current"] >= len(source.readers):
        return False
    for stage in stages[1:]:
        if isinstance(stage, ShuffleBuffer) and (stage.state()["exhausted"] or stage.size < 1):
            return False
    return True
