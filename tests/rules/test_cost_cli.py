"""``specguard cost`` (CLI) and the cost metrics collector."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cost_synth import PROFILE_YAML as GOOD
from cost_synth import make_records
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specguard import cli
from specguard.monitor.cost_metrics import CostCollector, render_costs
from specguard.rules import cost
from specguard.rules.cost_config import CostSettings


def run_cli(capsys, *argv):
    code = cli.main(["cost", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_measured_form_reproduces_the_worked_vectors(capsys):
    code, out, _ = run_cli(
        capsys, "--round-ms", "53", "--base-ms", "18", "--accept-length", "3", "4", "--json"
    )
    assert code == 0
    rows = json.loads(out)["rows"]
    assert [round(r["rc"], 3) for r in rows] == [0.981, 0.736]
    assert [round(r["tpot_seconds"] * 1000, 2) for r in rows] == [17.67, 13.25]
    assert [round(r["speedup"], 2) for r in rows] == [1.02, 1.36]
    code, out, _ = run_cli(capsys, "--round-ms", "53", "--base-ms", "18", "--accept-length", "3")
    assert code == 0 and "0.981" in out and "1.02x" in out and "pays" in out


def test_model_form_is_bonus_aware_and_labels_the_no_bonus_form(capsys):
    code, out, _ = run_cli(capsys, "--alpha", "0.6", "--rho", "0.2", "--k", "1", "--json")
    result = json.loads(out)
    assert code == 0 and result["rows"][0]["rc"] == pytest.approx(0.75)
    assert result["rows"][0]["no_bonus_conservative_rc"] == pytest.approx(2.0)
    assert "no bonus token counted: conservative" in result["no_bonus_formula"]
    code, out, _ = run_cli(capsys, "--alpha", "0.6", "--rho", "0.2", "--k", "1", "4")
    assert "no-bonus, conservative" in out and "0.750" in out and "2.000" in out
    code, out, _ = run_cli(capsys, "--alpha", "0", "--rho", "0.2", "--k", "4")
    assert "inf" in out and "1.800" in out and "loses" in out
    code, out, _ = run_cli(capsys, "--alpha", "0.6", "--rho", "0.2", "--k", "2", "--iid", "--json")
    assert json.loads(out)["rows"][0]["accept_length"] == pytest.approx(1 + 0.6 + 0.36)


def test_profile_form(capsys, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(GOOD)
    code, out, _ = run_cli(capsys, "--profile", str(path), "--json")
    row = json.loads(out)["rows"][0]
    assert code == 0 and row["pool"] == "spec-k4" and row["rc"] == pytest.approx(0.0132 / 0.018)
    assert row["classes"][0]["rc"] == pytest.approx(0.0126 / 0.018)
    code, out, _ = run_cli(capsys, "--profile", str(path))
    assert "spec-k4" in out and "code/greedy 0.700" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        ((), "give exactly one form"),
        (("--round-ms", "53", "--alpha", "0.5"), "got flags of measured, model"),
        (("--round-ms", "53", "--base-ms", "18"), "--accept-length is required for the measured form"),
        (("--round-ms", "0", "--base-ms", "18", "--accept-length", "3"), "--round-ms (0) must be a positive"),
        (
            ("--round-ms", "53", "--base-ms", "18", "--accept-length", "0.5"),
            "--accept-length (0.5) must be >= 1",
        ),
        (("--alpha", "1.5", "--rho", "0.2", "--k", "1"), "--alpha (1.5) must be between 0 and 1"),
        (("--alpha", "0.5", "--rho", "-1", "--k", "1"), "--rho (-1) must be >= 0"),
        (("--alpha", "0.5", "--rho", "0.1", "--k", "0"), "--k (0) must be >= 1"),
        (("--iid", "--round-ms", "5"), "--iid only applies to the model form"),
        (("--profile", "/nonexistent.yaml"), "cannot read"),
    ],
)
def test_bad_flags_are_clear_errors_with_exit_2(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("Error: ") and message in err
    assert "Traceback" not in err


def test_unparsable_numbers_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["cost", "--round-ms", "abc"])
    assert info.value.code == 2
    assert "invalid float value: 'abc'" in capsys.readouterr().err


def samples(registry):
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_collector_exports_the_latest_evaluation_and_leaves_unknown_rc_out():
    rng = np.random.default_rng(0)
    records = make_records(rng, 60, pool="spec-k4", k=4, a=0.7) + make_records(rng, 60, pool="nospec", k=0)
    records += make_records(rng, 60, pool="spec-k2", k=2, a=0.7, task_type="chat")
    records += make_records(rng, 60, pool="spec-k4", k=4, a=0.7, task_type="chat", load_bucket="high")
    pools = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}
    settings = CostSettings().with_traffic([("low", 4), ("high", None)])
    costs = cost.evaluate(records, pools, None, 0.0, settings)
    registry = CollectorRegistry()
    collector = CostCollector()
    registry.register(collector)
    assert samples(registry) == {}  # nothing evaluated yet: no series, no error
    collector.update(costs)
    got = samples(registry)
    code = (
        ("load_bucket", "low"),
        ("pool", "spec-k4"),
        ("task_type", "code"),
        ("temperature_bucket", "greedy"),
    )
    measured = next(c for c in costs if c.task_type == "code" and c.pool == "spec-k4")
    assert got[("specguard_relative_cost_per_token_ratio", code)] == pytest.approx(measured.rc)
    assert got[("specguard_relative_cost_per_token_lower_ratio", code)] == pytest.approx(measured.lower)
    assert got[("specguard_relative_cost_per_token_upper_ratio", code)] == pytest.approx(measured.upper)
    assert got[("specguard_relative_cost_samples", tuple(sorted((*code, ("side", "spec")))))] == 60
    assert got[("specguard_relative_cost_samples", tuple(sorted((*code, ("side", "baseline")))))] == 60
    assert got[("specguard_relative_cost_baseline_info", tuple(sorted((*code, ("source", "live")))))] == 1
    predicted = tuple(
        sorted(
            (
                ("load_bucket", "low"),
                ("pool", "spec-k2"),
                ("source_pool", "spec-k4"),
                ("task_type", "code"),
                ("temperature_bucket", "greedy"),
            )
        )
    )
    assert got[("specguard_predicted_relative_cost_per_token_ratio", predicted)] == pytest.approx(
        measured.predictions[0].rc
    )
    # chat at high load has no baseline: no ratio series, but samples and source="none"
    chat_high = (
        ("load_bucket", "high"),
        ("pool", "spec-k4"),
        ("task_type", "chat"),
        ("temperature_bucket", "greedy"),
    )
    assert ("specguard_relative_cost_per_token_ratio", chat_high) not in got
    assert (
        got[("specguard_relative_cost_baseline_info", tuple(sorted((*chat_high, ("source", "none")))))] == 1
    )
    assert got[("specguard_relative_cost_evidence_info", tuple(sorted((*code, ("evidence", "enough")))))] == 1
    unknown = tuple(sorted((*chat_high, ("evidence", "unknown"))))
    assert got[("specguard_relative_cost_evidence_info", unknown)] == 1
    assert {d.name for d in collector.describe()} == {
        "specguard_relative_cost_evidence_info",
        "specguard_relative_cost_per_token_ratio",
        "specguard_relative_cost_per_token_lower_ratio",
        "specguard_relative_cost_per_token_upper_ratio",
        "specguard_relative_cost_samples",
        "specguard_relative_cost_baseline_info",
        "specguard_predicted_relative_cost_per_token_ratio",
        "specguard_baseline_available",
    }
    rows = render_costs(costs)
    assert json.loads(json.dumps(rows))[0]["task_type"] in {"chat", "code"}


def test_collector_never_raises_on_a_broken_value():
    class Broken:
        task_type = "x"

        def __getattr__(self, name):
            raise RuntimeError("boom")

    registry = CollectorRegistry()
    collector = CostCollector()
    registry.register(collector)
    collector.update([Broken()])
    assert samples(registry) == {}
