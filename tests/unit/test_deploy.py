"""The Kubernetes deployment (deploy/helm/duetime and its rendering deploy/kubernetes) only uses
what duetime has: every ``duetime`` command line parses with the CLI's own parser, every
``DUETIME_*`` variable is in the registry of variables the code reads (infra/tools/envvars.py)
and each role's settings accept the values the manifests give, every port and probe points at a
port the pod serves, and the KEDA triggers name the execution topics and consumer groups the
workers use. README.md's Configuration table is checked against the same registry.

With a ``helm`` binary (on PATH, or ``go install helm.sh/helm/v3/cmd/helm@v3.16.3``), the
chart is linted and rendered, the checked-in rendering must equal a fresh one, and bad values
must fail the render with a message naming them; without one those tests skip, and the
checked-in rendering is still checked.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from duetime.cli import COMMANDS, build_parser
from duetime.consumers.projector.settings import ProjectorSettings
from duetime.consumers.resolver.settings import ResolverSettings
from duetime.consumers.worker.policy import secrets_from_environ
from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import Env
from duetime.core.kafka_properties import CALLBACKS, ENV_PREFIX, RESERVED, property_of
from duetime.core.topics import Topics, check_queue
from duetime.infra.tools.envvars import registry
from duetime.producers.api.settings import ApiSettings
from duetime.schedulers.settings import SchedulerSettings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "duetime"
KUBE = ROOT / "deploy" / "kubernetes"
RENDERED = KUBE / "duetime.yaml"
KUBE_VALUES = KUBE / "values.yaml"
CI_VALUES = CHART / "ci" / "pools-values.yaml"
RELEASE = "duetime"
# helm built with go install reports Kubernetes 1.20 to templates: render for a current one
KUBE_VERSION = ("--kube-version", "1.31.0")

Manifest = dict[str, Any]


def _helm() -> str | None:
    found = shutil.which("helm")
    if found:
        return found
    gobin = Path(os.environ.get("GOPATH") or Path.home() / "go") / "bin" / "helm"
    return str(gobin) if gobin.is_file() else None


HELM = _helm()
needs_helm = pytest.mark.skipif(HELM is None, reason="no helm binary (see the module docstring)")


def _render(*values: Path, namespace: str = "duetime") -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    args = [HELM, "template", RELEASE, str(CHART), "--namespace", namespace, *KUBE_VERSION]
    for path in values:
        args += ["--values", str(path)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def _load(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _rendered() -> list[Manifest]:
    return _load(RENDERED.read_text(encoding="utf-8"))


@functools.cache
def _ci_rendered() -> list[Manifest]:
    """The chart rendered with the CI values (once: each helm run takes about a second)."""
    done = _render(CI_VALUES)
    assert done.returncode == 0, done.stderr
    return _load(done.stdout)


def _of_kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [doc for doc in docs if doc["kind"] == kind]


def _pod_specs(docs: list[Manifest]) -> Iterator[tuple[str, Manifest]]:
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def _containers(spec: Manifest) -> list[Manifest]:
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def _secret_env_example() -> dict[str, str]:
    """What kustomize's secretGenerator puts in the Secret of the plain manifests."""
    env = {}
    for line in (KUBE / "secret.env.example").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, value = line.split("=", 1)
            env[name] = value
    return env


def _shared_env(docs: list[Manifest]) -> dict[str, str]:
    """The ConfigMap's and the Secret's variables: what envFrom gives every pod (the plain
    manifests' Secret comes from secret.env, whose example stands in for it)."""
    env: dict[str, str] = {}
    secrets = [doc for doc in docs if doc["kind"] == "Secret"]
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            env |= {k: str(v) for k, v in doc["data"].items()}
    for doc in secrets:
        env |= {k: str(v) for k, v in doc["stringData"].items()}
    if not secrets:
        env |= _secret_env_example()
    return env


def _environment(docs: list[Manifest], container: Manifest) -> dict[str, str]:
    env = _shared_env(docs)
    for item in container.get("env", []):
        # a downward-API value (the pod's name) stands in as a plausible instance id
        env[item["name"]] = str(item.get("value", "pod-name-7d9f8"))
    return env


def _variable_problem(name: str) -> str | None:
    if name.startswith("OTEL_"):
        return None  # OpenTelemetry's standard variables: its SDK reads them (core/tracing.py)
    known = registry()
    if not known.knows(name):
        return f"{name} is read nowhere in duetime"
    if known.family_of(name) == ENV_PREFIX:
        prop = property_of(name)  # raises naming the variable when it is no property name
        if prop in RESERVED or prop in CALLBACKS:
            return f"{name} sets {prop}, which duetime refuses"
    return None


# --- always: the chart's own files and the checked-in rendering ------------------------------


def test_chart_and_values_parse() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "duetime"
    for path in (CHART / "values.yaml", CI_VALUES, KUBE_VALUES):
        assert isinstance(yaml.safe_load(path.read_text()), dict), path
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (KUBE / resource).is_file(), resource


def test_every_role_and_pool_is_deployed() -> None:
    docs = _rendered()
    names = {doc["metadata"]["name"] for doc in _of_kind(docs, "Deployment")}
    for role in ("scheduler", "projector", "resolver", "api", "worker-default"):
        assert f"{RELEASE}-{role}" in names
    (job,) = _of_kind(docs, "Job")
    steps = [c["args"][:3] for c in _containers(job["spec"]["template"]["spec"])]
    assert steps[0] == ["duetime", "topics", "create"] and steps[-1] == ["duetime", "db", "migrate"]
    assert {doc["metadata"]["name"] for doc in _of_kind(docs, "ScaledObject")} == {
        f"{RELEASE}-worker-default"
    }


@pytest.mark.parametrize("source", ["rendered", "ci"])
def test_every_command_exists_in_the_cli(source: str) -> None:
    if source == "ci" and HELM is None:
        pytest.skip("no helm binary")
    docs = _rendered() if source == "rendered" else _ci_rendered()
    parser = build_parser()
    seen = 0
    for name, spec in _pod_specs(docs):
        for container in _containers(spec):
            words = list(container.get("command", [])) + list(container["args"])
            assert words[0] == "duetime", f"{name}/{container['name']} runs {words[0]!r}"
            assert words[1] in COMMANDS, f"{name}: unknown command {words[1]!r}"
            parser.parse_args(words[1:])  # exits (fails the test) on an unknown argument
            seen += 1
    assert seen >= 7


@pytest.mark.parametrize("source", ["rendered", "ci"])
def test_every_variable_exists(source: str) -> None:
    if source == "ci" and HELM is None:
        pytest.skip("no helm binary")
    docs = _rendered() if source == "rendered" else _ci_rendered()
    names = set(_shared_env(docs))
    for _, spec in _pod_specs(docs):
        for container in _containers(spec):
            names |= {item["name"] for item in container.get("env", [])}
    assert {"DUETIME_KAFKA_BOOTSTRAP", "DUETIME_DATABASE_URL", "DUETIME_METRICS_PORT"} <= names
    problems = [p for p in map(_variable_problem, sorted(names)) if p]
    assert not problems, problems


def _role_of(args: list[str]) -> str:
    return args[1]


@pytest.mark.parametrize("source", ["rendered", "ci"])
def test_each_role_accepts_its_environment(source: str) -> None:
    """Values, not only names: each role's settings are built from exactly the environment
    its pod gets, as the role's ``main`` builds them (a bad value raises, naming it)."""
    if source == "ci" and HELM is None:
        pytest.skip("no helm binary")
    docs = _rendered() if source == "rendered" else _ci_rendered()
    for doc in _of_kind(docs, "Deployment"):
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        env = _environment(docs, container)
        role = _role_of(container["args"])
        if role == "scheduler":
            SchedulerSettings.from_env(Env(env))
        elif role == "worker":
            settings = WorkerSettings.from_env(Env(env), secrets=secrets_from_environ(env))
            grace = doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            assert grace > settings.shutdown_s, "SIGKILL before the worker's own shutdown ends"
        elif role == "projector":
            ProjectorSettings.from_env(Env(env))
        elif role == "resolver":
            ResolverSettings.from_env(Env(env))
        else:
            assert role == "api"
            api = ApiSettings.from_env(Env({**env, "DUETIME_API_HOST": "0.0.0.0"}))
            api.check_exposure()  # tokens, or the explicit opt-out: else it would not listen
            assert api.workers == 1, "only a single-process API serves the metrics port"


@pytest.mark.parametrize("source", ["rendered", "ci"])
def test_ports_and_probes_point_at_what_the_pod_serves(source: str) -> None:
    if source == "ci" and HELM is None:
        pytest.skip("no helm binary")
    docs = _rendered() if source == "rendered" else _ci_rendered()
    metrics_port = int(_shared_env(docs)["DUETIME_METRICS_PORT"])
    served: dict[str, dict[str, int]] = {}
    for doc in _of_kind(docs, "Deployment"):
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == metrics_port
        args = container["args"]
        if args[1] == "api":
            # the API listens where its --port says; /healthz and /readyz are its probe routes
            assert ports["http"] == int(args[args.index("--port") + 1])
            assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
            assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        else:
            # every other role serves only Prometheus' exposition on the metrics port
            assert container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
        served[doc["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]] = ports
    for service in _of_kind(docs, "Service"):
        component = service["spec"]["selector"]["app.kubernetes.io/component"]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in served[component], (service["metadata"]["name"], port)


def _api_routes() -> set[str]:
    text = (ROOT / "producers" / "api" / "app.py").read_text(encoding="utf-8")
    return set(re.findall(r"@app\.get\(\s*\"([^\"]+)\"", text))


def test_the_api_probes_are_routes_of_the_api() -> None:
    assert {"/healthz", "/readyz"} <= _api_routes()


def _pool_env(docs: list[Manifest], pool: str) -> dict[str, str]:
    (deployment,) = [
        d for d in _of_kind(docs, "Deployment") if d["metadata"]["name"] == f"{RELEASE}-{pool}"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return _environment(docs, container)


def _expected_topics(prefix: str, queues: str) -> set[str]:
    """The execution topics of a pool's queues, as the workers and the scheduler name them
    (each queue name must be one the queues accept)."""
    return {
        t for queue in queues.split(",") for t in Topics(prefix).executions_of(check_queue(queue))
    }


@pytest.mark.parametrize("source", ["rendered", "ci"])
def test_keda_scales_each_pool_on_its_own_topics_and_group(source: str) -> None:
    if source == "ci" and HELM is None:
        pytest.skip("no helm binary")
    docs = _rendered() if source == "rendered" else _ci_rendered()
    shared = _shared_env(docs)
    prefix = shared["DUETIME_TOPIC_PREFIX"]
    partitions = int(shared["DUETIME_PARTITIONS"])
    scaled = _of_kind(docs, "ScaledObject")
    assert scaled
    for obj in scaled:
        target = obj["spec"]["scaleTargetRef"]["name"]
        env = _pool_env(docs, target.removeprefix(f"{RELEASE}-"))
        group = env.get("DUETIME_WORKER_GROUP", f"{prefix}workers")
        triggers = obj["spec"]["triggers"]
        assert {t["type"] for t in triggers} == {"kafka"}
        assert {t["metadata"]["consumerGroup"] for t in triggers} == {group}
        assert {t["metadata"]["bootstrapServers"] for t in triggers} == {
            shared["DUETIME_KAFKA_BOOTSTRAP"]
        }
        topics = [t["metadata"]["topic"] for t in triggers]
        assert len(topics) == len(set(topics))
        assert set(topics) == _expected_topics(prefix, env.get("DUETIME_WORKER_QUEUES", "default"))
        # scaling to zero would break the 5 s start promise; beyond the partitions, idle pods
        assert 1 <= obj["spec"]["minReplicaCount"] <= obj["spec"]["maxReplicaCount"] <= partitions


def test_the_ci_values_have_a_second_pool_with_its_own_queues() -> None:
    # the second pool is what exercises the queue topics, the group and the queue creation
    if HELM is None:
        pytest.skip("no helm binary")
    docs = _ci_rendered()
    env = _pool_env(docs, "worker-billing")
    assert env["DUETIME_WORKER_QUEUES"] == "billing,invoices"
    (job,) = _of_kind(docs, "Job")
    created = [c["args"] for c in _containers(job["spec"]["template"]["spec"])]
    assert ["duetime", "queues", "create", "billing"] in created
    assert ["duetime", "queues", "create", "invoices"] in created


# --- with helm: lint, render, refuse bad values ---------------------------------------------


@needs_helm
def test_helm_lint() -> None:
    assert HELM is not None
    for values in (CI_VALUES, KUBE_VALUES):
        done = subprocess.run(
            [HELM, "lint", "--strict", str(CHART), "--values", str(values)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


@needs_helm
def test_the_checked_in_rendering_is_the_charts() -> None:
    done = _render(KUBE_VALUES)
    assert done.returncode == 0, done.stderr
    assert _load(done.stdout) == _rendered(), (
        "deploy/kubernetes/duetime.yaml is stale: run deploy/kubernetes/render.sh"
    )


@needs_helm
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("database:\n  url: ''\n", "database.url is required"),
        ("api:\n  tokens: ''\n", "api.tokens is required"),
        ("topicPrefix: 'a b'\n", "topicPrefix"),
        ("workers:\n  pools:\n    - {name: Bad_Name, queues: [default]}\n", "DNS label"),
        (
            "workers:\n  pools:\n    - name: p\n      queues: ['x.y']\n"
            "      autoscaling: {minReplicas: 1, maxReplicas: 2}\n",
            "must match",
        ),
        (
            "workers:\n  pools:\n    - name: p\n      queues: [default]\n"
            "      autoscaling: {minReplicas: 1, maxReplicas: 13}\n",
            "exceeds the 12 partitions",
        ),
        (
            "workers:\n  pools:\n    - name: p\n      queues: []\n"
            "      autoscaling: {minReplicas: 1, maxReplicas: 2}\n",
            "queues may not be empty",
        ),
    ],
)
def test_bad_values_fail_the_render_naming_them(
    tmp_path: Path, override: str, message: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(override)
    done = _render(CI_VALUES, bad)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


# --- README.md's Configuration table and the registry ---------------------------------------


def _readme_variables() -> set[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`(DUETIME_[A-Z0-9_<>]+)`", line.split("|")[1]))
    return names


def test_readme_configuration_names_only_variables_duetime_reads() -> None:
    names = _readme_variables()
    assert len(names) > 50
    # a family is written with a placeholder: DUETIME_SECRET_<NAME>
    unknown = [n for n in names if not registry().knows(re.sub(r"<[A-Z]+>$", "X", n))]
    assert not unknown, f"README.md documents variables nothing reads: {unknown}"


def test_every_variable_duetime_reads_is_documented() -> None:
    docs = (ROOT / "README.md").read_text(encoding="utf-8") + (
        ROOT / "docs" / "kafka-security.md"
    ).read_text(encoding="utf-8")
    missing = sorted(name for name in registry().variables if f"`{name}" not in docs)
    assert not missing, f"add these to README.md's Configuration table: {missing}"
