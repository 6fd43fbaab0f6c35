"""Requested against observed blend proportions, per window of the global sample clock.

A weight blend's schedule records in every stream snapshot how often it picked each source
(``counts``) and how often it should have (``expected``: the sum of the normalised weights in force
at each pick). :class:`BlendTracker` turns the snapshots a loader receives into per-window totals
(live, :meth:`energon.loader.data_loader.Loader.blend_report`); :func:`simulate_blend` computes the
same from the plan alone, by running every stream's schedule without reading anything
(``energon blend-plan``). Both give a :class:`BlendReport`, which prints as a table and renders as a
self-contained HTML page or a PNG.

Window ``j`` holds the picks whose clock (pick ``k`` of stream ``s`` of ``L``: ``k * L + s``) lies
in ``[j * window, (j + 1) * window)``. The tracker sees a stream's counts once per micro-batch, so
it files each micro-batch's picks under the window of its last pick.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Iterator
from typing import Any

from energon.errors import MissingDependencyError
from energon.pipeline import snapshot
from energon.pipeline.pointers import blend_schedule, pointer_source
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.spec import PipelineSpec

MAX_WINDOWS = 10_000  # a live tracker keeps the most recent windows


def source_names(spec: PipelineSpec) -> list[str]:
    """``path [split]`` of each source (what reports and ``set_blend_weights`` mappings use)."""
    return [f"{s.leaf.fingerprint()['path']} [{s.leaf.split_part}]" for s in spec.sources]


@dataclasses.dataclass
class BlendWindow:
    start: int  # global sample clock, inclusive
    end: int  # exclusive
    picks: int  # samples picked in the window (by the streams the report covers)
    requested: list[float]  # share of each source the weights asked for
    observed: list[float]  # share of each source picked
    size: float | None = None  # a blend weighted by size: the size picked (shares are of it)


@dataclasses.dataclass
class BlendReport:
    """``sources``: one dict per source (``name``, ``path``, ``split_part``, ``weight`` (configured
    at the start), ``schedule``, ``repetitions``, ``consumed`` (samples picked), ``requested`` and
    ``observed`` (shares over everything picked so far)); ``windows``: per window of ``window``
    samples of the global clock. Iterating a report (or indexing it) goes over ``sources``."""

    sources: list[dict[str, Any]]
    windows: list[BlendWindow]
    window: int
    streams: list[int]  # the logical streams the report covers
    num_streams: int
    changes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    unit: str = "samples"  # what the shares are of: samples, or the blend_by size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.sources)

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.sources[index]

    @property
    def names(self) -> list[str]:
        return [s["name"] for s in self.sources]

    def max_deviation(self) -> float:
        """The largest |observed - requested| share over all windows and sources."""
        return max(
            (abs(o - r) for w in self.windows for o, r in zip(w.observed, w.requested)),
            default=0.0,
        )

    def merged(self, window: int) -> BlendReport:
        """The same report in windows of ``window`` samples (a multiple of this report's)."""
        if window < 1 or window % self.window:
            raise ValueError(
                f"window must be a positive multiple of the tracked window ({self.window})"
            )
        groups: dict[int, list[BlendWindow]] = {}
        for w in self.windows:
            groups.setdefault(w.start // window, []).append(w)
        windows = []
        for index, parts in sorted(groups.items()):
            sized = parts[0].size is not None
            amounts = [p.size if sized else p.picks for p in parts]
            total = sum(amounts)  # type: ignore[arg-type]
            n = len(self.sources)
            picked = [sum(p.observed[i] * a for p, a in zip(parts, amounts)) for i in range(n)]
            expected = [sum(p.requested[i] * a for p, a in zip(parts, amounts)) for i in range(n)]
            if not sized:
                picked = [round(c) for c in picked]
            windows.append(
                BlendWindow(
                    start=index * window,
                    end=(index + 1) * window,
                    picks=sum(p.picks for p in parts),
                    requested=[e / (total or 1) for e in expected],
                    observed=[c / (total or 1) for c in picked],
                    size=total if sized else None,
                )
            )
        return dataclasses.replace(self, windows=windows, window=window)

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "num_streams": self.num_streams,
            "streams": self.streams,
            "sources": self.sources,
            "changes": self.changes,
            "unit": self.unit,
            "windows": [dataclasses.asdict(w) for w in self.windows],
        }

    def table(self, max_rows: int = 40) -> str:
        """A text table: per window, requested -> observed percentage of every source."""
        rows = self.windows
        if len(rows) > max_rows:
            step = -(-len(rows) // max_rows)
            rows = rows[::step]
        lines = [f"sources: {', '.join(f'[{i}] {n}' for i, n in enumerate(self.names))}"]
        if self.unit != "samples":
            lines.append(f"shares of the {self.unit} picked (blend_by), per window of samples")
        header = "samples".ljust(24) + "".join(
            f"[{i}] req -> obs %".rjust(20) for i in range(len(self.names))
        )
        lines.append(header)
        for w in rows:
            cells = "".join(
                f"{r * 100:8.2f} -> {o * 100:6.2f}".rjust(20)
                for r, o in zip(w.requested, w.observed)
            )
            lines.append(f"{w.start:>11,}-{w.end:<11,} ".ljust(24) + cells)
        lines.append(f"largest |observed - requested| in a window: {self.max_deviation():.4f}")
        return "\n".join(lines)

    def html(self, title: str = "energon blend report") -> str:
        """A self-contained page (inline SVG, no scripts or external files)."""
        return _html_page(self, title)

    def save_png(self, path: str, title: str = "energon blend report") -> None:
        """Plot with matplotlib (an optional dependency: ``pip install matplotlib``)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise MissingDependencyError(
                "a PNG plot needs matplotlib (pip install matplotlib); the HTML page needs nothing"
            ) from e
        fig, ax = plt.subplots(figsize=(10, 5))
        mids = [(w.start + w.end) / 2 for w in self.windows]
        for i, name in enumerate(self.names):
            color = _COLORS[i % len(_COLORS)]
            ax.plot(mids, [w.requested[i] for w in self.windows], "--", color=color)
            ax.plot(mids, [w.observed[i] for w in self.windows], "-", color=color, label=name)
        ax.set_xlabel("global samples")
        ax.set_ylabel("share of samples (dashed: requested, solid: observed)")
        ax.set_ylim(0, 1)
        ax.set_title(title)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


class BlendTracker:
    """Per-window picks and targets of a weight blend, from the stream snapshots a loader gets."""

    def __init__(self, num_sources: int, num_streams: int, window: int) -> None:
        self.num_sources = num_sources
        self.num_streams = num_streams
        self.window = window
        self._last: dict[int, tuple[int, list[float], list[float]]] = {}
        self._windows: dict[int, tuple[list[float], list[float], list[int]]] = {}
        self.sized = False  # the streams' schedules weigh by size

    def prime(self, stream: int, snap: StreamSnapshot) -> None:
        """Start counting stream ``stream`` from ``snap`` (a restored position)."""
        picks, amounts, expected, self.sized = _schedule_totals(snap, self.num_sources)
        self._last[stream] = (picks, amounts, expected)

    def observe(self, stream: int, snap: StreamSnapshot) -> None:
        picks, amounts, expected, self.sized = _schedule_totals(snap, self.num_sources)
        last = self._last.get(stream)
        if last is None:
            last = (0, [0.0] * self.num_sources, [0.0] * self.num_sources)
        if picks <= last[0]:
            return
        index = ((picks - 1) * self.num_streams + stream) // self.window
        window = self._windows.get(index)
        if window is None:
            n = self.num_sources
            window = self._windows[index] = ([0.0] * n, [0.0] * n, [0])
            if len(self._windows) > MAX_WINDOWS:
                del self._windows[min(self._windows)]
        for i in range(self.num_sources):
            window[0][i] += amounts[i] - last[1][i]
            window[1][i] += expected[i] - last[2][i]
        window[2][0] += picks - last[0]
        self._last[stream] = (picks, amounts, expected)

    def windows(self) -> list[BlendWindow]:
        return [
            _window(index, self.window, amounts, expected, picks[0], self.sized)
            for index, (amounts, expected, picks) in sorted(self._windows.items())
        ]

    def totals(self) -> tuple[list[float], list[float]]:
        """Per source: what was picked (samples, or the size with ``blend_by``) and the target."""
        counts = [0.0] * self.num_sources
        expected = [0.0] * self.num_sources
        for _, c, e in self._last.values():
            for i in range(self.num_sources):
                counts[i] += c[i]
                expected[i] += e[i]
        return counts, expected


def _schedule_totals(
    snap: StreamSnapshot, sources: int
) -> tuple[int, list[float], list[float], bool]:
    """(picks, picked per source, targets per source, whether they are sizes) of a stream's blend:
    sample counts, or the sizes of a blend weighted by size."""
    state = snapshot.pointer_state(snap)["schedule"] or {}
    picks = int(state.get("picks", 0))
    sized = "sizes" in state
    picked = state["sizes"] if sized else state.get("counts", [0] * sources)
    expected = [float(e) for e in state.get("expected", [0.0] * sources)]
    return picks, [float(c) for c in picked], expected, sized


def _window(
    index: int,
    size: int,
    picked: list[float],
    expected: list[float],
    picks: int,
    sized: bool = False,
) -> BlendWindow:
    amount = sum(picked)
    total = sum(expected) or 1.0
    return BlendWindow(
        start=index * size,
        end=(index + 1) * size,
        picks=picks,
        requested=[e / total for e in expected],
        observed=[c / (amount or 1) for c in picked],
        size=amount if sized else None,
    )


def source_rows(
    spec: PipelineSpec,
    consumed: list[int],
    expected: list[float] | None,
    sizes: list[float] | None = None,
) -> list[dict[str, Any]]:
    """The per-source part of a report; ``sizes``: of a blend weighted by size, the size picked
    per source (the observed shares are then of the size)."""
    picked = sizes if sizes is not None else consumed
    total = sum(picked) or 1
    target = sum(expected) if expected else 0.0
    weighted = spec.mode == "weight"
    schedules = _schedule_descriptions(spec)
    return [
        {
            "name": name,
            "path": source.leaf.fingerprint()["path"],
            "split_part": source.leaf.split_part,
            "weight": source.weight if weighted else None,
            "schedule": schedules[i] if weighted else None,
            "repetitions": source.repetitions if spec.mode == "repetitions" else None,
            "consumed": count,
            **({"size": sizes[i]} if sizes is not None else {}),
            "requested": expected[i] / target if expected and target else None,
            "observed": picked[i] / total,
        }
        for i, (name, source, count) in enumerate(zip(source_names(spec), spec.sources, consumed))
    ]


def _schedule_descriptions(spec: PipelineSpec) -> list[str]:
    mixture = spec.mixture
    if mixture is None:
        return [f"{s.weight:g}" for s in spec.sources]
    out = []
    for path in mixture.paths:
        factors = [mixture.levels[g][e].describe() for g, e in path]
        out.append(" x ".join(factors) if factors else "1")
    return out


def simulate_blend(
    spec: PipelineSpec, samples: int, window: int, *, progress: bool = False
) -> BlendReport:
    """What a weight blend will pick over the first ``samples`` global samples, from the plan alone:
    every logical stream's real schedule is run (no data read; a blend weighted by size runs the
    stream's readers too and looks its samples' sizes up in the index). Weight changes made online
    are not part of a config and are not simulated."""
    if not spec.training or spec.mode != "weight":
        raise ValueError("only a training weight blend ('blend') has a mixture to simulate")
    sources = len(spec.sources)
    L = spec.num_streams
    sized = spec.blend_by.by_size
    windows: dict[int, tuple[list[float], list[float], list[int]]] = {}
    totals_c, totals_p, totals_e = [0] * sources, [0.0] * sources, [0.0] * sources
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=samples, desc="Simulating the blend", unit="sample")
    for stream in range(min(L, samples)):
        schedule, pick = _picker(spec, stream)
        picks = -(-(samples - stream) // L)
        k = 0
        while k < picks:
            index = (k * L + stream) // window
            # picks of this stream in window `index`: clocks k*L+s < (index + 1) * window
            stop = min(picks, -(-((index + 1) * window - stream) // L))
            before_p, before_e = _picked(schedule), schedule.expected()
            for _ in range(stop - k):
                pick()
            after_p, after_e = _picked(schedule), schedule.expected()
            p, e, n = windows.setdefault(index, ([0.0] * sources, [0.0] * sources, [0]))
            for i in range(sources):
                p[i] += after_p[i] - before_p[i]
                e[i] += after_e[i] - before_e[i]
            n[0] += stop - k
            if bar is not None:
                bar.update(stop - k)
            k = stop
        for i, (count, amount, target) in enumerate(
            zip(schedule.counts, _picked(schedule), schedule.expected())
        ):
            totals_c[i] += count
            totals_p[i] += amount
            totals_e[i] += target
    if bar is not None:
        bar.close()
    return BlendReport(
        sources=source_rows(spec, totals_c, totals_e, totals_p if sized else None),
        windows=[
            _window(j, window, *windows[j][:2], windows[j][2][0], sized) for j in sorted(windows)
        ],
        window=window,
        streams=list(range(L)),
        num_streams=L,
        unit=spec.blend_by.unit(),
    )


def _picker(spec: PipelineSpec, stream: int) -> tuple[Any, Any]:
    """The schedule of ``stream`` and what makes it pick once: the schedule alone, or for a blend
    weighted by size the stream's pointer source (its readers tell each pick's sample)."""
    if not spec.blend_by.by_size:
        schedule = blend_schedule(spec, stream)
        return schedule, schedule.next
    source = pointer_source(spec, stream)
    return source.schedule, source.next


def _picked(schedule: Any) -> list[float]:
    sizes = getattr(schedule, "sizes", None)
    return list(sizes) if sizes is not None else [float(c) for c in schedule.counts]


_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def _html_page(report: BlendReport, title: str) -> str:
    width, height, pad = 900, 380, 50
    windows = report.windows
    x0 = windows[0].start if windows else 0
    x1 = windows[-1].end if windows else 1

    def x(v: float) -> float:
        return pad + (v - x0) / max(1, x1 - x0) * (width - 2 * pad)

    def y(v: float) -> float:
        return height - pad - v * (height - 2 * pad)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect x="{pad}" y="{pad}" width="{width - 2 * pad}" height="{height - 2 * pad}" '
        'fill="none" stroke="#999"/>',
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(
            f'<text x="{pad - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:.2f}</text>'
        )
    for tick in range(6):
        value = x0 + (x1 - x0) * tick / 5
        parts.append(
            f'<text x="{x(value):.1f}" y="{height - pad + 16}" text-anchor="middle">'
            f"{int(value):,}</text>"
        )
    parts.append(
        f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">global samples '
        "(dashed: requested, solid: observed)</text>"
    )
    for i, _ in enumerate(report.names):
        color = _COLORS[i % len(_COLORS)]
        mids = [(w.start + w.end) / 2 for w in windows]
        for key, dash in (("requested", ' stroke-dasharray="6 4"'), ("observed", "")):
            points = " ".join(
                f"{x(m):.1f},{y(getattr(w, key)[i]):.1f}" for m, w in zip(mids, windows)
            )
            parts.append(
                f'<polyline class="{key}" data-source="{i}" fill="none" stroke="{color}" '
                f'stroke-width="1.5"{dash} points="{points}"/>'
            )
    parts.append("</svg>")
    legend = "".join(
        f'<li><span style="color:{_COLORS[i % len(_COLORS)]}">&#9632;</span> '
        f"[{i}] {html.escape(s['name'])}: {html.escape(str(s['schedule']))}</li>"
        for i, s in enumerate(report.sources)
    )
    rows = "".join(
        f"<tr><td>{w.start:,}</td><td>{w.end:,}</td><td>{w.picks:,}</td>"
        + "".join(
            f"<td>{r * 100:.2f}</td><td>{o * 100:.2f}</td>" for r, o in zip(w.requested, w.observed)
        )
        + "</tr>"
        for w in windows
    )
    head = "".join(f"<th>[{i}] req %</th><th>[{i}] obs %</th>" for i in range(len(report.names)))
    data = html.escape(json.dumps(report.to_dict()))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p>{len(report.streams)} of {report.num_streams} logical streams, windows of "
        f"{report.window:,} global samples; largest |observed - requested| share in a window: "
        f"{report.max_deviation():.4f}</p>"
        f"<ul>{legend}</ul>{''.join(parts)}"
        f"<table><tr><th>from</th><th>to</th><th>picks</th>{head}</tr>{rows}</table>"
        f'<script type="application/json" id="report">{data}</script>'
        "</body></html>"
    )
