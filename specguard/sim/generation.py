"""One HTTP request's sequences inside a pool runtime: submit, stream their steps, cancel.

A request with n > 1 (or a list of prompts) becomes several engine sequences, as in vLLM; each
is a choice. Text is reproducible pseudo-words, one per token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from specguard.sim.engine import Emission, SimRequest, request_rng
from specguard.sim.openai_request import GenerationSpec
from specguard.sim.runtime import PoolRuntime
from specguard.sim.text import WordStream


@dataclass(frozen=True)
class StepChunk:
    choice: int
    emission: Emission
    text: str


class Generation:
    def __init__(self, runtime: PoolRuntime, spec: GenerationSpec):
        self.runtime = runtime
        self.spec = spec
        self.requests: list[SimRequest] = []
        self.texts: list[list[str]] = []
        self._words: list[WordStream] = []
        self._queue: asyncio.Queue[Emission | None] = asyncio.Queue()
        engine = runtime.engine
        for prompt, tokens in zip(spec.prompts, spec.prompt_tokens, strict=True):
            base_key = runtime.request_key(prompt)
            for i in range(spec.n):
                key = base_key if spec.n == 1 else f"{base_key}/{i}"
                request = engine.new_request(
                    task=spec.task,
                    temperature=spec.temperature,
                    prompt_tokens=tokens,
                    max_tokens=spec.max_tokens,
                    key=key,
                    ignore_eos=spec.ignore_eos,
                )
                request.meta.update(
                    stop_strings=spec.stop,
                    n=spec.n,
                    max_tokens_param=spec.max_tokens,
                    choice=len(self.requests),
                    streaming=spec.stream,
                )
                self.requests.append(request)
                self.texts.append([])
                seed = request_rng(engine.seed, runtime.pool.name, key + "\x00text").getrandbits(32)
                self._words.append(WordStream(seed))
        self._index = {id(r): i for i, r in enumerate(self.requests)}

    @property
    def prompt_tokens(self) -> int:
        return sum(self.spec.prompt_tokens)

    @property
    def completion_tokens(self) -> int:
        return sum(r.generated for r in self.requests)

    def start(self) -> None:
        for request in self.requests:
            self.runtime.submit(request, self._queue)

    async def steps(self) -> AsyncIterator[StepChunk]:
        """Each step's tokens per choice, in order, until every sequence finished."""
        remaining = len(self.requests)
        while remaining:
            emission = await self._queue.get()
            if emission is None:
                raise RuntimeError(f"pool {self.runtime.pool.name}: the simulated engine failed")
            choice = self._index[id(emission.request)]
            text = self._words[choice].take(emission.new_tokens)
            self.texts[choice].append(text)
            if emission.finished:
                remaining -= 1
            yield StepChunk(choice, emission, text)

    async def run(self) -> None:
        async for _ in self.steps():
            pass

    def cancel(self) -> None:
        for request in self.requests:
            if request.state != "finished":
                self.runtime.cancel(request)

    def text(self, choice: int) -> str:
        return "".join(self.texts[choice])
