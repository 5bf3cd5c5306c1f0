"""Platform dependencies as capabilities (issue 26): the emulation switch, the quantized engine, CPU features on every
platform, portable page faults and heap counts, extension flags per compiler, the doctor's per-platform plan."""

import json
import re
import subprocess
import sys

import pytest

from utils.core import env, platforms, sections
from utils.course import doctor


def _reset_probes():
    env.capabilities.cache_clear()
    env.cpu_flags.cache_clear()
    platforms.apply.cache_clear()


@pytest.fixture
def emulate(monkeypatch):
    """emulate(name): this test sees the platform `name` (None: the real one); probes are reset before and after."""
    import torch

    engine = torch.backends.quantized.engine

    def set_platform(name):
        if name is None:
            monkeypatch.delenv("WORKBOOK_EMULATE", raising=False)
        else:
            monkeypatch.setenv("WORKBOOK_EMULATE", name)
        _reset_probes()

    yield set_platform
    monkeypatch.delenv("WORKBOOK_EMULATE", raising=False)
    _reset_probes()
    torch.backends.quantized.engine = engine


def test_bad_emulation_names_the_valid_ones(emulate):
    emulate("amiga")
    with pytest.raises(ValueError, match=r"WORKBOOK_EMULATE must be one of \['linux-aarch64', 'macos-arm64', 'windows'\]"
                                         r".*got 'amiga'"):
        platforms.emulated()
    emulate(None)
    assert platforms.emulated() is None and platforms.lacks("glibc_malloc") is None


@pytest.mark.parametrize("name, system, machine, missing", [
    ("macos-arm64", "Darwin", "arm64", {"glibc_malloc", "tritonserver", "cuda", "nvcc", "triton"}),
    ("windows", "Windows", "AMD64", {"glibc_malloc", "process_groups", "cxx", "inductor", "torchserve", "tritonserver"}),
    ("linux-aarch64", "Linux", "aarch64", {"tritonserver", "cuda"}),
])
def test_emulated_platform_reports_what_it_lacks_with_a_reason(emulate, name, system, machine, missing):
    emulate(name)
    assert (platforms.system(), platforms.machine()) == (system, machine)
    caps = env.capabilities()
    for cap in missing:
        assert not caps[cap].available, cap
        assert caps[cap].reason and "\n" not in caps[cap].reason, cap
    assert caps["quantized_engine"].available
    assert env.cpu_flags() == frozenset()  # this machine's x86 flags are not that platform's
    inv = env.inventory()
    assert inv["os"] == system and inv["emulated"] == name
    json.dumps(inv)


def test_windows_reasons_name_what_a_windows_learner_does(emulate):
    emulate("windows")
    caps = env.capabilities()
    assert "MSVC" in caps["cxx"].reason and "g++" not in caps["cxx"].reason
    assert "process groups" in caps["process_groups"].reason
    assert env.libc_name() == "UCRT (Windows)"


@pytest.mark.parametrize("name, engine", [(None, None), ("macos-arm64", "qnnpack"), ("linux-aarch64", "qnnpack"),
                                          ("windows", None)])
def test_quantized_engine_is_chosen_per_platform_and_dynamic_int8_runs(emulate, name, engine):
    import torch

    emulate(name)
    chosen = env.use_quantized_engine()
    assert torch.backends.quantized.engine == chosen
    assert chosen == (engine or next(e for e in ("x86", "fbgemm", "onednn", "qnnpack")
                                     if e in torch.backends.quantized.supported_engines))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    q = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    x = torch.randn(8, 32)
    cos = torch.nn.functional.cosine_similarity(q(x), model(x)).min().item()
    assert cos > 0.99, f"{chosen}: int8 output cosine {cos}"


def test_every_dynamic_int8_call_chooses_its_engine_first():
    """macOS wheels start at the 'none' engine, which a Linux build cannot be set to: the emulation cannot reproduce
    NoQEngine, so this proves statically that every torch quantize_dynamic call is preceded by the choice."""
    root = env.repo_root()
    torch_call = re.compile(r"torch\.ao\.quantization\.quantize_dynamic\(|(?<![\w.])quantize_dynamic\(")
    offenders = []
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        chosen = False
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            text = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
            is_torch = "torch.ao.quantization" in text and "onnxruntime.quantization import" not in text
            m = torch_call.search(text) if is_torch else None
            if m and not (chosen or "use_quantized_engine()" in text[:m.start()]):
                offenders.append(f"{nb.name} cell {i}")
            chosen = chosen or "use_quantized_engine()" in text
    bank = (root / "utils" / "interview" / "bank.yaml").read_text()
    for proof in re.split(r"\n\s*- id:", bank):
        if "torch.ao.quantization.quantize_dynamic(" in proof and "use_quantized_engine()" not in proof:
            offenders.append("utils/interview/bank.yaml: " + proof.strip().splitlines()[0][:60])
    assert not offenders, f"torch dynamic int8 without env.use_quantized_engine() first: {sorted(set(offenders))}"


GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
"""

APPLE_M2 = """hw.optional.arm.FEAT_BF16: 1
hw.optional.arm.FEAT_I8MM: 1
hw.optional.arm.FEAT_DotProd: 1
hw.optional.arm.FEAT_SME: 0
hw.optional.AdvSIMD: 1
hw.optional.neon: 1
hw.optional.floatingpoint: 1
"""


def test_cpu_features_are_read_on_arm_linux_and_macos():
    arm = env.parse_arm_features(GRAVITON3)
    assert {"asimd", "sve", "bf16", "i8mm"} <= arm and "avx2" not in arm
    assert env.parse_arm_features("processor : 0\nflags : fpu\n") == frozenset()
    mac = env.parse_macos_sysctl(APPLE_M2)
    assert mac == {"asimd", "bf16", "i8mm", "asimddp"}  # SME is 0 on an M2: left out
    assert env.parse_macos_sysctl("hw.optional.arm.FEAT_BF16: 0\n") == frozenset()


def test_cpu_features_include_torchs_reading(emulate):
    emulate(None)
    import torch

    feats = env.cpu_features()
    assert set(feats) == set(env.TRACKED_FEATURES) and all(isinstance(v, bool) for v in feats.values())
    assert env.torch_cpu_capability() == torch.backends.cpu.get_cpu_capability()
    assert env.inventory()["torch_cpu_capability"] == env.torch_cpu_capability()


def test_page_faults_count_fresh_pages():
    import mmap

    before = env.page_faults()
    with mmap.mmap(-1, 8 * 2**20) as region:
        for i in range(0, len(region), mmap.PAGESIZE):
            region[i] = 1
    assert env.page_faults() - before >= (8 * 2**20 // mmap.PAGESIZE) // 2


def test_training_imports_without_the_resource_module():
    """Windows has no `resource`: importing lesson 03's helpers must not need it."""
    code = "import sys; sys.modules['resource'] = None; import utils.training, utils.training.allocator; print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=env.repo_root(), env=env.child_environ())
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_heap_count_without_glibc_agrees_with_mallinfo2(emulate):
    """Where there is no glibc the profiler's memory events stand in for mallinfo2 (lesson 01's checkpointing)."""
    import torch

    from utils import inference

    emulate(None)
    if not env.has("glibc_malloc"):
        pytest.skip(f"needs glibc to compare against: {env.capabilities()['glibc_malloc'].reason}")
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU()) for _ in range(4)])
    x = torch.randn(256, 512)
    net(x).sum().backward()
    glibc, out = inference.heap_bytes_held_by(lambda: net(x))
    del out
    emulate("macos-arm64")
    assert "profiler" in inference.heap_source()
    profiled, out = inference.heap_bytes_held_by(lambda: net(x))
    assert out.shape == (256, 512)
    activations = 4 * 2 * 256 * 512 * 4  # Linear output and ReLU output per block, fp32
    assert 0.5 * activations <= profiled <= 2 * activations, (profiled, activations)
    assert abs(profiled - glibc) <= 0.25 * glibc, (profiled, glibc)


def test_keep_freed_memory_refuses_without_glibc_with_the_reason(emulate):
    from utils.training import allocator

    emulate("windows")
    with pytest.raises(RuntimeError, match="Windows has no glibc"):
        allocator.keep_freed_memory()


@pytest.mark.parametrize("kind, system, want_c, want_ld", [
    ("gcc", "linux", ["-fopenmp"], ["-fopenmp"]),
    ("msvc", "win32", ["/openmp"], []),
])
def test_openmp_flags_per_compiler(kind, system, want_c, want_ld):
    from utils import kernels

    assert kernels.openmp_flags(kind, system) == (want_c, want_ld)


def test_apple_clang_gets_xpreprocessor_and_torchs_libomp(monkeypatch, tmp_path):
    import torch

    from utils import kernels

    (tmp_path / "lib").mkdir()
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "__init__.py"))
    assert kernels.openmp_flags("apple-clang", "darwin") == ([], [])  # no bundled libomp: a serial build
    (tmp_path / "lib" / "libomp.dylib").write_bytes(b"")
    cflags, ldflags = kernels.openmp_flags("apple-clang", "darwin")
    assert cflags[:2] == ["-Xpreprocessor", "-fopenmp"] and "-fopenmp" != cflags[0]
    assert f"-I{tmp_path / 'include'}" in cflags and "-lomp" in ldflags and f"-L{tmp_path / 'lib'}" in ldflags


def test_procgroup_tree_end_works_without_killpg():
    """The Windows path of procgroup.end (no os.killpg): the process tree is ended through psutil."""
    from utils.core import procgroup

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procgroup._end_tree(proc, timeout=2, sigterm=True)
    assert proc.poll() is not None


def test_predict_marks_sections_inside_a_skipped_one_as_not_reached():
    caps = dict(env.capabilities())
    caps["tritonclient"] = env.Capability("tritonclient", True, "tritonclient (test)")
    caps["tritonserver"] = env.Capability("tritonserver", False, "absent (test)")
    caps["nginx"] = env.Capability("nginx", True, "/usr/sbin/nginx (test)")
    plan = sections.predict(caps)
    assert plan["05.triton"] == ("skipped", "needs tritonserver: absent (test)")
    assert plan["05.proxy-limit"][0] == "not reached" and "05.triton" in plan["05.proxy-limit"][1]
    assert set(plan) == set(sections.OPTIONAL_SECTIONS)
    caps["tritonclient"] = env.Capability("tritonclient", False, "no client (test)")
    assert sections.predict(caps)["05.triton"][0] == "not reached"  # 05.triton itself runs inside 05.model-config


@pytest.mark.parametrize("name", ["macos-arm64", "windows", "linux-aarch64"])
def test_doctor_predicts_for_the_emulated_platform(emulate, name, capsys):
    emulate(name)
    assert doctor.main(["--json", "--quick"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["platform"]["emulated"] == name and data["platform"]["os"] == platforms.system()
    checks = {c["name"]: c for c in data["checks"]}
    assert {"platform", "C library", "C++ compiler", "quantized engine"} <= set(checks)
    predicted = sections.predict()
    for lesson in data["sections"].values():
        for s in lesson:
            assert s["runs"] == (predicted[s["section"]][0] == "runs"), s


def test_ort_providers_auto_lists_only_what_ort_has():
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from utils.core import onnx_io

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    sess = onnx_io.ort_session(model.SerializeToString(), providers="auto")
    assert sess.get_providers()[-1] == "CPUExecutionProvider"
    assert ("CUDAExecutionProvider" in sess.get_providers()) == env.has("ort_cuda")
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():  # plain onnxruntime: say what to install
        with pytest.raises(ValueError, match="onnxruntime-gpu"):
            onnx_io.ort_session(model.SerializeToString(), providers=["CUDAExecutionProvider"])
