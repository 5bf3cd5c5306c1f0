"""Scale-out on paper: replicas from measured throughput, and a Kubernetes manifest for a model repository (lesson 05).

No cluster is started. ``replicas_needed`` turns one replica's measured capacity into a replica count for a target
load; ``k8s_manifest`` writes the Deployment and Service a team would apply to serve a repository with a Triton
container; ``validate_manifest`` checks every document against the Kubernetes OpenAPI schema bundled in the
``kubernetes-validate`` package (offline: nothing is downloaded).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from utils.serving import repository

__all__ = [
    "LOCAL_TRITON",
    "TRITON_IMAGE",
    "PORTS",
    "replicas_needed",
    "repository_digest",
    "k8s_manifest",
    "to_yaml",
    "validate_manifest",
]

# Two different servers, not to be confused:
# - LOCAL_TRITON: the tritonserver binary bundled in the nvidia-pytriton wheel this course runs on 127.0.0.1. It is
#   Triton 2.51 (NGC 24.10), affected by NVIDIA's August 2025 bulletin (CVE-2025-23310/23311, a stack overflow from a
#   chunked HTTP request; the CVE-2025-23319/23320/23334 chain in the Python backend; all fixed in 25.07) and by later
#   bulletins. The lesson keeps it on loopback, where only this machine can reach it.
# - TRITON_IMAGE: the image a team deploys. Pick it from NVIDIA's security bulletins (nvidia.com/security) and the
#   Triton release notes (docs.nvidia.com/deeplearning/triton-inference-server/release-notes): the newest release that
#   fixes every published bulletin. 26.10 is the newest release whose notes were confirmed when this was written
#   (November 2026); check again before deploying, and pin the image by digest (@sha256:..., from
#   `docker buildx imagetools inspect <image>`) so the bytes you tested are the bytes that run.
LOCAL_TRITON = "tritonserver 2.51 (NGC 24.10), bundled in nvidia-pytriton 0.7.0"
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.10-py3"
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}


def replicas_needed(target_rps: float, rps_per_replica: float, *, utilization: float = 0.7) -> int:
    """Replicas that serve `target_rps` when each one runs at `utilization` of its measured capacity (lesson 05).

    rps_per_replica is a throughput measured with the p95 within budget; running each replica below it (0.7 = 30%
    headroom) keeps the tail latency there when traffic bursts or a replica is lost.
    """
    for name, value in (("target_rps", target_rps), ("rps_per_replica", rps_per_replica)):
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a positive number of requests per second, got {value!r}")
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization!r}")
    return max(1, math.ceil(target_rps / (rps_per_replica * utilization)))


def repository_digest(repo: str | os.PathLike) -> str:
    """A short sha256 over every file of a model repository (links followed): names the image that bakes it in."""
    repo = Path(repo)
    if not repo.is_dir():
        raise FileNotFoundError(f"model repository {repo} is not a folder")
    h = hashlib.sha256()
    for path in sorted(p for p in repo.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(repo)).encode() + b"\0")
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:12]


def _quantity_mi(mebibytes: float) -> str:
    return f"{max(1, math.ceil(mebibytes))}Mi"


def k8s_manifest(
    repo: str | os.PathLike,
    *,
    name: str,
    replicas: int,
    cpu: float,
    memory_mib: float,
    image: str,
    shm_mib: int = 256,
    startup_seconds: float = 60.0,
    server_args: Sequence[str] = (),
) -> list[dict]:
    """A Deployment and a Service serving the model repository `repo` with Triton (lesson 05).

    The repository is expected inside `image` at /models (an image built FROM TRITON_IMAGE with the repository copied
    in, tagged by repository_digest). Read from the repository: the models served (pod annotation) and its digest
    (label, so a changed repository rolls the pods). Resources: `cpu` cores and `memory_mib` for the processes plus
    `shm_mib` for /dev/shm (a memory-backed volume counts against the limit) per replica, requests equal to limits (a
    Guaranteed pod, so a replica gets the cores its throughput was measured with). Readiness:
    /v2/health/ready, true once every model loaded; liveness: /v2/health/live; a startup probe allows
    `startup_seconds` to load. /dev/shm is a memory volume: the Python backend moves tensors through shared memory.
    """
    configs = repository.repository_configs(repo)
    if not configs:
        raise ValueError(f"model repository {repo} holds no model (no <model>/config.pbtxt)")
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a positive int, got {replicas!r}")
    if not cpu > 0 or not memory_mib > 0:
        raise ValueError(f"cpu and memory_mib must be positive, got cpu={cpu!r}, memory_mib={memory_mib!r}")
    digest = repository_digest(repo)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "triton"}
    resources = {"cpu": f"{math.ceil(cpu * 1000)}m", "memory": _quantity_mi(memory_mib + shm_mib)}

    def probe(path: str, period: int, failures: int) -> dict:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures}

    container = {
        "name": "tritonserver",
        "image": image,
        "args": ["tritonserver", "--model-repository=/models", "--model-control-mode=none",
                 *(f"--{k}-port={v}" for k, v in PORTS.items()), *server_args],
        "ports": [{"name": k, "containerPort": v, "protocol": "TCP"} for k, v in PORTS.items()],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "startupProbe": probe("/v2/health/ready", 5, max(1, math.ceil(startup_seconds / 5))),
        "readinessProbe": probe("/v2/health/ready", 5, 3),
        "livenessProbe": probe("/v2/health/live", 10, 3),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 1000},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {**labels, "workbook/repository-digest": digest}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": {**labels, "workbook/repository-digest": digest},
                             "annotations": {"workbook/models": ",".join(sorted(configs))}},
                "spec": {
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_mib}Mi"}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"type": "ClusterIP", "selector": dict(labels),
                 "ports": [{"name": k, "port": v, "targetPort": k, "protocol": "TCP"} for k, v in PORTS.items()]},
    }
    return [deployment, service]


def to_yaml(documents: Sequence[Mapping]) -> str:
    """The manifest as one multi-document YAML text, as `kubectl apply -f` reads it (lesson 05)."""
    import yaml

    return yaml.safe_dump_all([dict(d) for d in documents], sort_keys=False)


def validate_manifest(documents: Sequence[Mapping] | str, k8s_version: str | None = None) -> list[str]:
    """Validate each document against the Kubernetes schema (strict: unknown fields fail) (lesson 05).

    documents: dicts or a YAML text. k8s_version: e.g. "1.33"; None = the newest the installed kubernetes-validate
    bundles. Returns ["Deployment/name", ...] when all are valid; raises ValueError naming the document, the field
    path and the schema's complaint otherwise.
    """
    import kubernetes_validate
    import yaml
    from kubernetes_validate.utils import latest_version

    if isinstance(documents, str):
        documents = [d for d in yaml.safe_load_all(documents) if d is not None]
    version = k8s_version or latest_version()
    checked = []
    for i, doc in enumerate(documents):
        if not isinstance(doc, Mapping) or "kind" not in doc or "apiVersion" not in doc:
            raise ValueError(f"document {i} is not a Kubernetes object (needs apiVersion and kind), got {doc!r:.80}")
        what = f"{doc['kind']}/{doc.get('metadata', {}).get('name', '?')}"
        try:
            kubernetes_validate.validate(dict(doc), version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path) or "(top level)"
            raise ValueError(f"{what} is not valid for Kubernetes {version}: at {path}: {exc.message}") from None
        except kubernetes_validate.SchemaNotFoundError as exc:
            raise ValueError(f"{what}: {exc.message}") from None
        checked.append(what)
    return checked
