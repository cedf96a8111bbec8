"""One pool, no routing: the in-engine K schedule ``specguard sweep`` prints, replayed on one pool of
all the engines, is within 2% of the best schedule found in hindsight on the same scenario.

The sweep sees the traffic as a user's tap would: the request mix by class (shares of requests, from
a replay of the scenario on the K=4 pool), never the scenario's phases; it measures every K from 0
to 4 at concurrency 1..64 on the same simulated GPU (half the shipped one, as the demo runs it).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter

import yaml

from specguard import cli, schedules
from specguard.lab import demo, hindsight, replay, scenario, schedule_search, shapes
from specguard.monitor import config as monitor_config
from specguard.rules import profile as profile_mod
from specguard.sim import config as sim_config

GPU = 2.0


def world_file(sim, path) -> None:
    """The simulated GPU as a simulator config file (``specguard sweep --sim-config``)."""
    cost = {k: getattr(sim.cost, k) for k in sim.cost.__dataclass_fields__}
    cost["graph_tiers"] = list(cost["graph_tiers"])
    pools = [
        {"name": p.name, "num_speculative_tokens": p.num_speculative_tokens, "max_num_seqs": p.max_num_seqs}
        for p in sim.pools
    ]
    path.write_text(yaml.safe_dump({"cost": cost, "pools": pools}))


def test_the_printed_schedule_is_within_two_percent_of_the_hindsight_best(tmp_path):
    cfg = monitor_config.load_default()
    exporter = demo.smaller_buckets(cfg.exporter, GPU)
    sim = demo.smaller_gpu(sim_config.load(), GPU)
    shape = shapes.build("fixed", [p.name for p in exporter.pools])
    case = hindsight.Case(
        sim=sim,
        scenario=scenario.load_wave_scenario().with_clients_scaled(1 / GPU),
        buckets=replay.Buckets.from_classes(exporter.classes),
        pools=shape.pools,
        default_pool="spec-k4",
        nospec_pool="nospec",
        fleet=shape.size,
        shape=shape,
    )
    seen = Counter((f.task_type, f.temperature) for f in hindsight.single(case, "spec-k4").finished)
    mix = ",".join(f"{task}:{t}:{n}" for (task, t), n in sorted(seen.items()))
    world = tmp_path / "world.yaml"
    world_file(sim, world)
    out = io.StringIO()
    args = ["sweep", "--sim-config", str(world), "--ks", "0,1,2,3,4", "--levels", "1,2,4,8,16,32,64"]
    args += ["--mix", mix, "--requests", "96", "--no-plots", "--json", "-o", str(tmp_path / "sweep")]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(args) == 0
    printed = json.loads(out.getvalue())
    config = json.loads(printed["schedule"]["vllm_speculative_config"])
    assert set(config) == {"method", "num_speculative_tokens", "num_speculative_tokens_per_batch_size"}
    advised = schedules.vllm(
        config["num_speculative_tokens_per_batch_size"], config["num_speculative_tokens"]
    )
    assert profile_mod.load_profile(printed["profile"]).schedule == printed["schedule"]  # the profile has it

    found = schedule_search.best(case)
    assert found is not None
    best_tokens = sum(found[1].tokens.values())
    advised_tokens = sum(schedule_search.replay_schedule(case, advised).tokens.values())
    assert advised_tokens >= 0.98 * best_tokens, (advised.describe(), found[0].describe())
    lines = printed["schedule_lines"]
    assert lines[1].startswith("vLLM: --speculative-config '") and "creative/high" in " ".join(lines)
    # routed pools: each K keeps its own K where it pays for the mix, and never drafts more
    assert len(printed["routed_schedule_lines"]) == 4 and set(printed["routed_schedules"]) == {
        "1",
        "2",
        "3",
        "4",
    }
    for k, given in printed["routed_schedules"].items():
        if given is not None:
            routed = json.loads(given)
            ranges = routed["num_speculative_tokens_per_batch_size"]
            assert ranges[0][2] <= int(k) and all(r[2] <= int(k) for r in ranges)
