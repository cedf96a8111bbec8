"""Claims of the docs that are not console examples, checked against their source: the alert count
and table against the rules file, the demo's time budget against its code, the sweep's and the
demo's own wall-time lines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from specguard.cli.commands import demo

ROOT = Path(__file__).resolve().parents[2]


def flat(path: str) -> str:
    return " ".join((ROOT / path).read_text(encoding="utf-8").split())


def test_deploy_doc_counts_and_lists_every_alert_of_the_rules_file():
    rules = yaml.safe_load((ROOT / "deploy/prometheus/specguard-rules.yaml").read_text())
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    text = flat("docs/deploy.md")
    said = re.search(r"recording rules \+ (\d+) alerts", text)
    assert said and int(said.group(1)) == len(alerts), (said and said.group(0), len(alerts))
    table = set(re.findall(r"\| \[`(SpecGuard\w+)`\]\(runbooks\.md#", text))
    assert table == set(alerts), (set(alerts) - table, table - set(alerts))


def test_demo_doc_states_the_time_budget_the_demo_uses():
    parser = demo.argparse.ArgumentParser()
    demo.register(parser.add_subparsers())
    default = parser.parse_args(["demo"]).duration
    live = demo.live_budget(default)
    text = flat("docs/demo.md")
    assert f"`--duration` ({default:.0f} s by default)" in text
    assert f"the live run gets {demo.LIVE_SHARE:.0%} of it ({live:.0f} s)" in text
    assert "about two minutes" not in text  # the whole run takes longer; the demo prints its own time


def test_the_sweep_prints_its_own_wall_time(tmp_path):
    argv = [sys.executable, "-m", "specguard", "sweep", "--levels", "1,2", "--requests", "8"]
    done = subprocess.run([*argv, "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^done in \d+ s$", done.stdout, re.M), done.stdout[-500:]
    assert "(it prints its wall time)" in flat("docs/commands.md")


def test_the_taken_port_message_quoted_in_commands_md_points_at_the_real_line():
    from specguard import configfile
    from specguard.monitor import config

    text = flat("docs/commands.md")
    quoted = re.search(
        r"Error: specguard/monitor/default-config\.yaml:(\d+):(\d+): tap\.listen: cannot listen", text
    )
    assert quoted, "docs/commands.md no longer quotes the taken-port message"
    line, column = configfile.load_file(config.DEFAULT_CONFIG).where("tap.listen")
    assert (int(quoted.group(1)), int(quoted.group(2))) == (line, column)
