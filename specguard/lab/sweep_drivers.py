"""The two ways ``lab.sweep`` drives a cell: the simulator in virtual time, or HTTP with loadgen.

Both return the same per-request ``sweep.Sample`` list, so the aggregation cannot tell them apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from specguard.errors import ConfigError, SourceError
from specguard.lab.sweep import Driver, MixEntry, PoolSpec, Sample


def virtual_driver(sim, seed: int = 0) -> Driver:
    """Cells on the simulator's engine core in virtual time (``sim``: a sim.config.SimConfig)."""
    from specguard.sim import virtual

    def run(pool: PoolSpec, concurrency: int, mix: Sequence[MixEntry], requests: int) -> list[Sample]:
        classes = [(m.task_type, m.temperature, m.weight) for m in mix]
        result = virtual.simulate_closed(
            sim,
            pool.name,
            classes,
            concurrency,
            requests,
            seed=seed,
            max_tokens=mix[0].max_tokens,  # a geometry sets the same lengths on every class
            prompt_tokens=mix[0].prompt_tokens,
            ignore_eos=mix[0].max_tokens is not None,  # ... and exactly that decode length
        )
        return [
            Sample(
                pool=pool.name,
                concurrency=concurrency,
                task_type=r.task_type,
                temperature=r.temperature,
                output_tokens=r.output_tokens,
                decode_seconds=r.decode_seconds,
                started=r.arrival,
                finished=r.finished,
                rounds=r.rounds if r.num_speculative_tokens else None,
                draft_tokens=r.draft_tokens if r.num_speculative_tokens else None,
                accepted_tokens=r.accepted_tokens if r.num_speculative_tokens else None,
                histogram=tuple(r.histogram) if r.num_speculative_tokens else None,
            )
            for r in result.results
        ]

    return run


def http_driver(
    *,
    seed: int = 0,
    max_tokens: int = 128,
    stream: bool = True,
    timeout_s: float = 300.0,
    prompts: str = "words",
) -> Driver:
    """Cells over HTTP with ``lab.loadgen`` (one asyncio run per cell); ``prompts`` "task" sends
    task-shaped prompts (``lab.prompts``) for a real model."""
    from specguard.exporters.engines import llamacpp, vllm
    from specguard.lab import loadgen

    def run(pool: PoolSpec, concurrency: int, mix: Sequence[MixEntry], requests: int) -> list[Sample]:
        if not pool.url:
            raise ConfigError(f"pool {pool.name}: no url to sweep over HTTP")
        classes = [
            loadgen.RequestClass(
                m.task_type,
                m.weight,
                temperature=m.temperature,
                max_tokens=m.max_tokens or max_tokens,
                prompt_tokens=m.prompt_tokens or 64,
                prompts=prompts,
            )
            for m in mix
        ]
        results = asyncio.run(
            loadgen.run_load(
                pool.url,
                classes,
                concurrency,
                requests=requests,
                stream=stream,
                seed=seed,
                timeout_s=timeout_s,
            )
        )
        failed = [r for r in results if not r.ok]
        if failed and len(failed) == len(results):
            raise SourceError(
                f"pool {pool.name} at {pool.url}: every request failed "
                f"({failed[0].error or failed[0].status})"
            )
        samples = []
        for r in results:
            if not r.ok:
                continue
            spec = None
            if r.spec is not None:
                usage = {"completion_tokens": r.output_tokens}
                adapter, body = vllm, {"metrics": {"speculative_decoding": r.spec}, "usage": usage}
                if "timings" in r.spec:
                    adapter, body = llamacpp, {"timings": r.spec["timings"], "usage": usage}
                try:
                    spec = adapter.request_stats(body)
                except Exception:  # noqa: BLE001 - an engine without these fields: no spec numbers
                    spec = None
            decode = (r.e2e_seconds - r.ttft_seconds) if r.ttft_seconds is not None else None
            samples.append(
                Sample(
                    pool=pool.name,
                    concurrency=concurrency,
                    task_type=r.task_type,
                    temperature=r.temperature if r.temperature is not None else 1.0,
                    output_tokens=r.output_tokens,
                    decode_seconds=decode,
                    started=r.started_at,
                    finished=r.started_at + r.e2e_seconds,
                    rounds=spec.rounds if spec else None,
                    draft_tokens=spec.draft_tokens if spec else None,
                    accepted_tokens=spec.accepted_tokens if spec else None,
                    histogram=spec.accepted_histogram if spec else None,
                )
            )
        return samples

    return run
