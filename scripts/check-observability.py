#!/usr/bin/env python3
"""Checks promtool cannot make on the shipped monitoring (run by check-observability.sh).

- Every `summaryd_*` name in the dashboard, the alert rules and their tests is a metric
  summaryd exports: one it promises to export (docs/reference.md, "Metrics"; listed below so
  the check does not depend on how that page is laid out) or one registered in src/. A typo
  there would otherwise be an empty panel or an alert that can never fire.
- The dashboard: JSON, a Prometheus data source variable that every panel and query uses,
  unique panel ids, panels inside the 24-column grid, and every query valid PromQL (checked
  by promtool as a recording rule, with the dashboard variables filled in).
- The rules: every alert has a `severity` of warning or critical and a summary and
  description, and has a unit test where it fires and one where it does not.
"""

import glob
import json
import re
import subprocess
import sys
import tempfile

import yaml

DASHBOARD = "deploy/grafana/summaryd.json"
RULES = "deploy/prometheus/summaryd-rules.yaml"
RULE_TESTS = "deploy/prometheus/tests/*.yaml"

# The metrics docs/reference.md ("Metrics") promises.
DOCUMENTED = {
    "summaryd_http_requests_total",
    "summaryd_idempotency_total",
    "summaryd_jobs_total",
    "summaryd_llm_requests_total",
    "summaryd_llm_request_duration_seconds",
    "summaryd_stream_pending",
    "summaryd_dead_letters",
    "summaryd_outbox_unsent",
    "summaryd_outbox_sent_total",
    "summaryd_stream_lag",
    "summaryd_oldest_queued_age_seconds",
    "summaryd_job_latency_seconds",
    "summaryd_http_request_duration_seconds",
    "summaryd_llm_tokens_total",
    "summaryd_llm_breaker_open",
    "summaryd_mail_breaker_open",
    "summaryd_loop_errors_total",
    "summaryd_gauges_refreshed_timestamp_seconds",
    "summaryd_maintenance_runs_total",
    "summaryd_maintenance_removed_total",
}
# Series a histogram exports besides its name.
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# What the dashboard's variables stand for when its queries are checked as PromQL.
VARIABLES = {"$__rate_interval": "5m", "$namespace": ".*", "$job": ".*"}

errors = []


def registered_in_source():
    names = set()
    for path in glob.glob("src/**/*.rs", recursive=True):
        with open(path, encoding="utf-8") as f:
            names.update(re.findall(r'"(summaryd_[a-z0-9_]+)"', f.read()))
    return names


def check_metric_names(path, text, known):
    for name in sorted(set(re.findall(r"\bsummaryd_[a-z0-9_]+", text))):
        base = name
        for suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in known:
                base = name[: -len(suffix)]
        if base not in known:
            errors.append(f"{path}: {name} is not a metric summaryd exports")


def dashboard_panels(dashboard):
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # panels inside a collapsed row


def check_dashboard(dashboard):
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        errors.append(f"{DASHBOARD}: needs a `datasource` variable of type datasource, query prometheus")
    for name in ("namespace", "job"):
        if name not in variables:
            errors.append(f"{DASHBOARD}: needs a `{name}` variable")
    seen_ids, queries = set(), []
    for panel in dashboard_panels(dashboard):
        where = f"{DASHBOARD}: panel {panel.get('id')} ({panel.get('title')!r})"
        if panel.get("id") in seen_ids:
            errors.append(f"{where}: duplicate id")
        seen_ids.add(panel.get("id"))
        grid = panel.get("gridPos", {})
        if grid.get("x", 0) + grid.get("w", 0) > 24 or grid.get("w", 0) <= 0:
            errors.append(f"{where}: outside the 24-column grid")
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets") or []
        if not targets:
            errors.append(f"{where}: no query")
        for source in [panel] + targets:
            if source.get("datasource", {}).get("uid") != "${datasource}":
                errors.append(f"{where}: data source is not ${{datasource}}")
        for target in targets:
            expr = target.get("expr", "")
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            if not expr.strip() or "$" in expr:
                errors.append(f"{where}: query {target.get('refId')} is empty or uses an unknown variable")
                continue
            queries.append((f"dashboard:panel_{panel['id']}_{target.get('refId', 'X')}", expr))
    return queries


def check_promql(queries):
    """promtool parses each query as the expression of a recording rule."""
    doc = {"groups": [{"name": "dashboard", "rules": [{"record": r, "expr": e} for r, e in queries]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(doc, f)
        f.flush()
        run = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
    if run.returncode != 0:
        errors.append(f"{DASHBOARD}: a query is not valid PromQL:\n{run.stdout}{run.stderr}")


def check_rules(rules, tests):
    firing, quiet = set(), set()
    for test_file in tests:
        for test in test_file.get("tests", []):
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case.get("alertname"))
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("alert")
            if name is None:
                continue
            if rule.get("labels", {}).get("severity") not in ("warning", "critical"):
                errors.append(f"{RULES}: {name}: severity must be warning or critical")
            annotations = rule.get("annotations", {})
            for key in ("summary", "description"):
                if not str(annotations.get(key, "")).strip():
                    errors.append(f"{RULES}: {name}: no {key} annotation")
            if name not in firing:
                errors.append(f"{RULES}: {name}: no unit test where it fires")
            if name not in quiet:
                errors.append(f"{RULES}: {name}: no unit test where it stays quiet")


def main():
    known = DOCUMENTED | registered_in_source()
    texts = {}
    for path in [DASHBOARD, RULES] + sorted(glob.glob(RULE_TESTS)):
        with open(path, encoding="utf-8") as f:
            texts[path] = f.read()
        check_metric_names(path, texts[path], known)
    try:
        dashboard = json.loads(texts[DASHBOARD])
    except json.JSONDecodeError as e:
        errors.append(f"{DASHBOARD}: not JSON: {e}")
    else:
        queries = check_dashboard(dashboard)
        if queries:
            check_promql(queries)
    rules = yaml.safe_load(texts[RULES])
    tests = [yaml.safe_load(texts[p]) for p in sorted(glob.glob(RULE_TESTS))]
    check_rules(rules, tests)
    for e in errors:
        print(f"check-observability: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
