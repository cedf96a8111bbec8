"""Console examples in the README and the docs, and the commands that produce them.

A ``console`` block holds ``$ specguard ...`` lines, each followed by what the command prints. An
HTML comment right above the block may tune how it is checked::

    <!-- example: vary="\\d+ s ago"; vary="in \\d+\\.\\d s"; stop-after-output -->

- ``vary="REGEX"``: a marked field (timing) that may differ; matches are masked on both sides.
- ``stop-after-output``: the command serves until stopped (``specguard simulate``); it is stopped
  once it has been quiet for ``QUIET_SECONDS`` after printing its banner.
- ``env="NAME=VALUE"``: extra environment for the command.

Commands run with the repository's top-level folders linked into a scratch directory, so the
paths shown (``specguard/monitor/default-config.yaml``, ``docs/examples/...``) resolve and files
the command writes stay out of the clone. ``scripts/regen-docs`` rewrites the blocks from what
the commands print now; ``tests/docs/test_examples.py`` fails when a block and its command differ.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("README.md", "docs")
MASK = "<varies>"
QUIET_SECONDS = 3.0  # a serving command has printed its banner once it is quiet this long
ANNOTATION = re.compile(r"^<!--\s*example:(?P<body>.*?)-->\s*$")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")


@dataclass(frozen=True)
class Step:
    command: str  # as shown, without the leading "$ " and without a trailing "# comment"
    shown: str  # the output lines the block shows under it, joined with newlines


@dataclass
class Example:
    path: Path
    line: int  # 1-based line of the opening fence
    steps: list[Step]
    vary: list[str] = field(default_factory=list)
    stop_after_output: bool = False
    env: dict[str, str] = field(default_factory=dict)
    start: int = 0  # index of the first line inside the fence
    end: int = 0  # index of the closing fence

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    files: list[Path] = []
    for name in SOURCES:
        path = ROOT / name
        files.extend(sorted(path.rglob("*.md")) if path.is_dir() else [path])
    return [p for p in files if p.name != "index.md"]  # docs/index.md is generated from README.md


def strip_comment(command: str) -> str:
    """``specguard cost --k 1 4   # note`` -> ``specguard cost --k 1 4`` (shell comment rules)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return shlex.join(list(lexer))


def parse_annotation(text: str, example: Example) -> None:
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        key, _, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if value.startswith('"') and value.endswith('"'):
            value = value[1:-1]
        if key == "vary":
            re.compile(value)
            example.vary.append(value)
        elif key == "stop-after-output":
            example.stop_after_output = True
        elif key == "env":
            name, _, val = value.partition("=")
            example.env[name] = val
        else:
            raise ValueError(f"{example.where}: unknown example option {key!r}")


def examples_in(path: Path) -> list[Example]:
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Example] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        close = i + 1
        while close < len(lines) and not FENCE.match(lines[close]):
            close += 1
        if fence["lang"] == "console":
            example = Example(path=path, line=i + 1, steps=[], start=i + 1, end=close)
            prev = lines[i - 1] if i > 0 else ""
            note = ANNOTATION.match(prev.strip())
            if note:
                parse_annotation(note["body"], example)
            command: str | None = None
            shown: list[str] = []
            for body_line in lines[i + 1 : close]:
                if body_line.startswith("$ "):
                    if command is not None:
                        example.steps.append(Step(command, "\n".join(shown)))
                    command, shown = strip_comment(body_line[2:]), []
                elif command is None:
                    raise ValueError(f"{path.relative_to(ROOT)}:{i + 1}: console block must start with '$ '")
                else:
                    shown.append(body_line)
            if command is not None:
                example.steps.append(Step(command, "\n".join(shown)))
            found.append(example)
        i = close + 1
    return found


def all_examples() -> list[Example]:
    return [e for path in doc_files() for e in examples_in(path)]


def scratch_dir(tmp: Path) -> Path:
    """A directory where the shown relative paths resolve to the repository's files."""
    for name in ("specguard", "docs", "deploy", "tests", "bench", "scripts"):
        link = tmp / name
        if not link.exists():
            link.symlink_to(ROOT / name)
    return tmp


def run_step(step: Step, example: Example, cwd: Path, timeout: float = 240.0) -> str:
    argv = shlex.split(step.command)
    if not argv or argv[0] != "specguard":
        raise ValueError(f"{example.where}: only specguard commands are checked, got {step.command!r}")
    argv = [sys.executable, "-m", "specguard", *argv[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", "NO_COLOR": "1", **example.env}
    env.pop("TERM", None)
    if not example.stop_after_output:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        return (done.stdout + done.stderr).rstrip("\n")
    got: list[str] = []
    lines: queue.Queue[str | None] = queue.Queue()
    with subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            while True:  # until the command has been quiet for QUIET_SECONDS after its first line
                try:
                    line = lines.get(timeout=QUIET_SECONDS if got else 60.0)
                except queue.Empty:
                    break
                if line is None:
                    break
                got.append(line)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            reader.join(timeout=10)
    return "\n".join(got)


def masked(text: str, vary: list[str]) -> str:
    lines = [line.rstrip() for line in text.split("\n")]
    out = "\n".join(lines).strip("\n")
    for pattern in vary:
        out = re.sub(pattern, MASK, out)
    return out


def rewrite(example: Example, outputs: list[str]) -> None:
    """Put ``outputs`` (one per step) under the block's commands, keeping the commands as shown."""
    lines = example.path.read_text(encoding="utf-8").split("\n")
    shown_commands = [line for line in lines[example.start : example.end] if line.startswith("$ ")]
    body: list[str] = []
    for shown, out in zip(shown_commands, outputs, strict=True):
        body.append(shown)
        body.extend(line.rstrip() for line in out.split("\n"))
    lines[example.start : example.end] = body
    example.path.write_text("\n".join(lines), encoding="utf-8")
