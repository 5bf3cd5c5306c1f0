"""`make gpu-check` (utils.course.gpu_check): on a GPU it runs every GPU section and reports what ran; without one it
says so, writes the JSON, and exits 2 (nothing checked is never reported as passed)."""

import json
import os

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
        "02_graphs": {"ok": True, "seconds": 20, "error": None,  # part 1: no GPU section; part 2 ran it
                      "results": {"ran": [], "skipped": {}, "metrics": {}}},
        "02_jit_compilers": {"ok": True, "seconds": 30, "error": None,
                             "results": {"ran": ["02.cuda-graphs"], "skipped": {}, "metrics": {"cuda_graph_speedup": 2.5}}},
        "04_onnx_tensorrt": {"ok": True, "seconds": 50, "error": None,
                             "results": {"ran": ["04.ort-cuda"], "skipped": {}, "metrics": {}}},
        "04_porting": {"ok": True, "seconds": 40, "error": None,  # part 2 of lesson 04 holds the TensorRT sections
                       "results": {"ran": [], "skipped": {"04.tensorrt": "needs tensorrt: absent"},
                                   "metrics": {"trt_fp16_speedup_vs_eager": 3.0}}},
        "06_fused_softmax": {"ok": False, "seconds": 9, "error": "06_fused_softmax.ipynb failed in cell 45\nmore",
                             "results": {"ran": ["06.cuda-compile-check"], "skipped": {}, "metrics": {}}},
    }
    doc = gpu_check.summarize({"gpu": "test"}, None, lessons)
    s = doc["sections"]
    assert s["02.cuda-graphs"]["status"] == "ran"
    assert s["04.tensorrt"] == {"status": "skipped", "detail": "needs tensorrt: absent"}
    assert s["04.ort-cuda"]["status"] == "ran"  # part 1's section, read from part 1's results
    assert s["04.trt-plugin"]["status"] == "not run"  # neither part reached it
    assert doc["key_numbers"]["04_porting.trt_fp16_speedup_vs_eager"]["value"] == 3.0
    assert s["06.cuda-kernel"] == {"status": "failed", "detail": "06_fused_softmax.ipynb failed in cell 45"}
    assert s["06.cuda-compile-check"]["status"] == "ran, lesson failed"
    assert s["00.gpu-probe"]["status"] == "not run"
    assert doc["key_numbers"]["02_jit_compilers.cuda_graph_speedup"]["value"] == 2.5
    assert doc["failed"] == ["06_fused_softmax"]


def test_summary_finds_a_section_in_the_part_that_reached_it():
    part1 = {"ok": True, "seconds": 20, "error": None, "results": {"ran": ["05.triton"], "skipped": {}, "metrics": {}}}
    part2 = {"ok": True, "seconds": 40, "error": None,
             "results": {"ran": ["05.triton"], "skipped": {"05.gpu-instances": "needs cuda: absent"},
                         "metrics": {"gpu_throughput_rps_batching": 9.0}}}
    doc = gpu_check.summarize({"gpu": "test"}, None, {"05_triton_ensemble": part1, "05_triton_under_load": part2})
    assert doc["sections"]["05.gpu-instances"] == {"status": "skipped", "detail": "needs cuda: absent"}
    assert doc["key_numbers"]["05_triton_under_load.gpu_throughput_rps_batching"]["value"] == 9.0
    failed = {**part2, "ok": False, "error": "05_triton_under_load.ipynb failed in cell 9", "results": {}}
    doc = gpu_check.summarize({"gpu": "test"}, None, {"05_triton_ensemble": part1, "05_triton_under_load": failed})
    assert doc["sections"]["05.gpu-instances"] == {"status": "failed", "detail": "05_triton_under_load.ipynb failed in cell 9"}


def test_summary_reads_each_section_from_the_part_that_guards_it():
    # lesson 06 in parts: the CUDA sections are in 06_fused_softmax, the compiled Triton one in 06_gpu_kernels_triton
    ran = {"ran": ["06.cuda-compile-check", "06.cuda-kernel", "06.gpu-sweep"], "skipped": {}, "metrics": {}}
    lessons = {
        "06_fused_softmax": {"ok": True, "seconds": 60, "error": None, "results": ran},
        "06_gpu_kernels_triton": {"ok": True, "seconds": 30, "error": None,
                                  "results": {"ran": ["06.triton-interpreter", "06.triton-gpu"], "skipped": {},
                                              "metrics": {"triton_gpu_parity_max_abs_fp32": 2e-7}}},
        "06_numerics": {"ok": True, "seconds": 20, "error": None, "results": {"ran": [], "skipped": {}, "metrics": {}}},
    }
    doc = gpu_check.summarize({"gpu": "test"}, None, lessons)
    s = doc["sections"]
    assert {s[k]["status"] for k in ("06.cuda-compile-check", "06.cuda-kernel", "06.gpu-sweep", "06.triton-gpu")} == {"ran"}
    assert doc["key_numbers"]["06_gpu_kernels_triton.triton_gpu_parity_max_abs_fp32"]["value"] == 2e-7
    lessons["06_gpu_kernels_triton"].update(ok=False, error="06_gpu_kernels_triton.ipynb failed in cell 9\nmore",
                                            results={"ran": ["06.triton-interpreter"], "skipped": {}, "metrics": {}})
    s = gpu_check.summarize({"gpu": "test"}, None, lessons)["sections"]
    assert s["06.triton-gpu"] == {"status": "failed", "detail": "06_gpu_kernels_triton.ipynb failed in cell 9"}
    assert s["06.cuda-kernel"]["status"] == "ran"


def test_run_tests_counts_passes_failures_and_skip_reasons(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("import pytest\n\ndef test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2, 'wrong'\n\n"
                     "@pytest.mark.skip(reason='needs a CUDA GPU')\ndef test_gpu():\n    pass\n")
    out = gpu_check.run_tests(tmp_path, files=[str(probe), "-o", "addopts=", "-p", "no:nbval"], timeout=300)
    assert out["passed"] == 1
    assert len(out["failed"]) == 1 and "test_bad" in out["failed"][0]
    assert list(out["skipped"].values()) == ["needs a CUDA GPU"]


# compute-sanitizer: captured in the formats its tools print (memcheck and racecheck, CUDA 12-13)
MEMCHECK_CLEAN = """\
========= COMPUTE-SANITIZER
.....................                                                    [100%]
21 passed in 96.10s (0:01:36)
========= ERROR SUMMARY: 0 errors
"""
MEMCHECK_OOB = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 16 bytes
=========     at void softmax_forward_block<float, 4>(const T1 *, T1 *, long)+0x2d0
=========     by thread (255,0,0) in block (3,0,0)
=========     Address 0x7f3a2c000ff0 is out of bounds
=========
========= Invalid __global__ read of size 16 bytes
=========     at void softmax_forward_block<float, 4>(const T1 *, T1 *, long)+0x2d0
=========     by thread (254,0,0) in block (3,0,0)
=========
========= Target application returned an error
========= ERROR SUMMARY: 2 errors
"""
RACECHECK_HAZARD = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at void softmax_forward_block<float, 4>(const T1 *, T1 *, long)+0x400
=========     and Read access at void softmax_forward_block<float, 4>(const T1 *, T1 *, long)+0x440 [8 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""


def test_sanitizer_command_names_the_tool_and_tells_findings_from_failures():
    cmd = gpu_check.sanitizer_command("racecheck", "/opt/cuda/bin/compute-sanitizer")
    assert cmd[:3] == ["/opt/cuda/bin/compute-sanitizer", "--tool", "racecheck"]
    assert cmd[cmd.index("--error-exitcode") + 1] == str(gpu_check.SANITIZER_EXIT) != "1"
    assert cmd[cmd.index("--report-api-errors") + 1] == "no"
    with pytest.raises(ValueError, match="memcheck, racecheck, initcheck or synccheck, got 'leakcheck'"):
        gpu_check.sanitizer_command("leakcheck", "compute-sanitizer")
    assert set(gpu_check.SANITIZER_RUNS) == {"memcheck", "racecheck"}
    assert all(args[0].startswith("tests/build/test_kernels.py::") for args in gpu_check.SANITIZER_RUNS.values())


def test_parse_sanitizer_reads_summaries_and_findings():
    clean = gpu_check.parse_sanitizer(MEMCHECK_CLEAN, "memcheck")
    assert clean["clean"] and clean["errors"] == 0 and clean["findings"] == []
    bad = gpu_check.parse_sanitizer(MEMCHECK_OOB, "memcheck")
    assert not bad["clean"] and bad["errors"] == 2 and bad["reason"] == "2 error(s) reported"
    assert bad["findings"] == ["Invalid __global__ read of size 16 bytes"]  # the same report once, details left out
    race = gpu_check.parse_sanitizer(RACECHECK_HAZARD, "racecheck")
    assert not race["clean"] and (race["errors"], race["warnings"]) == (1, 0)
    assert race["findings"][0].startswith("Error: Race reported between Write access")
    cut = gpu_check.parse_sanitizer("========= COMPUTE-SANITIZER\nSegmentation fault (core dumped)\n", "memcheck")
    assert not cut["clean"] and cut["errors"] is None and "no memcheck summary" in cut["reason"]
    # racecheck's verdict comes from its own summary, not from an ERROR SUMMARY line
    assert not gpu_check.parse_sanitizer("========= ERROR SUMMARY: 0 errors\n", "racecheck")["clean"]
    with pytest.raises(TypeError, match="as text"):
        gpu_check.parse_sanitizer(None, "memcheck")


def test_run_sanitizer_without_the_tool_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "sanitizer_path", lambda: None)
    out = gpu_check.run_sanitizer(tmp_path)
    assert list(out) == ["skipped"] and "CUDA toolkit" in out["skipped"]
    device = {"gpu": "H100", "compute_capability": "9.0", "memory_gib": 79.1, "torch": "2.14", "cuda_build": "13.0",
              "python": "3.12", "date": "2026-11-25", "capabilities": {}}
    doc = gpu_check.summarize(device, None, {}, out)
    assert doc["failed"] == [] and "compute-sanitizer: skipped" in gpu_check._table(doc)


@pytest.mark.skipif(os.name == "nt", reason="the stand-in sanitizer is a POSIX shell script")
def test_run_sanitizer_wraps_pytest_and_reads_its_report(monkeypatch, tmp_path):
    fake = tmp_path / "compute-sanitizer"  # prints what the real one prints around a clean run, runs the rest
    fake.write_text('#!/bin/sh\necho "========= COMPUTE-SANITIZER"\n'
                    'while [ "$1" != "--error-exitcode" ]; do shift; done; shift 2\n'
                    '"$@"; rc=$?\necho "========= ERROR SUMMARY: 0 errors"\nexit $rc\n')
    fake.chmod(0o755)
    probe = tmp_path / "test_probe.py"
    probe.write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert False\n")
    monkeypatch.setattr(gpu_check, "sanitizer_path", lambda: fake)
    runs = {"memcheck": [str(probe), "-o", "addopts=", "-p", "no:nbval"]}
    out = gpu_check.run_sanitizer(tmp_path, runs=runs, timeout=300)["memcheck"]
    assert out["command"].startswith("compute-sanitizer --tool memcheck") and "pytest" in out["command"]
    assert out["passed"] == 1 and len(out["failed"]) == 1 and out["exit_code"] == 1
    assert out["errors"] == 0 and not out["clean"] and "a test failed" in out["reason"]
    doc = gpu_check.summarize({"gpu": "test"}, None, {}, {"memcheck": out})
    assert any(f.startswith("compute-sanitizer memcheck: exit code 1") for f in doc["failed"])
    probe.write_text("import pytest\n\n@pytest.mark.skip(reason='needs a CUDA GPU')\ndef test_gpu():\n    pass\n")
    skipped = gpu_check.run_sanitizer(tmp_path, runs=runs, timeout=300)["memcheck"]
    assert skipped["errors"] == 0 and not skipped["clean"]  # a clean summary over nothing checked is no pass
    assert skipped["reason"] == "no test ran under the sanitizer (needs a CUDA GPU)"


def test_triton_gpu_numbers_are_among_the_key_metrics():
    triton_metrics = {m for (stem, m) in gpu_check.KEY_METRICS if stem == "06_gpu_kernels_triton" and "triton" in m}
    assert triton_metrics == {"triton_gpu_parity_max_abs_fp32", "triton_gpu_softmax_fraction_of_copy_bw",
                              "triton_gpu_few_long_rows_fraction_of_copy_bw",
                              "triton_gpu_softmax_speedup_vs_torch_geomean"}
    assert all((env.repo_root() / f).is_file() for f in gpu_check.GPU_TESTS)
