"""energon's balanced steps side by side with megatron-core's balanced scheduler, same lengths.

    python tools/benchmarks/bench_balance_megatron.py            # --mcore-python: its venv

megatron-core (0.19) balances the sub-samples of a global batch across its data- (and context-)
parallel ranks after the loader: ``BalancedCPScheduler.get_groups_and_subsamples`` takes
``(sample id, sequence length)`` pairs and returns groups of per-GPU sample ids, costing a sample
by its length alone (``get_total_workload``: ``length ** 2``). It runs on CPU; it is called here
through its own API in a side venv (``--mcore-python``; ``tests/helpers/megatron_venv.py`` builds
``.cache/mcore019-venv``) with a real gloo group of ``--ranks`` processes (rank 0 schedules).
It cannot take image costs: a sample is one length. So both are compared on lengths:

- *text*: log-normal document lengths (median 800 tokens, sigma 1, at most ``--max-length``);
- *VLM*: the total tokens (text + image patches + video frames, from the index) of the demo VLM
  mix of ``bench_balance.py``; megatron sees them as one length, as it would a packed VLM
  sequence (energon's ``MultimodalCost`` also prices a token the same whatever it is; a fitted
  cost, ``energon.fit_cost``, can price media tokens differently, which megatron cannot).

Per global step the ``--ranks`` x ``--batch`` samples are scheduled by megatron (per step, its
groups run back to back on each rank) and composed by energon (``compose_steps`` with the same
cost, per step and per window of ``--window`` steps). Reported: the straggler ratio of each step
(slowest rank over the mean, under megatron's own cost ``length ** 2`` and under energon's
``length + length ** 2 / 4096``), the padding when each rank's share of a step is packed first-fit
decreasing into sequences of ``--max-length`` (energon's ``BalancedBatch`` layout), and the CPU
time of scheduling per step (process time; megatron's all-gather of lengths and all-to-all of
samples not included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np
from bench_balance import dataset_root
from bench_common import machine_summary, print_markdown_table

from energon.balance.assign import compose_steps, straggler_ratio
from energon.balance.cost import MultimodalCost
from energon.balance.table import CostTable
from energon.source.webdataset import WebdatasetLeaf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MCORE = os.path.join(REPO, ".cache", "mcore019-venv", "bin", "python")

# Runs in megatron-core's venv: argv[1] a JSON job {ranks, max_length, steps: [[len, ...]], out}.
MCORE_SCHEDULE = r"""
import json, os, sys, time, warnings
warnings.filterwarnings("ignore")
import torch.distributed as dist
import torch.multiprocessing as mp

def rank_main(rank, job):
    dist.init_process_group("gloo", rank=rank, world_size=job["ranks"], init_method="file://" + job["store"])
    if rank == 0:
        import importlib.metadata
        from megatron.core.pipeline_parallel.hybrid_cp_schedule import BalancedCPScheduler
        sched = BalancedCPScheduler(max_seq_len_per_rank=job["max_length"], dp_cp_group=dist.group.WORLD)
        steps, cpu = [], []
        for lengths in job["steps"]:
            start = time.process_time()
            groups, per_gpu = sched.get_groups_and_subsamples(list(enumerate(lengths)), None)
            cpu.append(time.process_time() - start)
            steps.append(per_gpu)  # [group][gpu] -> sample ids
        with open(job["out"], "w") as f:
            json.dump({"steps": steps, "cpu": cpu, "version": importlib.metadata.version("megatron-core")}, f)
    dist.barrier()

if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    mp.start_processes(rank_main, args=(job,), nprocs=job["ranks"], start_method="fork")
"""


def text_lengths(count: int, max_length: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(800), 1.0, count), 8, max_length).astype(int).tolist()


def vlm_lengths(count: int, max_length: int, root: str) -> list[int]:
    """Total tokens of the demo VLM mix's samples, from the index (no data read)."""
    path = dataset_root(root, max(4000, count), progress=True)
    leaf = WebdatasetLeaf.open(path, split_part="train")
    table = CostTable([leaf], MultimodalCost())
    rng = np.random.default_rng(1)
    picks = rng.permutation(len(leaf))[:count].tolist()
    return [min(max_length, table.cost(0, int(i)).tokens) for i in picks]


def megatron_schedule(python: str, steps: list[list[int]], ranks: int, max_length: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        job = {
            "ranks": ranks,
            "max_length": max_length,
            "steps": steps,
            "out": os.path.join(tmp, "out.json"),
            "store": os.path.join(tmp, "store"),
        }
        subprocess.run([python, "-c", MCORE_SCHEDULE, json.dumps(job)], check=True, timeout=3600)
        with open(job["out"]) as f:
            return json.load(f)


def packed_padding(lengths: list[int], max_length: int) -> tuple[int, int]:
    """(padding tokens, layout tokens) of ``lengths`` packed first-fit decreasing into
    sequences of ``max_length``."""
    free: list[int] = []
    for n in sorted(lengths, reverse=True):
        for i, room in enumerate(free):
            if n <= room:
                free[i] -= n
                break
        else:
            free.append(max_length - n)
    return sum(free), len(free) * max_length


def step_figures(shares: list[list[int]], lengths: list[int], max_length: int) -> dict:
    """Straggler ratios under both costs and the padding of one step's per-rank shares."""
    quadratic = [sum(lengths[i] ** 2 for i in share) for share in shares]
    ours = [sum(lengths[i] + lengths[i] ** 2 / 4096 for i in share) for share in shares]
    pads = [packed_padding([lengths[i] for i in share], max_length) for share in shares]
    return {
        "ratio_quadratic": straggler_ratio(quadratic),
        "ratio_ours": straggler_ratio(ours),
        "pad": sum(p for p, _ in pads),
        "layout": sum(t for _, t in pads),
    }


def energon_steps(lengths, args, window: int, cost) -> tuple[list[list[list[int]]], list[float]]:
    """Per step: the per-rank sample indices (into ``lengths``); per step: CPU seconds."""
    per_window = args.ranks * args.batch * window
    steps, cpu = [], []
    for start in range(0, len(lengths), per_window):
        pool = lengths[start : start + per_window]
        began = time.process_time()
        composed = compose_steps([cost(n) for n in pool], args.ranks, window)
        spent = time.process_time() - began
        cpu += [spent / window] * window
        steps += [[[start + i for i in share] for share in step] for step in composed]
    return steps, cpu


def run(name: str, lengths: list[int], args) -> list[tuple]:
    per_step = args.ranks * args.batch
    steps = [lengths[s * per_step : (s + 1) * per_step] for s in range(args.steps)]
    lengths = [n for step in steps for n in step]
    mc = megatron_schedule(args.mcore_python, steps, args.ranks, args.max_length)
    configs = {}
    mc_shares = []
    for s, groups in enumerate(mc["steps"]):  # a rank runs its groups back to back
        shares = [[s * per_step + i for g in groups for i in g[r]] for r in range(args.ranks)]
        mc_shares.append(shares)
        placed = sorted(i for share in shares for i in share)
        assert placed == list(range(s * per_step, (s + 1) * per_step)), "megatron: not once each"
    configs[f"megatron-core {mc['version']} BalancedCPScheduler (per step)"] = (
        mc_shares,
        mc["cpu"],
    )
    groups = [len(g) for g in mc["steps"]]

    def ours(n: int) -> float:
        return n + n * n / 4096

    def quadratic(n: int) -> float:
        return float(n * n)

    for window in (1, args.window):
        for label, cost in (("length^2", quadratic), ("length + length^2/4096", ours)):
            configs[f"energon window {window}, cost {label}"] = energon_steps(
                lengths, args, window, cost
            )
    rows = []
    for config, (shares, cpu) in configs.items():
        figures = [step_figures(step, lengths, args.max_length) for step in shares]
        q = sorted(f["ratio_quadratic"] for f in figures)
        o = sorted(f["ratio_ours"] for f in figures)
        rows.append(
            (
                name,
                config,
                f"{statistics.median(q):.3f} / {q[-1]:.3f}",
                f"{statistics.median(o):.3f} / {o[-1]:.3f}",
                f"{sum(x > 1.05 for x in o)} of {len(o)}",
                f"{sum(f['pad'] for f in figures) / sum(f['layout'] for f in figures):.1%}",
                f"{1e3 * statistics.mean(cpu):.2f}",
            )
        )
    print(f"{name}: megatron groups per step {min(groups)}..{max(groups)}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mcore-python", default=DEFAULT_MCORE)
    parser.add_argument("--root", default="bench_data")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=16384)
    args = parser.parse_args()
    if not os.path.exists(args.mcore_python):
        parser.error(
            f"{args.mcore_python} not found: build it with python -c 'from "
            'tests.helpers.megatron_venv import mcore_python; mcore_python("0.19")\''
        )
    if args.steps % args.window:
        parser.error("--steps must be a multiple of --window")
    print(machine_summary())
    count = args.steps * args.ranks * args.batch
    rows = run("text", text_lengths(count, args.max_length), args)
    rows += run("VLM", vlm_lengths(count, args.max_length, args.root), args)
    print(
        f"{args.ranks} ranks x {args.batch} samples per step, {args.steps} steps, max length "
        f"{args.max_length}; load average {os.getloadavg()[0]:.1f}"
    )
    print_markdown_table(
        (
            "lengths",
            "scheduler",
            "straggler, cost length^2: median / worst",
            "straggler, cost length + length^2/4096: median / worst",
            "steps > 1.05 (2nd cost)",
            "padding",
            "CPU ms per step",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
