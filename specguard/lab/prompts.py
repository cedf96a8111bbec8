"""Task-shaped prompts for a real model: what each task type asks, so acceptance means something.

The word-salad prompts of ``loadgen.prompt_for`` suit the simulator and the random tiny model. A
trained model answers the request, so the prompt decides what it writes: extraction and code
editing ask it to copy material from the prompt (n-gram drafts find it there), chat and creative
ask for new text (nothing to copy). Each prompt is reproducible from (seed, task type, index) and
grows to about ``prompt_tokens`` tokens by adding more of its material (more invoice lines, more
code, more context), so the workload geometry axis can ask for long prompts.
"""

from __future__ import annotations

import random

_NAMES = ("Ada Park", "Bruno Silva", "Chen Wei", "Dana Novak", "Emeka Obi", "Farah Haddad", "Gus Lind")
_ITEMS = ("steel bolts M8", "copper wire 2 mm", "LED panel 40 W", "oak plank 2 m", "gasket kit", "relay 24 V")
_TOPICS = ("sleeping better", "learning a language", "running a first 10k", "saving money", "cooking rice")
_THINGS = ("a lighthouse that hums", "a clock made of rain", "the moon's lost key", "a city of paper birds")
_FUNCS = ("total_price", "merge_counts", "parse_line", "clamp", "moving_average", "dedupe", "word_freq")
_CONTEXT = (
    "I have a busy week and little time.",
    "Keep it practical and friendly.",
    "I tried a few things already and they did not stick.",
    "Short sentences are easier for me to read.",
    "I would like to start this weekend.",
)


def _extraction(rng: random.Random, index: int, chars: int) -> str:
    lines = [
        f"Invoice number: INV-{rng.randint(10000, 99999)}-{index}",
        f"Date: 2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        f"Customer: {rng.choice(_NAMES)}",
    ]
    while len("\n".join(lines)) < chars:
        qty, price = rng.randint(1, 40), rng.randint(100, 9999) / 100
        lines.append(f"Item: {rng.choice(_ITEMS)}; quantity {qty}; unit price {price:.2f} EUR")
    body = "\n".join(lines)
    return (
        "Copy every field of this invoice into a JSON object, keeping each value exactly as written.\n\n"
        f"{body}\n\nJSON:"
    )


def _code(rng: random.Random, index: int, chars: int) -> str:
    blocks = []
    while len("\n".join(blocks)) < chars or not blocks:
        name = f"{rng.choice(_FUNCS)}_{index}_{len(blocks)}"
        a, b = rng.choice(("values", "items", "rows")), rng.choice(("limit", "factor", "offset"))
        blocks.append(
            f"def {name}({a}, {b}):\n"
            f"    result = []\n"
            f"    for value in {a}:\n"
            f"        if value > {b}:\n"
            f"            result.append(value * {b})\n"
            f"    return result\n"
        )
    code = "\n".join(blocks)
    return (
        "Rewrite this Python code with type hints on every function. Return the whole code, "
        f"otherwise unchanged.\n\n```python\n{code}```"
    )


def _chat(rng: random.Random, index: int, chars: int) -> str:
    text = f"Give me three tips for {rng.choice(_TOPICS)}."
    while len(text) < chars:
        text += " " + rng.choice(_CONTEXT)
    return text


def _creative(rng: random.Random, index: int, chars: int) -> str:
    text = f"Write a short surreal poem about {rng.choice(_THINGS)}."
    while len(text) < chars:
        text += f" Mention {rng.choice(_THINGS)}."
    return text


BUILDERS = {"extraction": _extraction, "code": _code, "chat": _chat, "creative": _creative}


def task_prompt(task_type: str, index: int, seed: int, prompt_tokens: int) -> str | None:
    """A prompt of about ``prompt_tokens`` tokens (4 characters each) for a known task type, else None."""
    builder = BUILDERS.get(task_type)
    if builder is None:
        return None
    rng = random.Random(f"{seed}/{task_type}/{index}")
    return builder(rng, index, 4 * prompt_tokens)
