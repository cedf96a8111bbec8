"""Capture the llama.cpp fixtures from real servers: ``python tests/llamacpp/capture.py [OUT_DIR]``.

Starts (through scripts/serve-llamacpp, provisioned by scripts/provision-llamacpp) a server with
draft-model speculation (K = 4), one with n-gram speculation (K = 8) and one without, sends each a
few greedy copy and sampled requests (chat and completions, streamed with and without
``stream_options.include_usage`` and not streamed), and writes into OUT_DIR (default
tests/fixtures):

- ``llamacpp-11434-draft-k4-fresh.metrics.txt``: the speculating server's page before any request;
- ``llamacpp-11434-draft-k4.metrics.txt``, ``llamacpp-11434-ngram-k8.metrics.txt``,
  ``llamacpp-11434-nospec.metrics.txt``: the pages after the requests;
- ``llamacpp-11434-responses.json``: each response as the server sent it (body text, or the SSE
  text of a stream), keyed by server and kind.

Run it under ``flock /tmp/specguard-heavy.lock`` on a shared machine. The page values depend on
what the model generates, so a new capture changes the numbers the fixture tests pin.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: `tests.engineproc`

import llamacppkit as kit  # noqa: E402

COPY = (
    "Copy the following text exactly, with nothing before or after it:\n\n"
    "The licenses for most software and other practical works are designed to take away your "
    "freedom to share and change the works. By contrast, the GNU General Public License is intended "
    "to guarantee your freedom to share and change all versions of a program."
)
STORY = "Write a short imaginative story about a lighthouse that hums."
SERVERS = (("draft-k4", 4, False), ("ngram-k8", 8, True), ("nospec", 0, False))


def raw_post(url: str, body: dict) -> str:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return resp.read().decode()


def requests() -> list[tuple[str, str, dict]]:
    """(kind, path, body): what every server gets, in order."""
    greedy = {"messages": [{"role": "user", "content": COPY}], "max_tokens": 48, "temperature": 0}
    sampled = {
        "messages": [{"role": "user", "content": STORY}],
        "max_tokens": 48,
        "temperature": 1.0,
        "seed": 7,
    }
    completion = {"prompt": COPY, "max_tokens": 24, "temperature": 0}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    return [
        ("chat-greedy", "/v1/chat/completions", greedy),
        ("chat-sampled", "/v1/chat/completions", sampled),
        ("chat-greedy-stream-usage", "/v1/chat/completions", {**greedy, **usage}),
        ("chat-sampled-stream", "/v1/chat/completions", {**sampled, "stream": True}),
        ("completion-greedy", "/v1/completions", completion),
        ("completion-greedy-stream-usage", "/v1/completions", {**completion, **usage}),
    ]


def main(out: Path) -> None:
    kit.provision()
    cpus = sorted(os.sched_getaffinity(0))
    responses: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as logdir:
        for name, k, ngram in SERVERS:
            server = kit.start(name, Path(logdir), cpus[0], k, ngram=ngram)
            try:
                kit.wait_healthy(server)
                if name == "draft-k4":
                    (out / "llamacpp-11434-draft-k4-fresh.metrics.txt").write_text(
                        kit.fetch(f"{server.url}/metrics")
                    )
                responses[name] = {kind: raw_post(server.url + path, body) for kind, path, body in requests()}
                (out / f"llamacpp-11434-{name}.metrics.txt").write_text(kit.fetch(f"{server.url}/metrics"))
            finally:
                kit.stop(server)
    (out / "llamacpp-11434-responses.json").write_text(json.dumps(responses, indent=1, sort_keys=True) + "\n")
    print(f"wrote the llama.cpp fixtures into {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "fixtures")
