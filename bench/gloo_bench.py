#!/usr/bin/env python3
"""Side-by-side comparison: torch.distributed's Gloo against this project's 07-nccl-perf.

Run it through bench/compare-gloo.sh, which builds our binaries, picks bench/.venv and sets
GLOO_SOCKET_IFNAME=lo and OMP_NUM_THREADS=1. For every operation, world size and buffer size,
both sides run the same measurement, alternately, R times; the median run of each is kept:

  Gloo: N local ranks, float32, sum, root 0, fresh buffers per size, one checked operation,
        5 warm-up operations, a barrier, then 20 timed back-to-back operations on every rank;
        time/op = mean over ranks of (loop time / 20).
  ours: target/release/07-nccl-perf --op OP -b SIZE -e SIZE -w 5 -n 20 --format json.

The operations, every collective Gloo has: all_reduce (dist.all_reduce), broadcast
(dist.broadcast), reduce (dist.reduce), all_gather (dist.all_gather_into_tensor, or
dist.all_gather into a list where this torch's Gloo lacks it), reduce_scatter
(dist.reduce_scatter_tensor; "not in Gloo" where this torch's Gloo lacks it) and alltoall
(dist.all_to_all_single). A size is nccl-tests' size on both sides: the bytes of the larger
buffer (all_gather's output, reduce_scatter's input), rounded as 07-nccl-perf rounds it (a
whole number of floats per rank where the buffer is split among the ranks, at least one).

Bandwidths follow nccl-tests (GB/s = 1e9 B/s): algbw = bytes / time; busbw = algbw x 2(n-1)/n
for all_reduce, x (n-1)/n for all_gather, reduce_scatter and alltoall, x 1 for broadcast and
reduce. Gloo's all_reduce, broadcast and reduce work in one tensor, so they are compared with
our in-place column; its all_gather, reduce_scatter and alltoall take an input and an output
tensor, so they are compared with our out-of-place column. Both of our columns are shown.

The orchestrating process imports only the standard library and numpy (for the memcpy
reference); torch is imported by the Gloo ranks, which are this same file run with --worker.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

MiB = 1024 * 1024
BENCH_DIR = Path(__file__).resolve().parent
ROOT = 0  # broadcast root, on both sides
# Every collective Gloo has, in the order 07-nccl-perf lists them (--ops' default).
OPS = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "alltoall")
# The collectives whose buffer is split among the ranks: count per rank = elements / N.
SPLIT = ("all_gather", "reduce_scatter", "alltoall")
# Gloo's calls for these take one tensor (in place); the others an input and an output.
GLOO_IN_PLACE = ("all_reduce", "broadcast", "reduce")
NOT_IN_GLOO = "not in Gloo"

# The targets: (operation, bytes, what is compared, how many times better ours must be).
TARGETS = [
    ("all_reduce", 100 * MiB, "busbw", 3.0),
    ("all_reduce", 4, "time", 3.0),
    ("broadcast", 100 * MiB, "busbw", 2.0),
]
HELLO_TARGET = 20.0
SCALING_WORLD_SIZES = (2, 3, 4, 8)
SCALING_SIZES = (MiB, 100 * MiB)

# Variables through which a rank learns its place (torchrun, Slurm): our binaries read them
# too, so they are removed before our side runs, lest it take itself for one rank of a job.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT")


class BenchError(Exception):
    """A failure that ends the run with one clear message."""


def log(msg: str) -> None:
    """Progress goes to stderr, so that stdout holds only the report."""
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Sizes and numbers


def parse_size(text: str) -> int:
    """'4', '1K', '64KiB', '100M' -> bytes (binary suffixes, as our binaries take them)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (examples: 4, 1K, 64K, 100M)")
    size = int(m.group(1)) * 1024 ** " KMG".index(m.group(2).upper() or " ")
    if size <= 0 or size % 4:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be a positive multiple of 4 (float32)")
    return size


def size_list(text: str) -> list[int]:
    return sorted({parse_size(s) for s in text.split(",") if s.strip()})


def int_list(text: str) -> list[int]:
    try:
        values = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        values = []
    if not values or min(values) < 2:  # one rank has no bus: its busbw is 0 by the formula
        raise argparse.ArgumentTypeError(f"{text!r}: expected world sizes of 2 or more, such as 2,4")
    return values


def fmt_size(size: int) -> str:
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", MiB), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw factor: what each rank's link carries, relative to the buffer."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    return (n - 1) / n if op in SPLIT else 1.0


def op_size(op: str, n: int, size: int) -> int:
    """The size both sides measure for a requested one: nccl-tests' size (the larger buffer),
    rounded as 07-nccl-perf rounds it: a whole number of floats per rank where the buffer is
    split among the ranks, at least one (4 bytes of all_gather on 4 ranks measure 16)."""
    per = n if op in SPLIT else 1
    return max(1, size // 4 // per) * per * 4


def placement(op: str) -> str:
    """Which of our columns Gloo's call is compared with."""
    return "in_place" if op in GLOO_IN_PLACE else "out_of_place"


def bandwidths(op: str, n: int, size: int, time_s: float) -> tuple[float, float]:
    algbw = size / 1e9 / time_s
    return algbw, algbw * bus_factor(op, n)


def median_run(runs: list[dict], key: str) -> dict:
    """The run whose `key` is the median (the lower middle one for an even count): a real run,
    not an average of runs, as nccl-tests-style reports keep it."""
    return sorted(runs, key=lambda r: r[key])[(len(runs) - 1) // 2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(extra or {})
    return env


def tail(text: str, lines: int = 15) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# Gloo: one rank (run as `gloo_bench.py --worker`), and the launch of N of them


def gloo_api(op: str, dist) -> tuple[str | None, str | None]:
    """The torch.distributed call that runs `op` on this torch's Gloo: (name, None), or
    (None, why) where Gloo has none. Every rank probes the same calls in the same order on
    a tiny tensor, so a probe that Gloo refuses (it refuses before any data moves) fails on
    every rank alike and nothing is left half done."""
    import torch

    world = dist.get_world_size()

    def works(call) -> str | None:
        try:
            call()
            return None
        except (RuntimeError, NotImplementedError, AttributeError, ValueError) as e:
            return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"

    if op == "all_gather":
        why = works(lambda: dist.all_gather_into_tensor(torch.zeros(world), torch.zeros(1)))
        return ("dist.all_gather_into_tensor", None) if why is None else ("dist.all_gather", None)
    if op == "reduce_scatter":
        why = works(lambda: dist.reduce_scatter_tensor(torch.zeros(1), torch.zeros(world)))
        return ("dist.reduce_scatter_tensor", None) if why is None else (None, why)
    if op == "alltoall":
        why = works(lambda: dist.all_to_all_single(torch.zeros(world), torch.zeros(world)))
        return ("dist.all_to_all_single", None) if why is None else (None, why)
    return f"dist.{op}", None


def gloo_case(op: str, api: str, dist, elements: int):
    """Fresh buffers for one size of `op`: (run one operation, the result to check or None,
    what it must hold, after the check: make the timed operations start from zeros).
    Values show that every rank and every block took part, and are exact in float32."""
    import torch

    rank, world = dist.get_rank(), dist.get_world_size()
    f32 = torch.float32
    count = elements // world if op in SPLIT else elements  # per-rank block, or the whole
    if op in SPLIT:  # element i -> the index j of its block (rank j's, or for rank j)
        blocks = torch.arange(world, dtype=f32).repeat_interleave(count)
    tri = world * (world + 1) / 2
    if op == "all_reduce":
        buf = torch.full((elements,), float(rank + 1), dtype=f32)
        return (lambda: dist.all_reduce(buf)), buf, torch.full_like(buf, tri), buf.zero_
    if op == "broadcast":
        pattern = torch.arange(elements, dtype=f32) % 97 + 1
        buf = pattern.clone() if rank == ROOT else torch.zeros(elements, dtype=f32)
        return (lambda: dist.broadcast(buf, src=ROOT)), buf, pattern, None
    if op == "reduce":
        buf = torch.full((elements,), float(rank + 1), dtype=f32)
        result = buf if rank == ROOT else None  # only the root has a result
        return (lambda: dist.reduce(buf, dst=ROOT)), result, torch.full_like(buf, tri), buf.zero_
    if op == "all_gather":
        inp = torch.full((count,), float(rank + 1), dtype=f32)
        out = torch.zeros(elements, dtype=f32)
        if api == "dist.all_gather_into_tensor":
            run = lambda: dist.all_gather_into_tensor(out, inp)
        else:  # the list form, into views of the one output buffer
            parts = list(out.chunk(world))
            run = lambda: dist.all_gather(parts, inp)
        return run, out, blocks + 1, None  # block j came from rank j
    if op == "reduce_scatter":
        inp = (blocks + 1) * (rank + 1)  # block j: (rank + 1)(j + 1)
        out = torch.zeros(count, dtype=f32)
        run = lambda: dist.reduce_scatter_tensor(out, inp)
        return run, out, torch.full_like(out, (rank + 1) * tri), None
    if op == "alltoall":
        inp = blocks + 1 + rank * world  # block j goes to rank j
        out = torch.zeros(elements, dtype=f32)
        run = lambda: dist.all_to_all_single(out, inp)
        return run, out, blocks * world + rank + 1, None  # block i came from rank i
    raise ValueError(op)


def worker(op: str, sizes: list[int], warmup: int, iters: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    api, unsupported = gloo_api(op, dist)
    results = []
    for size in sizes if api else []:
        run, result, expected, reset = gloo_case(op, api, dist, size // 4)
        run()
        wrong = 0 if result is None else int((result != expected).sum())
        if reset:
            # In place, a reduction would fold its result in again at every operation:
            # the timed ones start from zeros, which stay zeros (no growth to inf).
            reset()
        for _ in range(warmup):
            run()
        dist.barrier()  # everyone starts the timed loop together
        start = time.perf_counter()
        for _ in range(iters):
            run()
        loop_s = time.perf_counter() - start
        results.append({"size": size, "loop_s": loop_s, "wrong": wrong})
        del run, result, expected, reset
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "api": api, "unsupported": unsupported,
                      "results": results}), flush=True)


def run_gloo(op: str, n: int, sizes: list[int], args) -> tuple[dict[int, dict], str]:
    """Start n Gloo ranks on this host; return, per size, time/op and the wrong count (or,
    where this torch's Gloo has no such call, why), and the call that ran."""
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--op", op,
           "--sizes", ",".join(map(str, sizes)), "-w", str(args.warmup), "-n", str(args.iters)]
    procs = []
    try:
        for rank in range(n):
            env = clean_env({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
                             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
            # Files, not pipes: a rank that writes much to a pipe nobody reads yet would block.
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True,
                                    start_new_session=True)
            procs.append((proc, out, err))
        deadline = time.monotonic() + args.timeout
        for rank, (proc, _, err) in enumerate(procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise BenchError(f"Gloo {op} with {n} ranks: rank {rank} still running after "
                                 f"{args.timeout:.0f} s (--timeout)") from None
            if proc.returncode != 0:
                err.seek(0)
                raise BenchError(f"Gloo {op} with {n} ranks: rank {rank} exited with "
                                 f"{proc.returncode}:\n{tail(err.read())}")
        per_rank = []
        for proc, out, _ in procs:
            out.seek(0)
            per_rank.append(json.loads(out.read().strip().splitlines()[-1]))
    finally:
        for proc, out, err in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.close()
            err.close()
    api, unsupported = per_rank[0]["api"], per_rank[0]["unsupported"]
    if not api:
        return {size: {"unsupported": unsupported} for size in sizes}, f"{NOT_IN_GLOO} ({unsupported})"
    results = {}
    for i, size in enumerate(sizes):
        loops = [r["results"][i]["loop_s"] for r in per_rank]
        results[size] = {"time_s": statistics.fmean(loops) / args.iters,
                         "wrong": sum(r["results"][i]["wrong"] for r in per_rank)}
    return results, api


# ---------------------------------------------------------------------------------------------
# Ours: 07-nccl-perf and its JSON


def field(doc, *path):
    """doc[path...], or a BenchError naming the missing field (the JSON format is young)."""
    value, name = doc, ""
    for key in path:
        name += f"[{key}]" if isinstance(key, int) else (f".{key}" if name else key)
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            raise BenchError(f"07-nccl-perf JSON: missing field '{name}'") from None
    return value


def number(doc, *path) -> float:
    value = field(doc, *path)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        name = ".".join(str(p) for p in path)
        raise BenchError(f"07-nccl-perf JSON: field '{name}' is {value!r}, not a number")
    return float(value)


def parse_perf_json(text: str, op: str, n: int, size: int) -> dict:
    """Our benchmark's one JSON document -> the numbers of the row for `size`."""
    start = text.find("{")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:]) if start >= 0 else (None, 0)
    except json.JSONDecodeError as e:
        raise BenchError(f"07-nccl-perf printed no valid JSON ({e}); its output began with:\n"
                         f"{tail(text[:800], 10)}") from None
    if not isinstance(doc, dict):
        raise BenchError("07-nccl-perf printed no JSON document on stdout; it printed:\n"
                         f"{tail(text[:800], 10) or '    (nothing)'}")
    got_op = str(field(doc, "op")).replace("-", "_")
    if got_op != op:
        raise BenchError(f"07-nccl-perf JSON: op is {got_op!r}, expected {op!r}")
    if int(number(doc, "world_size")) != n:
        raise BenchError(f"07-nccl-perf JSON: world_size is {doc['world_size']}, expected {n}")
    rows = field(doc, "rows")
    if not isinstance(rows, list) or not rows:
        raise BenchError("07-nccl-perf JSON: field 'rows' is empty or not a list")
    matches = [i for i, row in enumerate(rows) if isinstance(row, dict) and row.get("size") == size]
    if not matches:
        raise BenchError(f"07-nccl-perf JSON: no row with size {size} "
                         f"(sizes: {[r.get('size') for r in rows if isinstance(r, dict)]})")
    i = matches[0]
    result = {"memcpy_gbps": number(doc, "memcpy_gbps"), "root": field(doc, "rows", i, "root")}
    for place in ("in_place", "out_of_place"):
        time_s = number(doc, "rows", i, place, "time_us") / 1e6
        if time_s <= 0:
            raise BenchError(f"07-nccl-perf JSON: rows[{i}].{place}.time_us is not positive")
        result[place] = {"time_s": time_s, "wrong": int(number(doc, "rows", i, place, "wrong")),
                         "busbw_reported": number(doc, "rows", i, place, "busbw")}
    number(doc, "wrong")  # present, as documented; the per-row counts are what we keep
    return result


def run_ours(op: str, n: int, size: int, args) -> dict:
    cmd = [str(args.perf_bin), "--backend", "cpu", "--nproc-per-node", str(n),
           "--op", op.replace("_", "-"), "-b", str(size), "-e", str(size),
           "-w", str(args.warmup), "-n", str(args.iters), "--format", "json"]
    try:
        p = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True,
                           timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{shlex.join(cmd)}: still running after {args.timeout:.0f} s") from None
    if p.returncode != 0:
        raise BenchError(f"{shlex.join(cmd)} exited with {p.returncode}:\n{tail(p.stderr)}")
    try:
        return parse_perf_json(p.stdout, op, n, size)
    except BenchError as e:
        raise BenchError(f"{e}\n  command: {shlex.join(cmd)}") from None


def check_reported_busbw(op: str, n: int, size: int, ours: dict) -> None:
    """Both sides' busbw are computed here from time and size, by one formula; say so when our
    binary's own figure disagrees (a different formula or unit would make the ratio unfair)."""
    for place in ("in_place", "out_of_place"):
        _, busbw = bandwidths(op, n, size, ours[place]["time_s"])
        reported = ours[place]["busbw_reported"]
        if reported > 0.01 and abs(reported - busbw) > 0.02 * busbw:
            log(f"warning: 07-nccl-perf reports {place} busbw {reported:.3f} GB/s for {op} "
                f"{fmt_size(size)} N={n}, its time_us gives {busbw:.3f}; the tables use the latter")


# ---------------------------------------------------------------------------------------------
# Whole commands: hello world, and the memcpy reference


def time_command(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[float, str]:
    start = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{shlex.join(cmd)}: still running after {timeout:.0f} s") from None
    elapsed = time.perf_counter() - start
    if p.returncode != 0:
        raise BenchError(f"{shlex.join(cmd)} exited with {p.returncode}:\n{tail(p.stderr)}")
    return elapsed, p.stdout


def hello_commands(args) -> tuple[list[str], list[str]]:
    ours = [str(args.hello_bin), "--nproc-per-node", "4", "--backend", "cpu"]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    gloo = [torchrun, "--nproc-per-node", "4", "--rdzv-backend", "static",
            "--master-addr", "127.0.0.1", "--master-port", "PORT", str(BENCH_DIR / "hello.py")]
    return ours, gloo


def time_hello(args, first: str) -> dict[str, float]:
    """One timed run of each hello world, from the command to its exit."""
    ours_cmd, gloo_cmd = hello_commands(args)
    times = {}
    for side in (("ours", "gloo") if first == "ours" else ("gloo", "ours")):
        if side == "ours":
            if not args.gloo_only:
                times["ours"], _ = time_command(ours_cmd, clean_env(), args.timeout)
        else:
            cmd = [str(free_port()) if a == "PORT" else a for a in gloo_cmd]
            times["gloo"], out = time_command(cmd, clean_env(), args.timeout)
            if out.count("Hello from rank") != 4:
                raise BenchError(f"torchrun hello world printed {out.count('Hello from rank')} "
                                 f"hello lines, not 4:\n{tail(out)}")
    return times


def numpy_memcpy_gbps(size: int = 100 * MiB, reps: int = 20) -> float:
    """One core copying 100 MiB (numpy's copy is single-threaded): the payload GB/s of the
    median repetition, the same quantity as baseline.md's memcpy_1t."""
    import numpy as np

    src = np.ones(size // 4, dtype=np.float32)
    dst = np.zeros_like(src)  # written, so its pages exist before the timing
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return size / 1e9 / statistics.median(times)


# ---------------------------------------------------------------------------------------------
# The plan, the measurements, the report


def plan(args) -> dict[tuple[str, int], list[int]]:
    """(operation, world size) -> the sizes to measure (rounded by op_size): the main sweep,
    plus --scaling's; in the order of OPS, then of world sizes."""
    configs: dict[tuple[str, int], set[int]] = {}
    for op in args.ops:
        for n in args.nproc:
            configs.setdefault((op, n), set()).update(op_size(op, n, s) for s in args.sizes)
        if args.scaling:
            for n in SCALING_WORLD_SIZES:
                configs.setdefault((op, n), set()).update(op_size(op, n, s) for s in SCALING_SIZES)
    return {key: sorted(configs[key]) for key in sorted(configs, key=lambda k: (OPS.index(k[0]), k[1]))}


def measure(args) -> dict:
    configs = plan(args)
    gloo_runs = {key: {s: [] for s in sizes} for key, sizes in configs.items()}
    ours_runs = {key: {s: [] for s in sizes} for key, sizes in configs.items()}
    hello_runs = {"ours": [], "gloo": []}
    memcpy_runs = []
    gloo_api: dict[str, str] = {}  # operation -> the call that ran it, or NOT_IN_GLOO (why)
    # Runs outermost, and the two sides in alternating order, so that whatever drifts on the
    # machine (another job, the CPU clock) falls on both sides alike.
    for run in range(args.runs):
        memcpy_runs.append(numpy_memcpy_gbps())
        log(f"run {run + 1}/{args.runs}: numpy memcpy 100 MiB {memcpy_runs[-1]:.2f} GB/s")
        for i, ((op, n), sizes) in enumerate(configs.items()):
            order = ("ours", "gloo") if (run + i) % 2 == 0 else ("gloo", "ours")
            for side in order:
                if side == "gloo":
                    if gloo_api.get(op, "").startswith(NOT_IN_GLOO):
                        # Found out once: no need to start the ranks again.
                        why = gloo_api[op][len(NOT_IN_GLOO) + 2:-1]
                        for size in sizes:
                            gloo_runs[(op, n)][size].append({"unsupported": why})
                        continue
                    log(f"run {run + 1}/{args.runs}: Gloo {op} N={n} sizes {fmt_size(sizes[0])}"
                        f"..{fmt_size(sizes[-1])}")
                    results, gloo_api[op] = run_gloo(op, n, sizes, args)
                    if gloo_api[op].startswith(NOT_IN_GLOO):
                        log(f"run {run + 1}/{args.runs}: Gloo {op}: {gloo_api[op]}")
                    for size, r in results.items():
                        gloo_runs[(op, n)][size].append(r)
                elif not args.gloo_only:
                    log(f"run {run + 1}/{args.runs}: ours {op} N={n} sizes {fmt_size(sizes[0])}"
                        f"..{fmt_size(sizes[-1])}")
                    for size in sizes:
                        r = run_ours(op, n, size, args)
                        check_reported_busbw(op, n, size, r)
                        ours_runs[(op, n)][size].append(r)
    for i in range(args.hello_runs):
        log(f"hello world 4 ranks: run {i + 1}/{args.hello_runs}")
        for side, t in time_hello(args, "ours" if i % 2 == 0 else "gloo").items():
            hello_runs[side].append(t)
    return {"configs": configs, "gloo": gloo_runs, "ours": ours_runs, "hello": hello_runs,
            "memcpy": memcpy_runs, "gloo_api": gloo_api}


def summarize(args, m: dict) -> dict:
    """Median runs -> one record per (operation, world size, size). Each column (Gloo, our
    in place, our out of place) keeps its own median run."""
    cells = {}
    for (op, n), sizes in m["configs"].items():
        for size in sizes:
            gruns = m["gloo"][(op, n)][size]
            if "unsupported" in gruns[0]:
                gloo = {"time_us": None, "busbw": None, "wrong": 0,
                        "unsupported": gruns[0]["unsupported"]}
            else:
                g = median_run(gruns, "time_s")
                gloo = {"time_us": g["time_s"] * 1e6,
                        "busbw": bandwidths(op, n, size, g["time_s"])[1],
                        "wrong": sum(r["wrong"] for r in gruns)}
            cell = {"op": op, "world_size": n, "size": size, "runs": args.runs,
                    "gloo": gloo, "ours": None}
            runs = m["ours"][(op, n)][size]
            if runs:
                cell["ours"] = {"memcpy_gbps": statistics.median(r["memcpy_gbps"] for r in runs),
                                "root": runs[0]["root"]}
                for place in ("in_place", "out_of_place"):
                    per_place = [r[place] for r in runs]
                    t = median_run(per_place, "time_s")["time_s"]
                    cell["ours"][place] = {"time_us": t * 1e6,
                                           "busbw": bandwidths(op, n, size, t)[1],
                                           "wrong": sum(r["wrong"] for r in per_place)}
            cells[(op, n, size)] = cell
    return cells


def save_results(directory: Path, cells: dict) -> list[Path]:
    """--save-results: each side's run of each collective and world size as a 07-nccl-perf
    result (the form of its --format json), for 07-nccl-perf --plot-with. Both files hold
    the column the comparison uses (in place for all_reduce, broadcast and reduce)."""
    directory.mkdir(parents=True, exist_ok=True)
    groups: dict = {}
    for (op, n, size), cell in sorted(cells.items(), key=lambda kv: (OPS.index(kv[0][0]), kv[0][1], kv[0][2])):
        groups.setdefault((op, n), []).append((size, cell))
    written = []
    for (op, n), sized in groups.items():
        place = placement(op)
        for side, backend, transport in (("gloo", "gloo", "tcp"), ("ours", "cpu", "shm")):
            doc = {"example": "bench/gloo_bench.py", "backend": backend, "transport": transport,
                   "host": socket.gethostname(), "world_size": n, "op": op, "type": "float",
                   "redop": "none" if op in ("broadcast", "all_gather", "alltoall") else "sum",
                   "rows": []}
            for size, cell in sized:
                m = cell["gloo"] if side == "gloo" else (cell["ours"] or {}).get(place)
                if not m or m.get("time_us") is None:
                    continue
                doc["rows"].append({"size": size, place: {"time_us": m["time_us"], "busbw": m["busbw"]}})
                if side == "ours":
                    doc["memcpy_gbps"] = cell["ours"]["memcpy_gbps"]
            if doc["rows"]:
                path = directory / f"{side}-{op}-{n}ranks.json"
                path.write_text(json.dumps(doc, indent=1) + "\n")
                written.append(path)
    return written


def ratio_status(ratio: float | None, target: float | None, wrong: bool) -> str:
    if wrong:
        return "WRONG"
    if ratio is None:
        return "n/a"
    if target is None:
        return "info"
    return "PASS" if ratio >= target else "MISS"


def row(metric, unit, ours, gloo, ratio, target, status) -> dict:
    return {"metric": metric, "unit": unit, "ours": ours, "gloo": gloo, "ratio": ratio,
            "target": target, "status": status}


def target_tables(args, cells: dict, m: dict, python_memcpy: float) -> list[dict]:
    tables = []
    for op, size, what, goal in TARGETS:
        rows = []
        target = f">= {goal:g}x"
        for n in args.nproc:
            cell = cells.get((op, n, size))
            label = f"{op} {fmt_size(size)}, N={n}"
            if cell is None:
                rows.append(row(label, None, None, None, None, target, "not measured"))
                continue
            g, o = cell["gloo"], cell["ours"]
            wrong = g["wrong"] > 0 or (o is not None and (o["in_place"]["wrong"] > 0 or
                                                          o["out_of_place"]["wrong"] > 0))
            info = ratio_status(1, None, wrong)
            if what == "busbw":
                ours_v = o["in_place"]["busbw"] if o else None
                ratio = ours_v / g["busbw"] if o else None
                rows.append(row(f"{label}: busbw GB/s (ours in place)", "GB/s", ours_v,
                                g["busbw"], ratio, target, ratio_status(ratio, goal, wrong)))
                if o:
                    oop = o["out_of_place"]["busbw"]
                    rows.append(row(f"{label}: busbw GB/s (ours out of place)", "GB/s", oop,
                                    g["busbw"], oop / g["busbw"], "-", info))
                if o and op == "all_reduce":
                    # How close each side comes to what one core can copy: the ceiling for
                    # ranks that share the memory of one host.
                    for name, ref in (("our binary's", o["memcpy_gbps"]),
                                      ("numpy's", python_memcpy)):
                        if ref <= 0:
                            continue
                        rows.append(row(f"{label}: busbw / memcpy 1 thread ({name}, "
                                        f"{ref:.2f} GB/s)", "fraction", ours_v / ref,
                                        g["busbw"] / ref, None, "-", info))
            else:
                ours_v = o["in_place"]["time_us"] if o else None
                ratio = g["time_us"] / ours_v if o else None
                rows.append(row(f"{label}: time us (ours in place)", "us", ours_v, g["time_us"],
                                ratio, f"{target} (ours <= 1/{goal:g} of Gloo's)",
                                ratio_status(ratio, goal, wrong)))
                if o:
                    oop = o["out_of_place"]["time_us"]
                    rows.append(row(f"{label}: time us (ours out of place)", "us", oop,
                                    g["time_us"], g["time_us"] / oop, "-", info))
        title = (f"{op}, {fmt_size(size)}: our busbw at least {goal:g}x Gloo's" if what == "busbw"
                 else f"{op}, {fmt_size(size)}: our time at most 1/{goal:g} of Gloo's")
        tables.append({"title": title, "rows": rows})
    if args.hello_runs:
        h = m["hello"]
        ours_v = statistics.median(h["ours"]) if h["ours"] else None
        gloo_v = statistics.median(h["gloo"])
        ratio = gloo_v / ours_v if ours_v else None
        ours_cmd, gloo_cmd = hello_commands(args)
        tables.append({
            "title": f"hello world, 4 ranks, from the command to its exit: ours at least "
                     f"{HELLO_TARGET:g}x faster",
            "rows": [row(f"wall time s, median of {args.hello_runs}", "s", ours_v, gloo_v, ratio,
                         f">= {HELLO_TARGET:g}x", ratio_status(ratio, HELLO_TARGET, False))],
            "commands": {"ours": shown(ours_cmd, args), "gloo": shown(gloo_cmd, args)},
            "runs_s": h})
    return tables


def shown(cmd: list[str], args) -> str:
    """A command as the report shows it: paths inside the repository relative to it."""
    repo = str(args.repo.resolve()) + os.sep
    return shlex.join(a[len(repo):] if a.startswith(repo) else a for a in cmd)


def detail_rows(cells: dict, keys) -> list[dict]:
    """One row per cell; `ratio` (Gloo's time / ours) takes our column of Gloo's placement."""
    out = []
    for key in keys:
        c = cells[key]
        o, g = c["ours"], c["gloo"]
        place = placement(c["op"])
        out.append({"op": c["op"], "world_size": c["world_size"], "size": c["size"],
                    "ours_in_place_us": o and o["in_place"]["time_us"],
                    "ours_out_of_place_us": o and o["out_of_place"]["time_us"],
                    "gloo_us": g["time_us"],
                    "gloo_placement": place,
                    "gloo_unsupported": g.get("unsupported"),
                    "ours_in_place_busbw": o and o["in_place"]["busbw"],
                    "ours_out_of_place_busbw": o and o["out_of_place"]["busbw"],
                    "gloo_busbw": g["busbw"],
                    "ratio": (g["time_us"] / o[place]["time_us"]
                              if o and g["time_us"] is not None else None),
                    "wrong_ours": o and o["in_place"]["wrong"] + o["out_of_place"]["wrong"],
                    "wrong_gloo": g["wrong"]})
    return out


# ---------------------------------------------------------------------------------------------
# Markdown


UNIT_DIGITS = {"us": 1, "s": 3, "GB/s": 3, "fraction": 3}


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.{digits}f}"


def markdown_table(headers: list[str], rows: list[list[str]], align: str) -> str:
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def gloo_call(op: str, api: str) -> str:
    """The call as the report names it: with its placement, or why there is none."""
    if api.startswith(NOT_IN_GLOO):
        return api
    return f"{api} ({placement(op).replace('_', ' ')})"


def gloo_cell(d: dict, value, digits: int) -> str:
    return NOT_IN_GLOO if d["gloo_unsupported"] else fmt(value, digits)


def render(report: dict) -> str:
    h = report["header"]
    out = [f"# compare-gloo: {h['date']}, nproc {h['nproc']}, {h['cpu']}, torch {h['torch']}",
           "",
           f"Command: `{h['command']}`  ",
           f"Python {h['python']}, numpy {h['numpy']}; {h['env']}; load average at start "
           f"{h['loadavg']}; repository at {h['git']}.  ",
           f"Each figure is the median of {h['runs']} runs, ours and Gloo's alternating; a run is "
           f"{h['warmup']} warm-up and {h['iters']} timed operations. GB/s = 1e9 B/s. Ratio: how "
           "many times better ours is (busbw: ours / Gloo; time: Gloo / ours).",
           ""]
    for table in report["targets"]:
        out += [f"## {table['title']}", ""]
        rows = [[r["metric"], fmt(r["ours"], UNIT_DIGITS.get(r["unit"], 3)),
                 fmt(r["gloo"], UNIT_DIGITS.get(r["unit"], 3)),
                 "-" if r["ratio"] is None else f"{r['ratio']:.2f}x", r["target"], r["status"]]
                for r in table["rows"]]
        out += [markdown_table(["metric", "ours", "Gloo", "ratio", "target", "status"], rows,
                               "lrrrll"), ""]
        if "commands" in table:
            out += [f"ours: `{table['commands']['ours']}`  ",
                    f"Gloo: `{table['commands']['gloo']}`", ""]
    out += ["## Every size (time per operation, busbw)", ""]
    if report.get("gloo_calls"):
        out += ["Gloo's calls: " + "; ".join(f"{op}: {call}"
                                             for op, call in report["gloo_calls"].items())
                + ". Ratio: Gloo's time / ours, ours in Gloo's placement (column 'vs ours').",
                ""]
    headers = ["op", "N", "size", "ours in place us", "ours out of place us", "Gloo us",
               "ours busbw GB/s (in place)", "ours busbw GB/s (out of place)", "Gloo busbw GB/s",
               "ratio", "vs ours", "correct"]
    rows = [[d["op"], str(d["world_size"]), fmt_size(d["size"]), fmt(d["ours_in_place_us"], 1),
             fmt(d["ours_out_of_place_us"], 1), gloo_cell(d, d["gloo_us"], 1),
             fmt(d["ours_in_place_busbw"], 4), fmt(d["ours_out_of_place_busbw"], 4),
             gloo_cell(d, d["gloo_busbw"], 4),
             "-" if d["ratio"] is None else f"{d['ratio']:.2f}x",
             "-" if d["gloo_unsupported"] else d["gloo_placement"].replace("_", " "),
             "OK" if not d["wrong_gloo"] and not d["wrong_ours"] else
             f"WRONG (ours {d['wrong_ours'] or 0}, Gloo {d['wrong_gloo']})"]
            for d in report["details"]]
    out += [markdown_table(headers, rows, "lrrrrrrrrrll"), ""]
    if report["scaling"]:
        out += ["## Scaling: busbw GB/s by world size (no target; 8 ranks oversubscribe the "
                f"{h['nproc']} cores)", ""]
        rows = [[d["op"], fmt_size(d["size"]), str(d["world_size"]),
                 fmt(d[f"ours_{d['gloo_placement']}_busbw"], 4), gloo_cell(d, d["gloo_busbw"], 4),
                 "-" if d["ratio"] is None else f"{d['ratio']:.2f}x",
                 d["gloo_placement"].replace("_", " ")]
                for d in report["scaling"]]
        out += [markdown_table(["op", "size", "N", "ours (Gloo's placement)", "Gloo", "ratio",
                                "placement"], rows, "lrrrrrl"), ""]
    statuses = [r["status"] for t in report["targets"] for r in t["rows"] if r["target"] != "-"]
    counts = {s: statuses.count(s) for s in dict.fromkeys(statuses)}
    out += ["Targets: " + ", ".join(f"{n} {s}" for s, n in counts.items())]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------


def header(args) -> dict:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"

    git = subprocess.run(["git", "-C", str(args.repo), "describe", "--always", "--dirty"],
                         capture_output=True, text=True)
    env_names = ("GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "NCCL_WORKBOOK_TRANSPORT")
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": len(os.sched_getaffinity(0)),  # the CPUs we may use, as `nproc` prints
        "cpu": cpu, "torch": version("torch"),
        "numpy": version("numpy"), "python": sys.version.split()[0],
        "command": os.environ.get("BENCH_COMMAND") or shlex.join(["python3", *sys.argv]),
        "env": ", ".join(f"{k}={os.environ[k]}" for k in env_names if k in os.environ),
        "loadavg": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        "git": git.stdout.strip() or "unknown", "runs": args.runs, "warmup": args.warmup,
        "iters": args.iters, "gloo_only": args.gloo_only,
    }


def main() -> int:
    p = argparse.ArgumentParser(
        prog="bench/compare-gloo.sh",
        description="Compare torch.distributed Gloo with this project's 07-nccl-perf, side by "
                    "side, and print the ratios against the targets.",
        epilog="compare-gloo.sh itself also takes --setup (create bench/.venv with torch and "
               "numpy, then stop) and --no-build (skip cargo build).")
    p.add_argument("--sizes", type=size_list, default=size_list("4,1K,64K,1M,16M,100M"),
                   help="buffer sizes in bytes, K/M/G binary (default 4,1K,64K,1M,16M,100M)")
    p.add_argument("--nproc", type=int_list, default=[2, 4],
                   help="world sizes, ranks on this host (default 2,4)")
    p.add_argument("--ops", default=",".join(OPS),
                   type=lambda s: [o.strip().replace("-", "_") for o in s.split(",") if o.strip()],
                   help=f"operations (default every collective Gloo has: {','.join(OPS)})")
    p.add_argument("--runs", type=int, default=3,
                   help="runs of every configuration; the median run is kept (default 3)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="warm-up operations (default 5)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed operations (default 20)")
    p.add_argument("--hello-runs", type=int, default=5,
                   help="timed runs of each hello world; 0 skips it (default 5)")
    p.add_argument("--scaling", action="store_true",
                   help="also N = 2, 3, 4, 8 at 1 MiB and 100 MiB (slow)")
    p.add_argument("--gloo-only", action="store_true", help="measure Gloo alone (no build needed)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON")
    p.add_argument("--save-results", type=Path, metavar="DIR",
                   help="also write each side's runs as 07-nccl-perf results, one file per "
                        "collective and world size (DIR/gloo-all_reduce-2ranks.json, "
                        "DIR/ours-all_reduce-2ranks.json), for 07-nccl-perf --plot-with")
    p.add_argument("--timeout", type=float, default=600, help="seconds any one launch may take")
    p.add_argument("--repo", type=Path, default=BENCH_DIR.parent, help=argparse.SUPPRESS)
    p.add_argument("--perf-bin", type=Path, help="our benchmark (default target/release/07-nccl-perf)")
    p.add_argument("--hello-bin", type=Path,
                   help="our hello world (default target/release/00-nccl-hello-world)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--op", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.worker:
        worker(args.op, args.sizes, args.warmup, args.iters)
        return 0

    for op in args.ops:
        if op not in OPS:
            p.error(f"--ops: {op!r} is not one of {', '.join(OPS)}")
    if args.runs < 1 or args.iters < 1 or args.warmup < 0 or args.hello_runs < 0:
        p.error("--runs and --iters must be at least 1, --warmup and --hello-runs at least 0")
    args.perf_bin = args.perf_bin or args.repo / "target/release/07-nccl-perf"
    args.hello_bin = args.hello_bin or args.repo / "target/release/00-nccl-hello-world"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not args.gloo_only:
        for binary in (args.perf_bin, args.hello_bin):
            if not os.access(binary, os.X_OK):
                p.error(f"{binary} is missing: build it (compare-gloo.sh does), or use --gloo-only")

    try:
        head = header(args)
        m = measure(args)
        cells = summarize(args, m)
        python_memcpy = statistics.median(m["memcpy"])
        main_keys = [k for k in cells if k[1] in args.nproc
                     and k[2] in {op_size(k[0], k[1], s) for s in args.sizes}]
        scaling_keys = sorted((k for k in cells if args.scaling and
                               k[2] in {op_size(k[0], k[1], s) for s in SCALING_SIZES}),
                              key=lambda k: (OPS.index(k[0]), k[2], k[1]))
        report = {
            "header": head,
            "memcpy_gbps": {"numpy_1_thread": python_memcpy, "numpy_runs": m["memcpy"],
                            "ours_1_thread": statistics.median(
                                c["ours"]["memcpy_gbps"] for c in cells.values() if c["ours"])
                            if not args.gloo_only else None},
            "gloo_calls": {op: gloo_call(op, m["gloo_api"][op])
                           for op in args.ops if op in m["gloo_api"]},
            "targets": target_tables(args, cells, m, python_memcpy),
            "details": detail_rows(cells, main_keys),
            "scaling": detail_rows(cells, scaling_keys) if args.scaling else [],
        }
    except BenchError as e:
        log(f"compare-gloo: {e}")
        return 1
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        log(f"compare-gloo: JSON written to {args.json}")
    if args.save_results:
        written = save_results(args.save_results, cells)
        log(f"compare-gloo: {len(written)} results written to {args.save_results}/ "
            "(draw them: 07-nccl-perf --plot FILE.png --plot-with ... --no-run)")
    wrong = any(r["status"] == "WRONG" for t in report["targets"] for r in t["rows"]) or any(
        d["wrong_gloo"] or d["wrong_ours"] for d in report["details"] + report["scaling"])
    if wrong:
        log("compare-gloo: some results were WRONG: their timings mean nothing")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
