"""deploy/grafana: the dashboard-linter rules that matter, re-implemented (ops-conventions §6.2).

grafana/dashboard-linter is a Go binary with no working `go install`; these checks cover its
template-datasource, panel-datasource, panel-units, panel-title-description, target-rate-interval,
target-job and target-promql rules, plus our own: no hard-coded datasource uid, guarded
denominators, every metric exists (exported by specguard or recorded by our rules).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from deployhelp import (
    BUILTIN,
    DASHBOARD,
    DEPLOY,
    EXPORTED,
    PENDING,
    metric_names,
    recording_names,
    run_promtool,
)

DASH = json.loads(DASHBOARD.read_text())
PANELS = [p for p in DASH["panels"] if p["type"] != "row"]
# Grafana unit ids used here (a subset of Grafana's unit registry) plus custom `count:` units
UNITS = {"none", "short", "percentunit", "s", "ms", "reqps", "ops", "bytes"}
DEFAULTS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def load_builder():
    spec = importlib.util.spec_from_file_location(
        "build_dashboard", DEPLOY / "grafana" / "build_dashboard.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def all_exprs() -> list[tuple[str, str]]:
    """(where, expr) for every panel target and annotation query."""
    out = [(f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"]) for p in PANELS for t in p["targets"]]
    out += [(f"annotation {a['name']!r}", a["expr"]) for a in DASH["annotations"]["list"] if "expr" in a]
    return out


EXPRS = all_exprs()


def substitute(expr: str, values: dict[str, str] | None = None) -> str:
    """Replace Grafana variables the way Grafana would for 'All' selections."""
    values = {**DEFAULTS, **(values or {})}
    for var, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    return re.sub(r"\$[a-z_]+", ".+", expr)


def walk(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}[{i}]")


def test_committed_json_is_what_the_builder_renders():
    assert DASHBOARD.read_text() == load_builder().render(), "run deploy/grafana/build_dashboard.py"


def test_dashboard_shape():
    assert DASH["uid"] == "specguard-overview"
    assert isinstance(DASH["schemaVersion"], int) and DASH["schemaVersion"] >= 36
    assert DASH["title"] and DASH["tags"] and DASH["time"] and DASH["refresh"]
    assert "id" not in DASH, "a provisioned dashboard must not carry a database id"
    ids = [p["id"] for p in DASH["panels"]]
    assert len(ids) == len(set(ids))


def test_panels_do_not_overlap_and_fit_the_grid():
    cells = set()
    for p in DASH["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {p['title']!r} overlaps at {(x, y)}"
                cells.add((x, y))


def test_exactly_one_datasource_variable_named_datasource():
    ds = [v for v in DASH["templating"]["list"] if v["type"] == "datasource"]
    assert len(ds) == 1 and ds[0]["name"] == "datasource" and ds[0]["query"] == "prometheus"
    assert ds[0]["label"] == "Data Source"


def test_no_hard_coded_datasource_uid_anywhere():
    for path, node in walk(DASH):
        ds = node.get("datasource")
        if isinstance(ds, dict):
            assert ds.get("uid") in {"${datasource}", "-- Grafana --"}, f"{path}: {ds}"
        elif ds is not None:
            pytest.fail(f"{path}: datasource must be a templated object, got {ds!r}")


def test_query_variables_are_multi_select_with_all_matching_anything():
    queries = [v for v in DASH["templating"]["list"] if v["type"] == "query"]
    assert {v["name"] for v in queries} >= {"job", "pool", "task_type", "temperature_bucket", "load_bucket"}
    for v in queries:
        assert v["multi"] and v["includeAll"] and v["allValue"] == ".+", v["name"]
        assert v["datasource"]["uid"] == "${datasource}"
        assert v["refresh"] == 2, f"{v['name']}: refresh on time range change"


@pytest.mark.parametrize("panel", PANELS, ids=[p["title"] for p in PANELS])
def test_panel_title_description_unit_datasource(panel: dict):
    assert panel["title"] and len(panel["description"]) > 40
    unit = panel["fieldConfig"]["defaults"]["unit"]
    assert unit in UNITS or unit.startswith("count:"), unit
    assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert panel["targets"]
    # the description names at least one source metric, as vLLM's dashboard does
    names = {re.sub(r"_bucket$", "", n) for t in panel["targets"] for n in metric_names(t["expr"])}
    assert any(n in panel["description"] for n in names), names
    if unit == "percentunit":
        d = panel["fieldConfig"]["defaults"]
        assert (d.get("min"), d.get("max")) == (0, 1)


@pytest.mark.parametrize("where,expr", EXPRS, ids=[w for w, _ in EXPRS])
def test_rates_use_rate_interval_and_filter_on_job(where: str, expr: str):
    for fn, window in re.findall(r"\b(rate|irate|increase)\([^\[]*\[([^\]]+)\]", expr):
        expected = "$__interval" if where.startswith("annotation") else "$__rate_interval"
        assert window == expected, f"{where}: {fn}(...[{window}])"
    for selector in re.findall(r"\b(?:specguard_\w+|\w+:\w+:\w+|ALERTS|up(?=\{))(\{[^}]*\})?", expr):
        assert 'job=~"$job"' in selector, f"{where}: selector without the job filter in {expr!r}"


def split_division_rhs(expr: str) -> list[str]:
    """The right-hand operand of every `/` (after vector-matching modifiers)."""
    out = []
    for m in re.finditer(r"/", expr):
        rest = expr[m.end() :].lstrip()
        rest = re.sub(r"^(ignoring|on)\s*\([^)]*\)\s*(group_left|group_right)?\s*(\([^)]*\))?\s*", "", rest)
        if rest.startswith("("):
            depth = 0
            for i, ch in enumerate(rest):
                depth += {"(": 1, ")": -1}.get(ch, 0)
                if depth == 0:
                    out.append(rest[: i + 1])
                    break
        else:
            out.append(rest.split()[0] if rest else "")
    return out


@pytest.mark.parametrize("where,expr", EXPRS, ids=[w for w, _ in EXPRS])
def test_denominators_are_guarded(where: str, expr: str):
    for rhs in split_division_rhs(expr):
        assert is_guarded(rhs), f"{where}: unguarded denominator {rhs!r}"


def test_every_metric_is_exported_or_recorded():
    known = EXPORTED | recording_names() | BUILTIN | PENDING
    for where, expr in EXPRS:
        unknown = metric_names(expr) - known
        assert not unknown, f"{where}: {sorted(unknown)}"


def test_every_expression_parses_with_promtool(tmp_path: Path):
    # promtool parses PromQL offline when the expressions are wrapped as recording rules
    rules = [{"record": f"dashboard:expr_{i}:check", "expr": substitute(e)} for i, (_, e) in enumerate(EXPRS)]
    path = tmp_path / "dashboard-exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = run_promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout


def test_the_panels_a_user_needs_are_there():
    titles = " | ".join(p["title"] for p in PANELS).lower()
    for needed in (
        "relative cost",
        "accept length",
        "strict accept rate",
        "per-position",
        "full-rollback",
        "tpot",
        "plan",
        "scrape health",
        "probe traffic",
        "baseline available",
        "in-flight",
        "upstream errors",
        "unattributed",
        "alertmanager alerts",
        "actuation",
        "pool health",
        "failover",
        "specguard up",
    ):
        assert needed in titles, needed
    rc = next(p for p in PANELS if p["title"].startswith("Relative cost per token"))
    steps = rc["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == 1.0 and rc["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"]
    actions = [a for a in DASH["annotations"]["list"] if "specguard_actions_total" in a.get("expr", "")]
    assert actions and actions[0]["enable"]
    tpot = next(p for p in PANELS if p["title"].startswith("TPOT per pool and load"))
    assert "by (pool, load_bucket)" in tpot["targets"][0]["expr"]
    accept = next(p for p in PANELS if p["title"].startswith("Strict accept rate"))
    assert "temperature_bucket" in accept["targets"][0]["expr"]


def is_guarded(rhs: str) -> bool:
    return bool(re.search(r">\s*0\)$", rhs)) or rhs.startswith(("clamp_min(", "(clamp_min("))


def test_the_denominator_check_tells_guarded_from_unguarded():
    assert [is_guarded(r) for r in split_division_rhs("sum(rate(a[5m])) / sum(rate(b[5m]))")] == [False]
    rhs = split_division_rhs("x / ignoring (position) group_left () (sum(rate(b[5m])))")
    assert rhs == ["(sum(rate(b[5m])))"] and not is_guarded(rhs[0])
    assert [is_guarded(r) for r in split_division_rhs("x / on () group_left () (sum(b) > 0)")] == [True]
    assert [is_guarded(r) for r in split_division_rhs("x / clamp_min(sum(b), 1e-9)")] == [True]


def by_title(title: str) -> dict:
    (panel,) = [p for p in PANELS if p["title"] == title]
    return panel


TABLES = [p for p in PANELS if p["type"] == "table"]


@pytest.mark.parametrize("panel", TABLES, ids=[p["title"] for p in TABLES])
def test_tables_merge_their_queries_into_named_columns(panel: dict):
    assert [t["id"] for t in panel["transformations"]] == ["merge", "organize"]
    assert all(t["instant"] and not t["range"] and t["format"] == "table" for t in panel["targets"])
    organize = panel["transformations"][1]["options"]
    assert organize["excludeByName"]["Time"]
    for ref in (t["refId"] for t in panel["targets"]):
        field = f"Value #{ref}"
        assert (field in organize["renameByName"]) != (field in organize["excludeByName"]), field
    shown = set(organize["renameByName"].values())
    for override in panel["fieldConfig"]["overrides"]:
        assert override["matcher"] == {"id": "byName", "options": override["matcher"]["options"]}
        assert override["matcher"]["options"] in shown, override
        for prop in override["properties"]:
            if prop["id"] == "unit":
                assert prop["value"] in UNITS, prop
    # every query groups by the same key labels, so merge lines them up row by row
    keys = [
        set(re.match(r"^(?:max|sum) by \(([^)]*)\)", t["expr"]).group(1).split(", "))
        for t in panel["targets"]
    ]
    assert all(keys[0] <= k or k <= keys[0] for k in keys), keys


def column_settings(panel: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for override in panel["fieldConfig"]["overrides"]:
        for prop in override["properties"]:
            out.setdefault(override["matcher"]["options"], {})[prop["id"]] = prop["value"]
    return out


def test_rc_table_has_point_rc_bounds_samples_baseline_source_and_traffic():
    rc = by_title("RC bounds and evidence now")
    names = rc["transformations"][1]["options"]["renameByName"]
    assert set(names.values()) == {
        "RC", "RC lower", "RC upper", "spec samples", "baseline samples", "baseline source", "traffic",
    }  # fmt: skip
    point = next(t["expr"] for t in rc["targets"] if f"Value #{t['refId']}" == "Value #A")
    assert "pool_class_load:specguard_relative_cost_per_token:ratio" in point
    settings = column_settings(rc)
    for name in ("RC", "RC lower", "RC upper"):
        assert settings[name]["decimals"] == 2 and settings[name]["thresholds"]["steps"][-1]["value"] == 1.0
    assert settings["spec samples"]["decimals"] == 0 and settings["spec samples"]["unit"] == "short"
    plan = column_settings(by_title("Current plan per class"))
    assert plan["K"]["decimals"] == 0


def test_guard_health_is_split_with_units_and_thresholds():
    since, frozen, errors = (
        by_title(t) for t in ("Since last evaluation", "Frozen", "Consecutive source errors")
    )
    assert since["fieldConfig"]["defaults"]["unit"] == "s"
    assert since["fieldConfig"]["defaults"]["thresholds"]["steps"][-1] == {"value": 300.0, "color": "red"}
    assert frozen["fieldConfig"]["defaults"]["thresholds"]["steps"][-1] == {"value": 1.0, "color": "red"}
    assert errors["fieldConfig"]["defaults"]["unit"] == "short"
    for panel in (since, frozen, errors):
        assert panel["type"] == "stat" and len(panel["targets"]) == 1
        assert panel["options"]["colorMode"] == "background"
        assert panel["options"]["reduceOptions"]["calcs"] == ["lastNotNull"]


def test_verdict_counts_rc_on_the_planned_pool_and_shows_probes_apart():
    on = "on (pool, task_type, temperature_bucket, load_bucket)"
    for title in (
        "Relative cost per token (RC) per class, as planned",
        "Worst RC now",
        "Classes with RC above 1.0",
    ):
        expr = by_title(title)["targets"][0]["expr"]
        assert f"and {on}" in expr and "specguard_plan_info" in expr and "== 1" in expr, title
        # a class with no plan in view counts on every pool, as the alerts count it: the plan may
        # come from a decider under another job, and one out of view must not hide a losing class
        assert f"unless {CLASS_ON}\n({ANY_PLAN})" in expr, title
    probe = by_title("RC on probe traffic (classes planned elsewhere)")["targets"][0]["expr"]
    assert f"unless {on}" in probe and "specguard_plan_info" in probe
    assert f"and {CLASS_ON}\n({ANY_PLAN})" in probe


CLASS_ON = "on (task_type, temperature_bucket, load_bucket)"
# the plan of a class on any pool: the $pool selection must not make a class look unplanned
ANY_PLAN = (
    'class_load:specguard_plan_info:max{job=~"$job",task_type=~"$task_type",'
    'temperature_bucket=~"$temperature_bucket",load_bucket=~"$load_bucket"} == 1'
)


def test_the_job_variable_lists_every_specguard_process_the_decider_too():
    (job,) = [v for v in DASH["templating"]["list"] if v["name"] == "job"]
    assert job["query"]["query"] == "label_values(specguard_plan_version{}, job)"


@pytest.mark.parametrize("panel", [p for p in PANELS if p["type"] == "stat"], ids=lambda p: p["title"])
def test_stats_reduce_to_the_last_value(panel: dict):
    assert panel["options"]["reduceOptions"]["calcs"] == ["lastNotNull"]
