"""The dashboard (docs/grafana-shadow.json) against what /metrics exposes: every name a panel uses
exists, every target is filtered by ``$instance`` and keeps ``instance`` apart (serve and proxy
scraped together draw apart, never summed), each panel's unit is the unit of what it plots, and the
families that matter each have a panel. (``test_prometheus.py`` evaluates every expression in a real
Prometheus.)"""

from __future__ import annotations

import json
import re

import pytest

from shadow.adapters.metrics import NAMES
from tests.conftest import REPO

DASHBOARD = json.loads((REPO / "docs" / "grafana-shadow.json").read_text(encoding="utf-8"))
PROCESS = {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
           "process_open_fds", "process_start_time_seconds", "process_max_fds"}
MATTERS = ("shadow_chunks_total", "shadow_question_seconds", "shadow_questions_total",
           "shadow_proxy_render_mismatches_total", "shadow_behind_at_turn_start_tokens", "shadow_chunk_seconds",
           "shadow_parks_total", "shadow_restores_total", "shadow_parked_files_refused_total",
           "shadow_backlog_tokens", "shadow_model_loaded", "shadow_model_info", "shadow_proxy_not_followed_total",
           "shadow_narrator_skipped_total", "shadow_host_requests", "shadow_sessions_forgotten_total")


def unit_of(expr: str) -> str:
    """The unit what ``expr`` computes is in, by the rules of the metric names (Prometheus' own)."""
    if expr.startswith("histogram_quantile"):
        return "s" if "_seconds_bucket" in expr else "short"
    if "_bucket" in expr and " / " in expr:
        return "percentunit"  # a share of observations
    if "rate(" in expr and re.search(r"_seconds_(sum|total)\{", expr):
        return "percentunit"  # seconds per second: a share of the device's (or a core's) time
    if "increase(" in expr:
        return "short"  # a count over the range
    if "rate(" in expr:
        return "cps"  # events per second
    if re.search(r"_bytes\{", expr):
        return "bytes"
    if re.search(r"shadow_model_(info|loaded)\{", expr):
        return "none"
    return "short"


def families(expr: str) -> set[str]:
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"\b(?:shadow|process)_\w+", expr)}


def test_every_panel_plots_exposed_names_per_instance_in_its_unit() -> None:
    names = set(NAMES) | PROCESS
    assert [v["name"] for v in DASHBOARD["templating"]["list"]] == ["datasource", "instance"]
    for panel in DASHBOARD["panels"]:
        unit = panel["fieldConfig"]["defaults"]["unit"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert families(expr) <= names, (panel["title"], families(expr) - names)
            assert expr.count('instance=~"$instance"') == expr.count("{"), (panel["title"], expr)
            if expr.startswith("sum by") or expr.startswith("histogram_quantile"):
                # summed, but never over instances (unless the panel is one instant table of reasons)
                assert "instance" in expr.split(")")[0] or panel["type"] == "bargauge", (panel["title"], expr)
            assert unit_of(expr) == unit, (panel["title"], expr, unit)
            assert "[$__range]" not in expr or panel["type"] != "timeseries", panel["title"]


def test_the_families_that_matter_each_have_a_panel_and_device_share_counts_once() -> None:
    used = {f for p in DASHBOARD["panels"] for t in p["targets"] for f in families(t["expr"])}
    assert set(MATTERS) <= used, set(MATTERS) - used
    [device] = [p for p in DASHBOARD["panels"] if p["title"].startswith("Device share")]
    exprs = [t["expr"] for t in device["targets"]]
    # the narrator's chunks are in its seconds (with its fork): the chunk seconds leave its window out
    assert any('window!="narrator"' in e for e in exprs) and any("shadow_narrator_seconds_total" in e for e in exprs)


def test_refusal_reasons_exist_at_zero_and_the_buckets_resolve_half_a_ms_to_50_ms(
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from prometheus_client.parser import text_string_to_metric_families

    from shadow.adapters.metrics import Metrics
    from shadow.adapters.metrics_more import REFUSAL_REASONS
    from shadow.backends.stores import disk

    assert set(REFUSAL_REASONS) == {r for _, r in disk.REASONS} | {"other"}
    m = Metrics(512, 1 << 30, {"model": "m", "dtype": "bfloat16", "device": "auto", "version": "v"})
    fams = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    # on 1392d56 the refused-files panel said "No data" until the first refusal
    refused = {s.labels["reason"]: s.value for s in fams["shadow_parked_files_refused"].samples}
    assert refused == dict.fromkeys(REFUSAL_REASONS, 0.0)
    for name in ("shadow_chunk_seconds", "shadow_question_seconds"):
        bounds = {float(s.labels["le"]) for s in fams[name].samples if s.name.endswith("_bucket")}
        inside = sorted(b for b in bounds if 0.0005 <= b <= 0.05)
        assert len(inside) >= 12 and inside[0] == 0.0005 and inside[-1] == 0.05, (name, inside)
        # a GPU chunk of 1.5 to 6.6 ms lands in one of several buckets, not in one or two
        assert len([b for b in bounds if 0.0015 <= b <= 0.0066]) >= 5
    [info] = fams["shadow_model_info"].samples
    assert info.labels == {"model": "m", "weights_hash": "", "grid": "512", "dtype": "bfloat16", "device": "auto",
                           "kernel": "", "version": "v"} and info.value == 1
    assert "process_resident_memory_bytes" in fams
    # a render mismatch is logged, at most once a minute, saying how many the line stands for
    with caplog.at_level(logging.WARNING, logger="shadow.proxy"):
        for _ in range(3):
            m.render_mismatch()
    lines = [r.getMessage() for r in caplog.records if r.name == "shadow.proxy"]
    assert len(lines) == 1 and "rendered prompt differed" in lines[0] and "(1 since the last such line)" in lines[0]
    assert m.value("shadow_proxy_render_mismatches_total") == 3
