"""The exporter sections and the whole-file composition: all errors at once, with their places."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from specguard import cli
from specguard.errors import ConfigError
from specguard.exporters.config import Bucket
from specguard.monitor import config

GOOD = """\
pools:
  - {name: spec-k4, url: "http://127.0.0.1:8001", engine: vllm, num_speculative_tokens: 4}
  - {name: nospec, url: "http://127.0.0.1:8003", engine: vllm}
classes:
  task_types: [code, chat]
  temperature_buckets:
    - {name: greedy, max: 0}
    - {name: hot, max: null}
tap: {listen: "127.0.0.1:0", holdout_share: 0.1}
"""


def issues(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config.parse_text(text, "c.yaml")
    return [str(i) for i in info.value.issues]


def test_good_config_parses_with_defaults_and_derived_pools():
    cfg = config.parse_text(GOOD, "c.yaml").exporter
    assert cfg.pool_names == ("spec-k4", "nospec")
    assert cfg.tap.default_pool == "spec-k4"
    assert cfg.tap.nospec_pool == "nospec"  # the first K=0 pool
    assert cfg.tap.holdout_share == 0.1
    assert cfg.classes.task_labels == ("code", "chat", "other")
    assert cfg.classes.temperature_buckets == (Bucket("greedy", 0.0), Bucket("hot", math.inf))
    assert cfg.scrape.interval_seconds == 15.0


def test_force_include_usage_is_a_checked_pool_option():
    assert [p.force_include_usage for p in config.parse_text(GOOD, "c.yaml").exporter.pools] == [False, False]
    k4 = "num_speculative_tokens: 4"
    forced = GOOD.replace(k4 + "}", k4 + ", force_include_usage: true}")
    assert config.parse_text(forced, "c.yaml").exporter.pools[0].force_include_usage is True
    bad = issues(forced.replace("force_include_usage: true", "force_include_usage: yes-please"))
    assert any("c.yaml:2:" in line and "pools[0].force_include_usage" in line for line in bad), bad


def test_shipped_example_config_is_valid_and_matches_the_simulator():
    cfg = config.load_default().exporter
    assert [(p.name, p.num_speculative_tokens) for p in cfg.pools] == [
        ("spec-k4", 4),
        ("spec-k2", 2),
        ("nospec", 0),
    ]
    assert set(cfg.classes.task_types) == {"code", "extraction", "chat", "creative"}


def test_every_error_is_reported_at_once_with_line_column_and_path():
    found = issues(
        """\
pools:
  - name: a
    url: ftp://x
    engine: vlm
  - {name: b, url: "http://h:1", num_speculative_tokens: -1}
  - {name: b, url: "http://h:2"}
classes:
  task_types: [code, code]
  temperature_buckets:
    - {name: g, max: 0.5}
    - {name: h, max: 0.2}
    - {name: z, max: null}
  matchers:
    - {model: "(", task_type: code}
    - {path: x}
    - {field: metadata.task, task_type: nope}
tap:
  holdout_share: 0.9
  default_pool: missing
  bogus: 1
scrape: {interval_seconds: 1, timeout_seconds: 5}
whatever: 1
"""
    )
    expected = [
        "c.yaml:3:5: pools[0].url: ('ftp://x') must be http(s)://host:port with no path",
        "c.yaml:4:5: pools[0].engine: ('vlm') must be one of",
        "c.yaml:5:34: pools[1].num_speculative_tokens: (-1) must be >= 0",
        "c.yaml:6:6: pools[2].name: duplicate pool name 'b'",
        "c.yaml:8:22: classes.task_types[1]: duplicate task type 'code'",
        "c.yaml:11:17: classes.temperature_buckets[1].max: (0.2) must be greater",
        "c.yaml:14:8: classes.matchers[0].model: invalid regular expression",
        "c.yaml:15:7: classes.matchers[1].task_type: is required with model or path",
        "classes.matchers[2].task_type: ('nope') is not in task_types",
        "c.yaml:18:3: tap.holdout_share: (0.9) must be <= 0.5",
        "c.yaml:19:3: tap.default_pool: ('missing') is not a configured pool",
        "c.yaml:20:3: tap.bogus: unknown key",
        "c.yaml:21:31: scrape.timeout_seconds: (5.0) must be <= interval_seconds (1.0)",
        "c.yaml:22:1: whatever: unknown key",
    ]
    for prefix in expected:
        assert any(prefix in line for line in found), (prefix, found)


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param("classes: {}\n", "pools: is required", id="no-pools"),
        pytest.param("pools: []\n", "pools: must list at least one pool", id="empty-pools"),
        pytest.param(
            GOOD.replace("holdout_share: 0.1", "nospec_pool: spec-k4"),
            "tap.nospec_pool: ('spec-k4') has num_speculative_tokens > 0",
            id="nospec",
        ),
        pytest.param(
            GOOD.replace("- {name: hot, max: null}", "- {name: hot, max: 1.0}"),
            "the last temperature bucket must be open-ended",
            id="closed-buckets",
        ),
        pytest.param(
            GOOD.replace('"127.0.0.1:0"', "nowhere"), "tap.listen: ('nowhere') must be host:port", id="listen"
        ),
        pytest.param("pools: [\n", "invalid YAML", id="yaml"),
    ],
)
def test_single_errors(text, message):
    assert any(message in line for line in issues(text)), issues(text)


def test_section_hooks_run_and_report_errors_with_the_rest():
    seen = []

    def parse_extra(root):
        section = root.section("extra")
        value = section.get("min_samples", int, 10)
        section.reject_unknown()
        seen.append(value)
        return value

    saved = dict(config.SECTIONS)
    config.SECTIONS["extra"] = parse_extra
    try:
        cfg = config.parse_text(GOOD + "extra: {min_samples: 5}\n")
        assert cfg.sections["extra"] == 5 and seen == [5]
        bad = issues(
            GOOD.replace("engine: vllm, num", "engine: x, num") + "extra: {min_samples: x, typo: 1}\n"
        )
        assert any("extra.min_samples: must be an integer" in line for line in bad)
        assert any("extra.typo: unknown key" in line for line in bad)
        assert any("pools[0].engine" in line for line in bad)  # one report for every section
    finally:
        config.SECTIONS.clear()
        config.SECTIONS.update(saved)
    assert any("extra: unknown key" in line for line in issues(GOOD + "extra: {}\n"))


def test_check_config_command(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("engine: vllm, num", "engine: vllx, num"))
    assert cli.main(["check-config", str(good)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK ") and "spec-k4 (vllm, K=4)" in out
    assert cli.main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2:" in err and "pools[0].engine: ('vllx') must be one of" in err
    assert err.rstrip().endswith("1 error")
    assert cli.main(["check-config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_check_config_as_a_process(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  - {name: a, url: nowhere}\n")
    done = subprocess.run(
        [sys.executable, "-m", "specguard", "check-config", str(bad)], capture_output=True, text=True
    )
    assert done.returncode == 2 and f"{bad}:2:" in done.stderr and "Traceback" not in done.stderr


def test_check_config_refuses_a_config_with_no_pool_without_speculation(tmp_path, capsys):
    """check-config once said OK and printed "no-spec pool None"."""
    only_spec = tmp_path / "only-spec.yaml"
    only_spec.write_text(
        "pools:\n"
        '  - {name: spec-k4, url: "http://127.0.0.1:9", num_speculative_tokens: 4}\n'
        '  - {name: spec-k2, url: "http://127.0.0.1:9", num_speculative_tokens: 2}\n'
    )
    assert cli.main(["check-config", str(only_spec)]) == 2
    captured = capsys.readouterr()
    assert "None" not in captured.out + captured.err
    assert (
        f"{only_spec}:1:1: pools: no pool without speculation: spec-k4 (K=4), spec-k2 (K=2); "
        "add one with num_speculative_tokens: 0"
    ) in captured.err


def test_check_config_says_which_guard_rules_apply(tmp_path, capsys):
    cfg = tmp_path / "specguard.yaml"
    cfg.write_text(GOOD + "guard: {dry_run: true, min_samples: 8}\n")
    assert cli.main(["check-config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert (
        "guard rules: relative-cost, full-rollback-requests (report only) "
        "(the shipped defaults: the guard section sets no rules); dry-run"
    ) in out
