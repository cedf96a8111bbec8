"""The traffic both real-engine tiers send: four task classes, two of them greedy copy tasks (which
a drafter predicts) and two sampled ones, and the scrape that brings every pool up to date."""

from __future__ import annotations

from specguard.lab import loadgen

CLASSES = {
    ("extraction", "greedy"): "copy",
    ("code", "greedy"): "copy",
    ("chat", "medium"): "sampled",
    ("creative", "high"): "sampled",
}


def task_mix(
    max_tokens: int, copy_prompt_tokens: int, chat_prompt_tokens: int, stream: bool | None = None
) -> list[loadgen.RequestClass]:
    """One request class per entry of CLASSES, in its order, with prompts from the task set."""

    def cls(task: str, temperature: float, prompt_tokens: int) -> loadgen.RequestClass:
        return loadgen.RequestClass(
            task,
            temperature=temperature,
            max_tokens=max_tokens,
            prompt_tokens=prompt_tokens,
            prompts="task",
            stream=stream,
        )

    return [
        cls("extraction", 0.0, copy_prompt_tokens),
        cls("code", 0.0, copy_prompt_tokens),
        cls("chat", 0.7, chat_prompt_tokens),
        cls("creative", 1.0, 20),
    ]


async def scrape_all(monitor) -> None:
    """Scrape every pool once, now (the tier's configs scrape hourly so that tests choose when)."""
    for loop in monitor.loops:
        assert await loop.scrape_once(), loop.watch.last_error
