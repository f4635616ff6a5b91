"""deploy/prometheus/aivedio-alerts.yaml as the Prometheus Operator's PrometheusRule.

The plain rule file is the one source; the PrometheusRule beside the kustomize component is
made from it. ``python -m tests.deploy.prometheusrule`` rewrites it; tests/deploy fails while
the two differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "aivedio-alerts.yaml"
WRAPPER = (
    ROOT / "deploy" / "kubernetes" / "components" / "prometheus-operator" / "prometheusrule.yaml"
)
HEADER = """\
# deploy/prometheus/aivedio-alerts.yaml as a PrometheusRule: made from it, do not edit here.
# After changing the rule file: python -m tests.deploy.prometheusrule (tests/deploy fails while
# the two differ). The release label is what a kube-prometheus-stack Prometheus selects by
# default; match your Prometheus's ruleSelector.
"""


def wrapper(rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "aivedio",
            "namespace": "aivedio",
            "labels": {"app.kubernetes.io/name": "aivedio", "release": "kube-prometheus-stack"},
        },
        "spec": rules,
    }


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # Items of a list indented under their key, as yamllint's default wants.
        super().increase_indent(flow, False)


def render() -> str:
    rules = yaml.safe_load(RULES.read_text())
    return HEADER + yaml.dump(wrapper(rules), Dumper=_Dumper, sort_keys=False, width=100)


if __name__ == "__main__":
    WRAPPER.write_text(render())
