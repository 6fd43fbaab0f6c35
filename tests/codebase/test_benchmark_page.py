"""docs/benchmarks.md is one current page, written by ``tools/benchmarks/run_all.py``.

The runner is run as a program (tests never import tools): its list of workloads must match the
page, and a quick run of one cheap workload must rewrite that workload's section and the summary
while keeping every other section of the page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers.paths import REPO_ROOT

RUNNER = REPO_ROOT / "tools" / "benchmarks" / "run_all.py"


def run_runner(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, str(RUNNER), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_workload_of_the_runner_has_its_section_and_scripts():
    listed = run_runner("--list")
    assert listed.returncode == 0, listed.stderr
    titles = re.findall(r"^\w+: (.+) \(~[\d.]+ min\)$", listed.stdout, re.M)
    scripts = re.findall(r"python (tools/benchmarks/\S+\.py)", listed.stdout)
    assert len(titles) >= 22 and len(set(titles)) == len(titles)
    page = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    assert [title for title in titles if f"\n## {title}\n" not in page] == []
    assert all((REPO_ROOT / script).is_file() for script in scripts)
    assert "python tools/benchmarks/run_all.py" in page
    assert "(benchmarks-history.md)" in page
    assert (REPO_ROOT / "docs" / "benchmarks-history.md").is_file()


def test_a_quick_run_rewrites_its_section_and_keeps_the_others(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text(
        "# Old intro\n\nold words\n\n## Packing\n\nstale numbers\n\n"
        "## Someone else's section\n\nkept text\n"
    )
    done = run_runner(
        "--only", "packing", "--quick", "--root", str(tmp_path / "data"), "--page", str(page)
    )
    assert done.returncode == 0, done.stderr
    written = page.read_text()
    assert written.startswith("# Benchmarks\n") and "old words" not in written
    assert "stale numbers" not in written
    assert "## Someone else's section\n\nkept text" in written
    packing = written.split("## Packing\n", 1)[1].split("\n## ", 1)[0]
    assert "`python tools/benchmarks/bench_packing.py --samples 2000`" in packing
    assert re.search(r"load average [\d.]+\s+before / [\d.]+\s+after", packing)
    assert re.search(r"\d+ cores,\s+Python\s+[\d.]+,\s+torch\s", packing)
    assert re.search(r"Quick\s+sizes", packing)
    assert re.search(r"^\| lengths +\| method", packing, re.M)  # the benchmark's own table
    assert re.search(
        r"^\| \[Packing\]\(#packing\) \| \d{4}-.* \| ok, quick sizes \|$", written, re.M
    )
    assert "| [Loader throughput](#loader-throughput) | not yet run" in written
    assert written.count("## Packing\n") == 1
