"""The A/A bias of the two cores for the vLLM tier's A/B (the interleaved timing itself is
tests/abtiming.py, shared with the llama.cpp tier): how much faster one core serves the same
engine than the other, so that an A/B across two pinned engines is read against it."""

from __future__ import annotations

import os
from pathlib import Path

from specguard.lab import loadgen
from tests.abtiming import ratio, timed


def group_pids(pgid: int) -> list[int]:
    """Every process in process group ``pgid`` (an engine: API server, EngineCore, worker)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid:
                out.append(int(entry.name))
    return out


def pinned_threads(pgid: int) -> dict[int, set[int]]:
    """The threads of an engine's process group that are bound to one CPU (the worker's OpenMP
    threads, bound by VLLM_CPU_OMP_THREADS_BIND), with their affinity. The API server and
    EngineCore float over every CPU and are left alone, as in the pair under test."""
    out = {}
    for pid in group_pids(pgid):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                affinity = os.sched_getaffinity(tid)
            except OSError:
                continue  # a thread that just ended
            if len(affinity) == 1:
                out[tid] = affinity
    return out


def pin(threads: dict[int, set[int]], cpu: int | None) -> None:
    """Move ``threads`` to ``cpu`` (None: back to their own affinity)."""
    for tid, own in threads.items():
        try:
            os.sched_setaffinity(tid, own if cpu is None else {cpu})
        except OSError:
            pass


def aa_bias(url: str, pgid: int, cpus: tuple[int, int], cls: loadgen.RequestClass, pairs: int, seed: int):
    """The same engine (one configuration) timed with its pinned threads on ``cpus[0]`` vs
    ``cpus[1]``, interleaved: TPOT(cpus[0]) / TPOT(cpus[1]). Its threads go back where they were."""
    threads = pinned_threads(pgid)
    assert threads, f"no thread bound to one CPU in process group {pgid}"
    out = []
    try:
        for i in range(pairs):
            order = cpus if i % 2 == 0 else cpus[::-1]
            got = {}
            for cpu in order:
                pin(threads, cpu)
                got[cpu] = timed(url, cls, seed + i)
            out.append((got[cpus[0]], got[cpus[1]]))
    finally:
        pin(threads, None)
    return ratio(out, seed=seed)
