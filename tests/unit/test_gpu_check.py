"""`make gpu-check` (utils.course.gpu_check): on a GPU it runs every GPU section and reports what ran; without one it
says so, writes the JSON, and exits 2 (nothing checked is never reported as passed)."""

import json

import pytest

from utils.core import env, sections
from utils.course import gpu_check


def test_every_gpu_section_is_covered():
    covered = [s for ids in gpu_check.gpu_sections().values() for s in ids]
    assert sorted(covered) == sorted(s for s, (cap, _) in sections.OPTIONAL_SECTIONS.items()
                                     if cap in gpu_check.GPU_CAPABILITIES)
    assert "06.gpu-sweep" in covered and "04.tensorrt" in covered


@pytest.mark.skipif(env.has("cuda"), reason="this machine has a GPU: `make gpu-check` runs for real there")
def test_without_a_gpu_it_exits_2_and_says_why(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path))
    assert gpu_check.main([]) == 2
    out = capsys.readouterr().out
    assert "nothing to check: gpu-check needs a CUDA GPU" in out and env.capabilities()["cuda"].reason in out
    doc = json.loads((tmp_path / "results" / "gpu_check.json").read_text())
    assert {e["status"] for e in doc["sections"].values()} == {"skipped"}
    assert doc["device"]["capabilities"]["cuda"]["available"] is False


def test_summary_reads_what_each_lesson_recorded():
    lessons = {
        "02_graphs": {"ok": True, "seconds": 30, "error": None,
                      "results": {"ran": ["02.cuda-graphs"], "skipped": {}, "metrics": {"cuda_graph_speedup": 2.5}}},
        "04_onnx_tensorrt": {"ok": True, "seconds": 50, "error": None,
                             "results": {"ran": ["04.ort-cuda"], "skipped": {"04.tensorrt": "needs tensorrt: absent"},
                                         "metrics": {}}},
        "06_fused_softmax": {"ok": False, "seconds": 9, "error": "06_fused_softmax.ipynb failed in cell 45\nmore",
                             "results": {"ran": ["06.cuda-compile-check"], "skipped": {}, "metrics": {}}},
    }
    doc = gpu_check.summarize({"gpu": "test"}, None, lessons)
    s = doc["sections"]
    assert s["02.cuda-graphs"]["status"] == "ran"
    assert s["04.tensorrt"] == {"status": "skipped", "detail": "needs tensorrt: absent"}
    assert s["06.cuda-kernel"] == {"status": "failed", "detail": "06_fused_softmax.ipynb failed in cell 45"}
    assert s["06.cuda-compile-check"]["status"] == "ran, lesson failed"
    assert s["00.gpu-probe"]["status"] == "not run"
    assert doc["key_numbers"]["02_graphs.cuda_graph_speedup"]["value"] == 2.5
    assert doc["failed"] == ["06_fused_softmax"]


def test_run_tests_counts_passes_failures_and_skip_reasons(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("import pytest\n\ndef test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2, 'wrong'\n\n"
                     "@pytest.mark.skip(reason='needs a CUDA GPU')\ndef test_gpu():\n    pass\n")
    out = gpu_check.run_tests(tmp_path, files=[str(probe), "-o", "addopts=", "-p", "no:nbval"], timeout=300)
    assert out["passed"] == 1
    assert len(out["failed"]) == 1 and "test_bad" in out["failed"][0]
    assert list(out["skipped"].values()) == ["needs a CUDA GPU"]
