"""The workloads of docs/benchmarks.md: for each, the benchmark commands that measure it now.

``run_all.py`` runs these commands and writes one section of the page per workload. Each
command names its full-size arguments (what the page records) and quick ones (tiny sizes that
only prove the command still runs). ``{root}`` is the data folder of the run (``--root``);
every benchmark generates the data it needs there when it is missing.

``minutes`` estimates what the full-size commands take on this project's 2-core machine when it
is quiet, from the recorded runs (most of them at other sizes or under load), once the data
exists: the runner prints the sum before it starts, and the page records what each run took.
``not_rerun`` says what the page used to cover that the runner does not repeat, why, and the
latest recorded number with its date (the rounds are in docs/benchmarks-history.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Step:
    """One benchmark command: ``python tools/benchmarks/<script> <args>``."""

    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def args(self, quick: bool, root: str) -> list[str]:
        return [arg.replace("{root}", root) for arg in (self.quick if quick else self.full)]


@dataclass(frozen=True)
class Workload:
    """One section of the page: ``## title`` (other tools key on it: keep titles stable)."""

    key: str
    title: str
    about: str
    steps: tuple[Step, ...]
    minutes: float
    not_rerun: str = ""


def _step(script: str, full: str, quick: str, **env: str) -> Step:
    return Step(script, tuple(full.split()), tuple(quick.split()), env)


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "loader",
        "Loader throughput",
        "captioning (20,000 JPEGs + captions, 40 shards) and text (200,000 texts, 20 shards) "
        "through the public API (`get_train_dataset` + `get_loader`, batch 32, default float32 "
        "images), 0 and 2 workers, a fresh process per run. The **limit** is measured in the "
        "same rounds on the same bytes: the fastest installed JPEG decoder, decode only (1 "
        "process for 0 workers, 2 for 2), or tar read + UTF-8 decode for text. Read the "
        "ratio per CPU-second where the load is high.",
        (
            _step(
                "bench_loader.py",
                "--root {root} --workload all --workers 0,2 --runs 3",
                "--root {root} --workload all --workers 0,2 --runs 1 --batches 10",
            ),
        ),
        2.5,
    ),
    Workload(
        "uint8",
        "uint8 batches and the default install",
        'captioning with uint8 batches (`image_decode="torchrgb8"`, a quarter of the bytes of '
        "float32, converted on the device), with the simplejpeg path on and off "
        "(`ENERGON_NO_FAST_JPEG=1`: an install without simplejpeg, which decodes with Pillow); "
        "the limit is simplejpeg's decode-only rate in the same rounds. The float32 rows are "
        'those of "Loader throughput".',
        (
            _step(
                "bench_loader.py",
                "--root {root} --workload captioning --workers 0,2 --runs 1 "
                "--image-decode torchrgb8 --fast-jpeg on,off",
                "--root {root} --workload captioning --workers 0,2 --runs 1 --batches 5 "
                "--image-decode torchrgb8 --fast-jpeg on,off",
            ),
        ),
        1.0,
    ),
    Workload(
        "prepare",
        "Preparation speed",
        "`energon prepare` of the loader workloads (hard links of their shards in a scratch "
        "folder), energon's `prepare_dataset()` and CLI against the reference's CLI "
        "(`.cache/ref-venv`, a black box) in the same rounds, order rotating.",
        (_step("bench_prepare.py", "--root {root} --rounds 2", "--root {root} --rounds 1"),),
        1.0,
    ),
    Workload(
        "state",
        "Save and restore",
        "batch 32, shuffle buffer 100; state saved after 50 batches and restored into a fresh "
        "loader. The baseline is a fresh loader's time to its first batch in the same run.",
        (_step("bench_state.py", "--root {root}", "--root {root} --steps 5"),),
        0.5,
    ),
    Workload(
        "blend",
        "Blending",
        "the text workload's three thirds blended 1:1:1 against the single source over the "
        "same bytes (the baseline), by samples and by tokens.",
        (_step("bench_blend.py", "--root {root} --batches 500", "--root {root} --batches 30"),),
        0.7,
    ),
    Workload(
        "schedule",
        "Weight schedules",
        "the same blend with linear / step weight schedules against fixed weights (the "
        "baseline), loaders taking turns in one process; CPU time per sample.",
        (
            _step(
                "bench_schedule.py",
                "--root {root} --rounds 10",
                "--root {root} --rounds 2 --chunk 10",
            ),
        ),
        0.5,
    ),
    Workload(
        "packing",
        "Packing",
        "padding and split samples per packer on the same 20,000 synthetic token counts; the "
        "baselines are no packing and naive greedy.",
        (_step("bench_packing.py", "", "--samples 2000"),),
        0.3,
    ),
    Workload(
        "checksums",
        "Robustness: checksums and error accounting",
        "per-sample CRC-32 checks against the same shards prepared without checksums, and the "
        "per-stream error accounts against a loader without them; pairs alternate, fresh "
        "processes.",
        (
            _step(
                "bench_checksums.py",
                "--root {root} --workload text --workers 0 --repeats 3",
                "--root {root} --workload text --workers 0 --repeats 1 --batches 20",
            ),
            _step(
                "bench_loader.py",
                "--root {root} --workload text --workers 0 --batches 500 "
                "--compare-error-accounting 3",
                "--root {root} --workload text --workers 0 --batches 20 "
                "--compare-error-accounting 1",
            ),
        ),
        1.0,
    ),
    Workload(
        "balance",
        "Compute-balanced steps",
        "a synthetic VLM mix with real media (`energon.demo.vlm`), 8 ranks x 16 samples per step: "
        "the straggler ratio of balanced windows against per-rank `SequencePacker` batches of "
        "the same samples (the baseline), and the CPU each costs; the worst step over many "
        "windows of synthetic costs; and megatron-core's `BalancedCPScheduler` on the same "
        "lengths (`.cache/mcore019-venv`).",
        (
            _step(
                "bench_balance.py",
                "--root {root} --rounds 2 --no-progress",
                "--root {root} --samples 400 --steps 4 --rounds 1 --no-progress",
            ),
            _step("bench_balance_bound.py", "--windows 20", "--windows 2"),
            _step("bench_balance_megatron.py", "--root {root}", "--root {root} --steps 8"),
        ),
        2.0,
        not_rerun="Training with balanced steps on 4 gloo ranks "
        "(`python tools/examples/train_balanced_vlm.py`, 6-7 minutes) is not re-run. Latest "
        "recorded (2026-11-27, load average 11-21): with a core per rank, balanced steps "
        "1.45x and 1.53x faster than per-rank batches (two runs), ranks waiting 4-5% of a "
        "step instead of 33%; measured wall time only 1.03-1.09x, because 4 ranks share 2 "
        "cores.",
    ),
    Workload(
        "remote",
        "Remote",
        "the same shards from local disk and from moto's S3 API server through an emulated "
        "link (20 ms to first byte, 16 MB/s); the **limit** is a plain sequential downloader "
        "of the same shards over the same link in the same run (best of 3). Then a short run "
        "with injected faults (cut bodies, 503 SlowDown, stalls) whose output must be "
        "identical.",
        (
            _step(
                "bench_remote.py",
                "--root {root} --workloads text --shards 4 --batches 1500 --link 20,16",
                "--root {root} --workloads text --shards 1 --batches 20 --workers 0 --link 20,16",
            ),
            _step(
                "bench_remote.py",
                "--root {root} --workloads captioning --shards 4 --batches 150 --link 20,16",
                "--root {root} --workloads captioning --shards 1 --batches 5 --workers 0 "
                "--link 20,16",
            ),
            _step(
                "bench_remote.py",
                "--root {root} --workloads text,captioning --shards 2 --batches 100 --faults",
                "--root {root} --workloads text --shards 1 --batches 20 --workers 0 --faults",
            ),
        ),
        2.0,
    ),
    Workload(
        "megatron",
        "Megatron",
        "token windows read by energon's `GPTTokenDataset` against megatron-core's "
        "`GPTDataset` on the same windows (`.cache/mcore-venv`), and the start-up of one rank "
        "of a 1,000-prefix blend at world sizes 8 and 4,096 (cold against cached indices).",
        (
            _step("bench_megatron_tokens.py", "", "--tokens 1000000 --samples 200"),
            _step("bench_megatron_startup.py", "--prefixes 1000", "--prefixes 20 --world-sizes 8"),
        ),
        1.0,
    ),
    Workload(
        "av",
        "Audio and video",
        "eight frames of a 60 s video by seeking against decoding all of it (and a plain PyAV "
        "loop, the baseline); video and audio through the loader against the same decoding "
        "in a plain loop over the same bytes.",
        (_step("bench_av.py", "--workdir {root}/av", "--workdir {root}/av"),),
        1.5,
    ),
    Workload(
        "av_clips",
        "Audio and video clips",
        "three 0.5 s clips per sample of the av demo set through the loader against PyAV "
        "decoding the same clips directly (the baseline, pixel-identical), 0 and 2 workers.",
        (
            _step(
                "bench_av_clips.py",
                "--workdir {root}/av_demo --repeats 2",
                "--workdir {root}/av_demo --repeats 1 --samples 16 --warmup 4",
            ),
        ),
        1.0,
        not_rerun="torchcodec is not compared: its PyPI wheels need CUDA libraries (2026-11-26).",
    ),
    Workload(
        "blend_indices",
        "Blend indices",
        "megatron-core's `build_blending_indices` rule: energon's C loop and Python fallback "
        "against megatron-core's C++ helper (the reference, arrays checked equal).",
        (
            _step(
                "bench_blend_indices.py", "", "--size 200000 --datasets 3,10 --before-samples 20000"
            ),
        ),
        1.0,
    ),
    Workload(
        "ledger",
        "Ledger",
        "a 256-rank job with 2 workers per rank over 1,000,000 tiny texts: describing a step "
        "from a saved state and from the configuration; the baseline is the same pointer "
        "stages stepped in Python.",
        (
            _step(
                "bench_ledger.py",
                "--root {root} --config-steps 1000,4000,16000,64000 --export-steps 10000",
                "--root {root} --samples 20000 --shards 10 --ranks 8 --gap 100 "
                "--config-steps 10,20 --export-steps 10",
            ),
        ),
        1.0,
    ),
    Workload(
        "observe",
        "Observability",
        "CPU per sample of the text workload with stats and watchdog on against off (the "
        "baseline; loaders taking turns in one process), and `measure()`'s estimate against "
        "a real loader with one worker.",
        (
            _step(
                "bench_observe.py",
                "--cpu-overhead --workload text --root {root} --workers 0,2 --rounds 40 "
                "--chunk 25 --batch-size 32",
                "--cpu-overhead --workload text --root {root} --workers 0 --rounds 2 "
                "--chunk 5 --batch-size 32",
            ),
            _step(
                "bench_measure.py",
                "--workload text --root {root}",
                "--workload text --root {root} --samples 64 --batches 10 --repeats 1",
            ),
        ),
        1.0,
    ),
    Workload(
        "text_workers",
        "Text with workers",
        "the text workload with 0 and 2 workers and two 0-worker loaders side by side, CPU "
        "per batch of the main process and the workers; the limit is tar read + UTF-8 "
        "decode with 1 and 2 processes in the same runs.",
        (
            _step(
                "bench_text_workers.py",
                "--root {root} --runs 2",
                "--root {root} --runs 1 --samples 2000 --warmup 64",
            ),
        ),
        0.7,
    ),
    Workload(
        "many_cores",
        "GPU decode and workers on many cores (issue 38)",
        "captioning (float32 images) and text through the public API with 0, 1 and 2 workers, "
        "a fresh process per run, a fixed time each: samples/s, the scaling against linear "
        "(`rate(w) / (w * rate(1))`, issue 38 asks for at least 0.8 up to cores - 2 workers), "
        "CPU per sample and the main process's share (main cores busy near 1.0: the main "
        "process is the limit). On this 2-core machine only 0-2 workers mean anything; the "
        "16-core GPU figures below come from the device script.",
        (
            _step(
                "bench_worker_scaling.py",
                "--dataset captioning={root}/scaling/captioning --dataset text={root}/scaling/text "
                "--workers 0,1,2 --seconds 3",
                "--dataset captioning={root}/scaling-quick/captioning "
                "--dataset text={root}/scaling-quick/text --workers 0,1 --seconds 0.5 --warm 0.3 "
                "--samples captioning=100,text=2000",
            ),
        ),
        1.5,
        not_rerun="GPU decode and 14 workers need a GPU machine with 16 cores: "
        "`CHECKS=gpu38:250 bash tools/device/run_all.sh` (tools/device/gpu38.sh: "
        "bench_gpu_decode.py and bench_worker_scaling.py on 8,000 captioning and 120,000 text "
        "samples), recorded 2026-11-27 22:56-23:00 UTC on an NVIDIA H200, 16 cores, load 0.4, "
        "torch 2.11+cu130, torchvision 0.26, main at c55da39 (the script's gpu38.txt and "
        "gpu38.json, not kept in the repository). **Decode**: raw nvJPEG in batches of 32: 13,884 images/s (0.072 "
        "CPU-ms per image) against libjpeg-turbo on one thread 786 images/s. Through the loader "
        '(`image_decode="encoded"` + `DeviceImageDecoder` with an `ImageNormalizer`, against '
        "`torchrgb8` decoded in the workers + `.to(device)` + `ImageNormalizer`) at 0 / 2 / 14 "
        "workers: 6,283 / 7,881 / 8,799 samples/s against 1,403 / 973 / 4,554; CPU per sample "
        "0.16-0.25 ms against 1.86-2.03 ms; with device decode the main process is the limit "
        "(1.0 core busy, 0.11-0.16 CPU-ms per sample, of which nvJPEG's own CPU work is about "
        "0.07 in the raw rate); no CPU fallbacks. "
        "**Pixels**: nvJPEG equals libjpeg-turbo with simple chroma upsampling (max difference "
        "0 on baseline 4:4:4, 4:2:2, 4:2:0 and grayscale; progressive 4:2:0 max 3, mean 0.03); "
        "against the default CPU path (fancy upsampling) up to 116 on 4:2:0 (mean 2.35), 52 on "
        "4:2:2, 0 on 4:4:4 and grayscale (docs/samples.md). **Captioning scaling** (float32, "
        "pinned for the GPU) vs linear at 1 / 2 / 4 / 8 / 14 workers: 1.0 / 1.05 / 0.99 / 0.89 / "
        "0.87 (419.5 to 5,113 samples/s; goal 0.8 holds), main process 1.5-2.4% of the CPU; with "
        "the GPU hidden (no pinning) at 8 / 14 workers 3,068 / 5,323 samples/s against 3,002 / "
        "5,113 pinned (pinning costs about 4%). **Text scaling** vs linear: 0.79 / 0.75 / 0.71 at "
        "2 / 4 / 8 workers (first run), 0.857 at 8 and 0.721 at 14 workers (138,890 samples/s; "
        "second run, 1 / 8 / 14 workers): the goal is not met for text; at 14 workers the main "
        "process keeps 0.99 of a core busy (0.0071 CPU-ms per sample: a ceiling near 140,000 "
        "samples/s), so the main process is the limit there. **Text re-run after 7eeeb71** "
        "(2026-11-28 00:58-00:59 UTC, same H200, load 1.3-1.8, main at 0bacd47, two runs back to "
        "back of `bench_worker_scaling.py --dataset text=/tmp/t --workers 1,8,14 --seconds 2.5 "
        "--warm 1.0` on 120,000 text samples from `bench_timed.py --make text`): at 14 workers "
        "109,608 and 141,951 samples/s; main CPU per sample 0.0051-0.0059 ms (was 0.0071) and the "
        "main process 0.64-0.73 of a core busy (was 0.99), so it is no longer saturated; vs linear "
        "0.37 / 0.76 at 14 and 0.53 / 0.90 at 8 workers, against a 1-worker rate that itself "
        "moved from 21,281 to 13,290 samples/s between the runs: still under 0.8 at 14 workers. "
        "The CUDA pixel test (tests/decode/test_device_decode.py, rewritten to compare with "
        "simple upsampling) and tests/loader/test_pinning.py pass on the H200 (13 passed, 1 "
        "skipped: the no-CUDA error check).",
    ),
    Workload(
        "arena",
        "Workers' batch memory",
        "captioning with 2 workers: the default batch-memory budget against an unbounded one "
        "(the baseline), in a loop that takes batches as fast as they come and one with "
        "random training steps.",
        (
            _step(
                "bench_arena.py",
                "--root {root} --rounds 1 --batches 120 --step-ms 60",
                "--root {root} --rounds 1 --batches 10 --step-ms 10",
            ),
        ),
        1.0,
    ),
    Workload(
        "parquet",
        "Parquet",
        "the same rows as tar shards and as Parquet files: pyarrow alone in file order (the "
        "raw baseline), energon over both, and Hugging Face `datasets` streaming; resume "
        "exactness and time.",
        (
            _step(
                "bench_parquet.py",
                "--root {root}/parquet --workload captioning --samples 4000 --batches 40",
                "--root {root}/parquet-quick --workload captioning --samples 500 --batches 3",
            ),
            _step(
                "bench_parquet.py",
                "--root {root}/parquet --workload text --samples 20000 --row-group 1000 "
                "--batches 100",
                "--root {root}/parquet-quick --workload text --samples 2000 --row-group 200 "
                "--batches 10",
            ),
        ),
        1.5,
    ),
    Workload(
        "scale",
        "Start-up at scale",
        "rank 4,095 of 4,096 building its dataset and first batch over 10k, 100k and 1M shards "
        "and a blend of 100 datasets, against the reference on the same folders (it is stopped "
        "after 20 s), with the bytes it reads from local disk (first table) and its bytes of "
        "index and metadata from object storage, as `energon simulate` counts them and a test "
        "checks against a real rank's requests (second table); the first batch of the loader workloads against "
        "the reference.",
        (
            _step(
                "bench_scale.py",
                "--root {root}/scale --shards 10000,100000,1000000 --reference-timeout 20",
                "--root {root}/scale-quick --shards 1000 --blend 3 --blend-shards 1000 "
                "--reference-timeout 20",
            ),
            _step(
                "bench_first_batch.py",
                "--root {root} --rounds 2",
                "--root {root} --rounds 1 --workload text --workers 0",
            ),
        ),
        4.0,
        not_rerun="`energon simulate` at 4,096 "
        "ranks x 8 workers over 1M shards (no benchmark script yet; on the quiet machine, "
        "2026-11-27 21:31 UTC, load 1.1, commit 0e74e99: 34.8 s wall, 34.0 s user + 0.9 s "
        'sys, 788 MiB peak RSS, with `/usr/bin/time -f "user %U sys %S wall %e maxrss_kb '
        '%M" energon simulate <1M-shard dataset from bench_scale> --world-size 4096 '
        "--num-workers 8 --batch-size 2`; it reported 235,524-258,964 start-up bytes per "
        "rank with the shard table of format 1, and 63,988-69,636 with format 2 (load 12, "
        "2026-11-27 22:10 UTC); earlier under load 13-22: 32.0 CPU-s, against 38.5 for main at 0c6390d; "
        "see benchmarks-history.md); the reference beyond 20 s (at 1M shards it needed "
        "over 120 s, 2026-11-27).",
    ),
    Workload(
        "prepare-scale",
        "Prepare at scale",
        "`prepare_dataset()` of 1M tiny samples (one 8-byte text member each, 10,000 per "
        "shard), a fresh process per run (imports not timed), with 1 and 2 worker processes, "
        "with the per-sample tables (`index.sqlite`) and without (`--no-sample-tables`). "
        "Samples per CPU-second is what one core does (all processes' CPU time); issue 35 "
        "asks for at least 100k with the tables. Peak RSS main / worker: the processes' own "
        "high-water marks (getrusage); index.sqlite MiB: its size; peak disk: the most the free "
        "space of the disk went down during the run (other writers on a shared disk count too). "
        "The speed-up from more processes (up to 14) and 100M samples without the tables are "
        "measured on a 16-core machine by `tools/device/prep35.sh`.",
        (
            _step(
                "bench_prepare_scale.py",
                "--root {root}/prepare_scale --samples 1000000 --workers 1,2 --tables 1,0",
                "--root {root}/prepare_scale-quick --samples 20000 --workers 1 --tables 0",
            ),
        ),
        1.0,
        not_rerun="**10M and 100M samples with the sample tables** (flat memory, issue 35; "
        "2026-11-28 00:59-01:28 UTC, 2 cores shared with other work, load 3.3-8.9, commit "
        "0bacd47 + this script's memory columns): `python tools/benchmarks/bench_prepare_scale.py "
        "--root /tmp/prep4-b --samples 1000000,10000000,100000000 --workers 2 --tables 1,0 "
        "--max-real 1000000` (run size by size). The 1M shards (100 x 10,000 tiny samples, 1 GB) "
        "are real files; 10M and 100M are 1,000 and 10,000 hard links to them (100M real samples "
        "would be about 100 GB of tar, more than this machine's free disk), read from the page "
        "cache, keys made unique per link by the shard name (see the script's docstring). With "
        "the tables, 2 workers: 1M / 10M / 100M: wall 3.2 / 44.0 / 766 s, CPU 5.8 / 54.6 / 510 s "
        "(172k / 183k / 196k samples per CPU-second), **peak RSS main 115 / 122 / 131 MiB**, "
        "largest worker 44 / 45 / 57 MiB (a chunk holds 1 / 1 / 10 shards), index.sqlite 138 / "
        "1,712 / 17,526 MiB (about 180 bytes per sample), peak disk use 26 GB at 100M (the "
        "index plus the chunks' rows kept for resuming). With 1 worker at 1M / 10M: 123 / 130 MiB "
        "main. Without the tables, 2 workers, at 1M / 10M / 100M: peak RSS main 79 / 79 / 79 MiB, "
        "worker 41 / 42 / 48 MiB, 490k / 606k / 735k samples per CPU-second (100M: 310 s wall, "
        "136 CPU-s). The main process's memory is sqlite's page cache for index.sqlite "
        "(64 MiB, a constant), imports and a few bytes per shard: Python's own objects peaked at "
        "1.3 MiB (1M) and 3.1 MiB (10M) under tracemalloc. **The single-writer merge** (what "
        "bounds the speed-up with the tables; a micro-benchmark of `SqliteIndexWriter.add_chunk` "
        "not kept in the repository, 1M samples in 20 chunks, load 3.7-6): 2.0-2.1 CPU-us per "
        "sample: the samples table with its UNIQUE key index 0.63, its (tar_file_id, "
        "sample_index) index 0.35, the sample_parts table 0.11 (sqlite's page-level transfer, "
        "when it has no index), its two indexes 0.74 kept up or 0.80 built at the end (also with "
        "`PRAGMA threads=4`); exclusive locking and a 256 MiB page cache changed nothing "
        "measurable. No change was taken: building indexes at the end moves work out of the scan "
        "into a serial tail. Keys in random order (hashed names) make it worse: 5 CPU-us per "
        "sample for the first million, 12-13 from the fourth to the eighth million, as the key "
        "index outgrows the page cache (the same with a 256 MiB cache or a 2 GB mmap); keys "
        "that grow with the shard and sample number (as here) stay at 2-3 (prepare now builds "
        "the key index at the end for keys in no order: see Prepare with keys in no order). "
        "**16 cores**: "
        "`CHECKS=prep35:200 bash tools/device/run_all.sh` (tools/device/prep35.sh), recorded "
        "2026-11-27 23:00 UTC on the 16-core host of an NVIDIA H200 machine (CPU only), load "
        "2.8-4.7, main at c55da39 (grouping in C and the merge during the scan, before the "
        "64-row inserts). 2M tiny samples (200 shards), 1 / 2 / 4 / 8 / 14 processes: "
        "without sample tables 2.32 / 1.76 / 0.79 / 0.48 / 0.33 s wall, speed-up 1.00 / 1.32 / "
        "2.94 / 4.81 / 6.98 (0.50-0.74 per process past 1), 617-866k samples per CPU-second; "
        "with sample tables 10.61 / 4.37 / 3.95 / 3.17 / 4.66 s wall, speed-up 1.00 / 2.43 / "
        "2.68 / 3.35 / 2.27, 131-189k samples per CPU-second: from 2 processes on, the wall is "
        "the single-writer `index.sqlite` merge (3.0-4.5 s), so more processes do not help "
        "there. **100M samples** (`--no-sample-tables`, 14 processes; 10,000 hard links to the "
        "200 real shards, read from the page cache: 100M real samples are about 100 GB of tar, "
        "more than the machine's 64 GB disk): 12.83 s wall, 156 CPU-s (641k samples per "
        "CPU-second), peak RSS 98 MiB main and 49 MiB per worker, the same main RSS as at 2M.",
    ),
    Workload(
        "prepare-keys",
        "Prepare with keys in no order",
        "`prepare_dataset()` of tiny samples (as in Prepare at scale) whose keys are in no order, "
        "as hashed file names are (12 hex digits of a bijection of the sample number, so "
        "unique), with the per-sample tables and 2 worker processes, a fresh process per run. "
        "Key index `kept up` is the baseline, measured in the same run: `index.sqlite`'s UNIQUE "
        "key index kept up as rows come in, what prepare did for every key order before (and "
        "still does when the first chunk's keys ascend); each row is then a random insert into "
        "a B-tree that outgrows sqlite's 64 MiB page cache after a few million keys. `built at "
        "end`: what prepare now does for such keys, one sort after the scan, spilling next to "
        "the index (its memory is the sorter's, bounded by the page cache's size).",
        (
            _step(
                "bench_prepare_scale.py",
                "--root {root}/prepare_keys --samples 1000000,4000000,8000000 --keys hashed "
                "--key-index kept,auto --workers 2 --tables 1",
                "--root {root}/prepare_keys-quick --samples 20000 --keys hashed "
                "--key-index kept,auto --workers 1 --tables 1",
            ),
        ),
        6.0,
    ),
    Workload(
        "balanced-ranks",
        "Balanced planning and the number of ranks",
        "what one rank spends per step composing balanced windows (`compose_steps`: every rank "
        "composes all ranks' samples of a window to find its own share; synthetic log-normal "
        "costs, 16 samples per rank and step, windows of 8 steps; CPU, best of 3 runs) at 8 to "
        "4,096 ranks, against 8 ranks in the same run (per sample shows how far from linear the "
        "composition is). Then the whole planning (pointer simulation, costs, composition) of "
        "the VLM mix per rank and step: planned by every rank (today's default) against a "
        "shared plan store (`Balance(plan_store=DIR)`: each window planned once by one rank; a "
        "rank's share of planning and publishing plus reading its slice), at 8 to 4,096 "
        "simulated ranks in the same run, CPU, best of 5 windows planned and 20 reads; issue 35 "
        "asks for the shared cost per step within 1.5x between 8 and 4,096 ranks, plans "
        "bit-identical (tests/balance/test_plan_identical.py). The state bookkeeping per step "
        "(every stream's snapshot with each item: made, pickled as from a worker, recorded by "
        "the loader) is in its own column. The 8,192-sample set gives each of 4,096 ranks about "
        "2 samples, so a window wraps each stream through ~64 epochs (seeding per epoch is part "
        "of what grows); what still grows at 4,096 is mostly Python's full garbage collections "
        "(a larger live heap: every rank's stream state). Since 2026-11-28 (issue 35, fourth "
        "pass) the composition places samples in rounds instead of a heap operation each and "
        "indexes swaps lazily (same plans). Before it, on a quiet machine (2026-11-27 23:57 UTC, "
        "load 1.1-1.3, commit 2c503cc): composition 1.99 / 2.24 / 3.99 / 7.22 us per sample at "
        "8 / 64 / 512 / 4,096 ranks; shared 0.116 / 0.111 / 0.128 / 0.212 / 0.231 ms per step "
        "at 8 / 64 / 512 / 1,024 / 4,096 ranks (2.00x).",
        (
            _step(
                "bench_compose_ranks.py",
                "--ranks 8,64,512,1024,4096 --repeat 3",
                "--ranks 8,16",
            ),
            _step(
                "bench_shared_plans.py",
                "--root {root} --ranks 8,64,512,1024,4096 --plans 5",
                "--root {root} --ranks 8,16 --reads 2",
            ),
        ),
        6.0,
    ),
    Workload(
        "recovery",
        "Recovery of lost workers",
        "captioning with 2 workers, one worker killed in the middle of the run: the loop's "
        "waits against the same run without a kill (the baseline), in the same rounds.",
        (
            _step(
                "bench_recovery.py",
                "--root {root} --workload captioning --batches 200 --batch-size 32 --rounds 2",
                "--root {root} --workload captioning --batches 10 --batch-size 8 --rounds 1",
            ),
        ),
        0.7,
    ),
    Workload(
        "ray",
        "Ray actors against local workers",
        "the same loader with 2 local worker processes (the baseline) and with 2 Ray actors of "
        "a private one-machine Ray instance, then one run with an actor killed half-way.",
        (
            _step(
                "bench_ray.py",
                "--root {root} --rounds 1 --batches captioning=150,text=1500",
                "--root {root} --rounds 1 --warmup 2 --batches captioning=5,text=20",
            ),
        ),
        1.5,
    ),
)


def by_key(keys: str) -> list[Workload]:
    """The workloads named in ``keys`` (comma-separated), in the page's order."""
    wanted = {key.strip() for key in keys.split(",") if key.strip()}
    unknown = wanted - {workload.key for workload in WORKLOADS}
    if unknown:
        known = ", ".join(workload.key for workload in WORKLOADS)
        raise SystemExit(f"unknown workload(s) {sorted(unknown)}; choose from: {known}")
    return [workload for workload in WORKLOADS if workload.key in wanted]
