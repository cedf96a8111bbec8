"""Every console example in the README and the docs runs, and prints what the page shows.

Only fields marked ``vary=`` above a block may differ (see ``tests/docs/examples.py``); fix a
failure by changing the code or by running ``scripts/regen-docs`` and reading the diff.
"""

from __future__ import annotations

import pytest

from tests.docs import examples

EXAMPLES = examples.all_examples()


def test_there_are_examples_to_check():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.where for e in EXAMPLES])
def test_console_example_matches_its_command(example, tmp_path):
    cwd = examples.scratch_dir(tmp_path)
    for step in example.steps:
        got = examples.run_step(step, example, cwd)
        assert examples.masked(got, example.vary) == examples.masked(step.shown, example.vary), (
            f"{example.where}: `{step.command}` printed something else; run scripts/regen-docs"
        )


def test_masking_allows_only_the_marked_fields(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        '<!-- example: vary="\\d+ s ago" -->\n'
        "```console\n$ specguard cost --k 1  # note\nlast 5 s ago\nK 4\n```\n"
    )
    (example,) = examples_in_tmp(page)
    assert example.steps[0].command == "specguard cost --k 1"
    shown = example.steps[0].shown
    assert examples.masked("last 17 s ago\nK 4", example.vary) == examples.masked(shown, example.vary)
    assert examples.masked("last 17 s ago\nK 5", example.vary) != examples.masked(shown, example.vary)


def examples_in_tmp(page):
    saved = examples.ROOT
    examples.ROOT = page.parent
    try:
        return examples.examples_in(page)
    finally:
        examples.ROOT = saved
