"""Re-run every workload's benchmark and write docs/benchmarks.md, one current page.

    python tools/benchmarks/run_all.py [--root bench_data] [--only loader,prepare] [--quick]
                                       [--list] [--page docs/benchmarks.md]

Each workload of ``suite.WORKLOADS`` runs its commands one after the other, each in a fresh
process with this checkout first on ``PYTHONPATH``; the load average and the machine (cores,
Python, torch, commit) are recorded with every command. The workload's section of the page
(``## <title>``) is then replaced by what the command measured: the markdown tables it printed
(each puts the figure next to its limit or baseline of the same run), or its output where it
prints no table, under the exact command, its date, wall time and load. Sections of workloads
not run (``--only``) and sections the suite does not know are kept as they are; the page's
introduction and its summary table are rewritten from the sections' recorded runs.

``--quick`` runs every command at tiny sizes: it proves that the commands still work, and the
page then says so in every section (the numbers mean nothing). Nothing is interactive; the data
is generated under ``--root`` where missing (the loader workloads take about 5-15 minutes once).
Full output of every command is kept in ``<root>/run_all-logs/``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from importlib import metadata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import replace_section  # noqa: E402
from suite import WORKLOADS, Step, Workload, by_key  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(REPO, "docs", "benchmarks.md")
SCRIPTS = "tools/benchmarks"
_META = re.compile(r"^<!-- run_all (\{.*\}) -->$", re.M)
_OUTPUT_TAIL_LINES = 40


@dataclass(frozen=True)
class StepResult:
    """What one command did: its exact command line, exit code, time, load and output."""

    command: str
    returncode: int
    started: str  # UTC, minutes
    seconds: float
    load_before: float  # 1-minute load average
    load_after: float
    stdout: str
    stderr_tail: str


def machine() -> str:
    """Cores, Python, torch and the checkout's commit: what every number was taken on."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return (
        f"{os.cpu_count()} cores, Python {platform.python_version()}, torch {torch_version}, "
        f"commit {_commit()}"
    )


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" (with local changes)" if git("status", "--porcelain", "energon") else "")


def command_line(step: Step, quick: bool, root: str) -> str:
    env = "".join(f"{name}={value} " for name, value in step.env.items())
    args = " ".join(shlex.quote(arg) for arg in step.args(quick, root))
    return f"{env}python {SCRIPTS}/{step.script} {args}".rstrip()


def run_step(step: Step, quick: bool, root: str, log_dir: str, timeout: float) -> StepResult:
    """Run one benchmark command in a fresh process; its whole output goes to ``log_dir``."""
    env = dict(os.environ, **step.env)
    env["PYTHONPATH"] = os.pathsep.join([REPO, *filter(None, [env.get("PYTHONPATH")])])
    argv = [sys.executable, os.path.join(REPO, SCRIPTS, step.script), *step.args(quick, root)]
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_before = os.getloadavg()[0]
    begin = time.monotonic()
    try:
        done = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        returncode = -1
        stdout = _text(expired.stdout)
        stderr = _text(expired.stderr) + f"\n(stopped after the runner's timeout, {timeout:.0f} s)"
    seconds = time.monotonic() - begin
    log_name = f"{step.script.removesuffix('.py')}-{int(time.time())}.log"
    with open(os.path.join(log_dir, log_name), "w") as log:
        log.write(f"$ {shlex.join(argv)}\n\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n")
    return StepResult(
        command_line(step, quick, root),
        returncode,
        started,
        seconds,
        load_before,
        os.getloadavg()[0],
        stdout,
        "\n".join(stderr.strip().splitlines()[-_OUTPUT_TAIL_LINES:]),
    )


def _text(output: bytes | str | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def markdown_tables(output: str) -> list[str]:
    """The markdown tables in a command's output (runs of lines that start with ``|``)."""
    tables, current = [], []
    for line in output.splitlines() + [""]:
        if line.lstrip().startswith("|"):
            current.append(line.strip())
            continue
        if len(current) >= 2 and set(current[1].replace("|", "").strip()) <= set("-: "):
            tables.append("\n".join(current))
        current = []
    return tables


def step_text(result: StepResult, machine_line: str, quick: bool) -> str:
    """One command's part of a section: how it ran, then what it measured."""
    status = "ok" if result.returncode == 0 else f"**FAILED** (exit code {result.returncode})"
    sizes = " **Quick sizes: these numbers only show that the command runs.**" if quick else ""
    lines = [
        f"`{result.command}`",
        "",
        _wrap(
            f"{result.started}, {result.seconds:.0f} s, load average {result.load_before:.2f} "
            f"before / {result.load_after:.2f} after (1 min); {machine_line}; {status}.{sizes}"
        ),
        "",
    ]
    tables = markdown_tables(result.stdout) if result.returncode == 0 else []
    if tables:
        lines.append("\n\n".join(tables))
    else:
        shown = result.stdout.strip().splitlines()[-_OUTPUT_TAIL_LINES:]
        if result.returncode != 0:
            shown += ["--- stderr (last lines)", *result.stderr_tail.splitlines()]
        lines += ["```text", *shown, "```"]
    return "\n".join(lines)


def section_text(
    workload: Workload, results: list[StepResult], machine_line: str, quick: bool
) -> str:
    """A workload's whole section, with its run recorded in a comment for the summary."""
    loads = [load for r in results for load in (r.load_before, r.load_after)]
    meta = {
        "date": results[0].started,
        "quick": quick,
        "load": [round(min(loads), 2), round(max(loads), 2)],
        "seconds": round(sum(r.seconds for r in results)),
        "failed": sum(r.returncode != 0 for r in results),
    }
    parts = [f"<!-- run_all {json.dumps(meta)} -->", _wrap(f"What: {workload.about}")]
    parts += [step_text(result, machine_line, quick) for result in results]
    if workload.not_rerun:
        parts.append(_wrap(f"*Not re-run by `run_all.py`*: {workload.not_rerun}"))
    return "\n\n".join(parts)


def _wrap(paragraph: str) -> str:
    return textwrap.fill(paragraph, width=100, break_long_words=False, break_on_hyphens=False)


def section_meta(page: str, title: str) -> dict | None:
    """The run recorded in a section of ``page`` (None: not written by this runner)."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", page, re.S | re.M)
    found = _META.search(match.group(1)) if match else None
    return json.loads(found.group(1)) if found else None


def summary_table(page: str) -> str:
    """One row per workload: when it last ran, at what load, how long, and how it went."""
    rows = [
        "| workload | last run | load average (1 min) | seconds | result |",
        "| --- | --- | --: | --: | --- |",
    ]
    total = 0
    for workload in WORKLOADS:
        anchor = re.sub(r"[^a-z0-9 -]", "", workload.title.lower()).replace(" ", "-")
        link = f"[{workload.title}](#{anchor})"
        meta = section_meta(page, workload.title)
        if meta is None:
            rows.append(f"| {link} | not yet run by `run_all.py` | | | |")
            continue
        total += meta["seconds"]
        result = "ok" if not meta["failed"] else f"{meta['failed']} command(s) failed"
        if meta["quick"]:
            result += ", quick sizes"
        load = f"{min(meta['load']):.1f}-{max(meta['load']):.1f}"
        rows.append(f"| {link} | {meta['date']} | {load} | {meta['seconds']} | {result} |")
    rows.append(f"| all of the above | | | {total} ({total / 60:.0f} min) | |")
    return "\n".join(rows)


def introduction(page: str, root: str) -> str:
    minutes = sum(workload.minutes for workload in WORKLOADS)
    return f"""# Benchmarks

Today's numbers of every workload, each next to its limit measured in the same run: a raw read
and decode of the same bytes, or the reference (Megatron-Energon 7.x) where that is the
comparison. One command re-runs them all and rewrites this page (about {minutes:.0f} minutes on
this project's 2-core machine when it is quiet; the data is generated first where missing):

    python tools/benchmarks/run_all.py --root {root}        # or: make bench

`--only loader,prepare` re-runs some workloads and keeps the other sections; `--list` shows the
workloads and their commands; `--quick` runs everything at tiny sizes (it proves the commands
work; its numbers mean nothing). Every section gives the exact command, its date, wall time,
the load average before and after it, and the machine. This machine is shared: a load average
above its 2 cores stretches wall-clock rates (read the per-CPU-second columns then) and moves
single runs by 2-3x; ratios against a limit of the same run move much less.

How the numbers came to be (methods, profiles, what was tried, before/after comparisons of each
change) is in [benchmarks-history.md](benchmarks-history.md), the dated rounds of earlier work.
A new workload goes into `tools/benchmarks/suite.py` (its title, what it measures against which
limit, its full and quick commands); a section the suite does not know is kept as it was written.

{summary_table(page)}
"""


def write_page(path: str, sections: dict[str, str], root: str) -> None:
    """Replace the given sections (title -> text) and rewrite the introduction."""
    page = open(path).read() if os.path.exists(path) else ""
    for title, text in sections.items():
        page = replace_section(page, title, text)
    body = page[page.index("\n## ") + 1 :] if "\n## " in page else ""
    with open(path, "w") as f:
        f.write(introduction(page, root) + "\n" + body)


def run_workload(
    workload: Workload, args: argparse.Namespace, log_dir: str, machine_line: str
) -> str:
    results = []
    for step in workload.steps:
        timeout = 600 if args.quick else max(900, workload.minutes * 60 * 4)
        print(f"  {command_line(step, args.quick, args.root)}", file=sys.stderr, flush=True)
        result = run_step(step, args.quick, args.root, log_dir, timeout)
        outcome = "ok" if result.returncode == 0 else f"FAILED (exit code {result.returncode})"
        print(
            f"  -> {outcome} in {result.seconds:.0f} s, load {result.load_after:.1f}",
            file=sys.stderr,
            flush=True,
        )
        results.append(result)
    return section_text(workload, results, machine_line, args.quick)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="bench_data", help="data folder (made if missing)")
    parser.add_argument("--only", default="", help="comma-separated workload keys (see --list)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: prove the commands run")
    parser.add_argument("--list", action="store_true", help="print the workloads and commands")
    parser.add_argument("--page", default=PAGE, help="the page to write")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workloads = by_key(args.only) if args.only else list(WORKLOADS)
    if args.list:
        for workload in workloads:
            print(f"{workload.key}: {workload.title} (~{workload.minutes:g} min)")
            for step in workload.steps:
                print(f"    {command_line(step, args.quick, args.root)}")
        return 0
    log_dir = os.path.join(os.path.abspath(os.path.join(REPO, args.root)), "run_all-logs")
    os.makedirs(log_dir, exist_ok=True)
    machine_line = machine()
    expected = sum(workload.minutes for workload in workloads)
    print(
        f"{len(workloads)} workloads, about {expected:.0f} min when quiet "
        f"({'quick sizes, ' if args.quick else ''}{machine_line}); logs in {log_dir}",
        file=sys.stderr,
        flush=True,
    )
    failed = 0
    begin = time.monotonic()
    for number, workload in enumerate(workloads, 1):
        print(f"[{number}/{len(workloads)}] {workload.title}", file=sys.stderr, flush=True)
        text = run_workload(workload, args, log_dir, machine())  # the commit as it starts
        write_page(args.page, {workload.title: text}, args.root)  # a stop keeps what ran
        failed += "**FAILED**" in text
    minutes = (time.monotonic() - begin) / 60
    print(
        f"done in {minutes:.1f} min; {failed} workload(s) with a failed command; wrote {args.page}",
        file=sys.stderr,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
