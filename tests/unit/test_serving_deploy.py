"""utils.serving.deploy (lesson 05): replicas from measured throughput, and the Kubernetes manifest of a repository
validated against the bundled Kubernetes schema."""

import copy

import pytest

pytest.importorskip("tritonclient", reason="the manifest reads the repository's configs through Triton's schema")

from utils.serving import deploy as td
from utils.serving import repository as tr


@pytest.mark.parametrize("target, per_replica, utilization, want", [
    (2000, 300, 0.7, 10), (2000, 300, 1.0, 7), (10, 300, 0.7, 1), (600, 300, 1.0, 2), (601, 300, 1.0, 3),
])
def test_replicas_needed(target, per_replica, utilization, want):
    assert td.replicas_needed(target, per_replica, utilization=utilization) == want


@pytest.mark.parametrize("kwargs, message", [
    (dict(target_rps=0, rps_per_replica=1), "target_rps"), (dict(target_rps=1, rps_per_replica=-3), "rps_per_replica"),
    (dict(target_rps=1, rps_per_replica=float("nan")), "rps_per_replica"),
    (dict(target_rps=1, rps_per_replica=1, utilization=1.5), "utilization"),
])
def test_replicas_needed_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        td.replicas_needed(**kwargs)


@pytest.fixture
def repo(tmp_path, assets):
    onnx, tok, clf = assets
    tr.build_pipeline(tmp_path / "repo", onnx_path=onnx, tokenizer_json=tok, classifiers={1: clf}, num_classes=3)
    return tmp_path / "repo"


def test_repository_digest_follows_content(repo):
    first = td.repository_digest(repo)
    assert first == td.repository_digest(repo) and len(first) == 12
    (repo / "encoder" / "config.pbtxt").write_text((repo / "encoder" / "config.pbtxt").read_text() + "\n")
    assert td.repository_digest(repo) != first
    with pytest.raises(FileNotFoundError):
        td.repository_digest(repo / "missing")


def test_manifest_is_valid_and_says_what_the_repository_needs(repo):
    pytest.importorskip("kubernetes_validate")
    docs = td.k8s_manifest(repo, name="ens", replicas=3, cpu=2, memory_mib=700.2, image="img:1", startup_seconds=42,
                           shm_mib=64, server_args=["--disable-auto-complete-config"])
    deployment, service = docs
    assert td.validate_manifest(docs) == ["Deployment/ens", "Service/ens"]
    assert td.validate_manifest(td.to_yaml(docs)) == ["Deployment/ens", "Service/ens"]  # the YAML text too
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert deployment["spec"]["replicas"] == 3
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 42
    assert container["resources"]["requests"] == container["resources"]["limits"] == {"cpu": "2000m",
                                                                                      "memory": "765Mi"}
    assert "--model-control-mode=none" in container["args"] and "--disable-auto-complete-config" in container["args"]
    assert pod["metadata"]["annotations"]["workbook/models"] == "encoder,ensemble,postprocess,preprocess"
    assert pod["metadata"]["labels"]["workbook/repository-digest"] == td.repository_digest(repo)
    assert service["spec"]["type"] == "ClusterIP" and service["spec"]["selector"] == deployment["spec"]["selector"][
        "matchLabels"]
    assert pod["spec"]["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Mi"}  # inside the limit
    assert "&id" not in td.to_yaml(docs)  # no YAML anchors: each mapping written out


@pytest.mark.parametrize("path, value, message", [
    (("spec", "template", "spec", "containers", 0, "readinessProbe", "httpGet", "paht"), "/x", "paht"),
    (("spec", "replicas"), "three", "replicas"),
    (("spec", "template", "spec", "containers", 0, "ports", 0, "containerPort"), "8000", "containerPort"),
])
def test_validate_rejects_a_broken_manifest_naming_the_field(repo, path, value, message):
    pytest.importorskip("kubernetes_validate")
    docs = copy.deepcopy(td.k8s_manifest(repo, name="ens", replicas=1, cpu=1, memory_mib=100, image="img:1"))
    target = docs[0]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError, match=message):
        td.validate_manifest(docs)


def test_manifest_bad_input(repo, tmp_path):
    with pytest.raises(ValueError, match="replicas"):
        td.k8s_manifest(repo, name="e", replicas=0, cpu=1, memory_mib=1, image="i")
    with pytest.raises(ValueError, match="cpu"):
        td.k8s_manifest(repo, name="e", replicas=1, cpu=0, memory_mib=1, image="i")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no model"):
        td.k8s_manifest(tmp_path / "empty", name="e", replicas=1, cpu=1, memory_mib=1, image="i")
    pytest.importorskip("kubernetes_validate")
    with pytest.raises(ValueError, match="apiVersion and kind"):
        td.validate_manifest([{"metadata": {}}])


def test_deployed_image_is_not_the_local_affected_release():
    # the local server (2.51 = NGC 24.10) predates the 25.07 fixes of the August 2025 bulletin; the image a team
    # deploys must be a release from 25.07 on, named by an explicit YY.MM tag
    tag = td.TRITON_IMAGE.rsplit(":", 1)[1]
    year, month = (int(x) for x in tag.split("-")[0].split("."))
    assert td.TRITON_IMAGE.startswith("nvcr.io/nvidia/tritonserver:") and (year, month) >= (25, 7)
    assert "24.10" in td.LOCAL_TRITON and "24.10" not in td.TRITON_IMAGE


def test_manifest_for_the_native_onnxruntime_encoder(tmp_path, assets):
    pytest.importorskip("kubernetes_validate")
    onnx, tok, clf = assets
    tr.build_pipeline(tmp_path / "repo", onnx_path=onnx, tokenizer_json=tok, classifiers={1: clf}, num_classes=3,
                      encoder_platform=True, encoder_instances=2, intra_op_threads=1, allow_spinning=False)
    text = (tmp_path / "repo" / "encoder" / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in text
    # the container runs the measured layout: 2 instances x 1 ONNX Runtime thread, under the backend's own key
    enc = tr.read_config(tmp_path / "repo" / "encoder")
    assert enc.instance_group[0].count == 2 and enc.parameters["intra_op_thread_count"].string_value == "1"
    docs = td.k8s_manifest(tmp_path / "repo", name="ens", replicas=1, cpu=1, memory_mib=100, image=td.TRITON_IMAGE)
    assert td.validate_manifest(docs) == ["Deployment/ens", "Service/ens"]
