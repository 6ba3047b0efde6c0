"""deploy/grafana/llm-platform.json reads only metrics the platform and the replicas export."""
import json
import re
from pathlib import Path

from inference import metrics as admission
from inference.observability.families import ALL, COUNTER
from inference.routing_stats import COUNTERS as ROUTER_COUNTERS
from replica.backend import vllm_metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "llm-platform.json"
ADMISSION = {admission.QUEUE_DEPTH, admission.SLOTS_IN_USE, admission.REJECTED,
             admission.WAIT_SECONDS + "_bucket"}


def exported() -> set[str]:
    names = set(ADMISSION) | {name for name, _ in ROUTER_COUNTERS.values()}
    for family in ALL:
        if family.kind == COUNTER:
            names.add(family.name + "_total")
        else:
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    for value in vars(vllm_metrics).values():
        if isinstance(value, str) and value.startswith("vllm:"):
            names |= {value, value + "_bucket", value + "_sum", value + "_count"}
    return names


def test_every_query_reads_an_exported_metric():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    used = {name for expr in exprs for name in re.findall(r"\b(?:llmp_|vllm:)[a-z0-9_:]+", expr)}
    assert used and used <= exported(), used - exported()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "llm-platform"
