"""utils.core.env: capability flags, the guard for optional cells, device choice."""

import pytest

from utils.core import env, report, sections


def test_capabilities_have_reasons():
    caps = env.capabilities()
    for name in ("cuda", "tensorrt", "tritonserver", "nvcc", "cxx", "tensorflow", "onnxruntime", "cuda+nvcc"):
        assert name in caps
        assert isinstance(caps[name].available, bool)
        assert caps[name].reason, f"{name} has no reason"


def test_every_optional_section_names_a_known_capability():
    caps = env.capabilities()
    for section, (cap, what) in sections.OPTIONAL_SECTIONS.items():
        assert cap in caps, f"{section} needs unknown capability {cap}"
        assert section[:2].isdigit() and section[2] == ".", section
        assert what


def test_requires_prints_one_line_and_records_the_skip(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path))
    report.init("99_guard_test")
    missing = env.Capability("cuda", False, "no CUDA GPU visible (test)")
    monkeypatch.setitem(env.capabilities(), "cuda", missing)
    assert sections.requires("cuda", section="00.gpu-probe") is False
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("SKIPPED [00.gpu-probe] needs cuda: no CUDA GPU visible (test)")
    assert report.current()["skipped"] == {"00.gpu-probe": "needs cuda: no CUDA GPU visible (test)"}


def test_requires_true_when_present(monkeypatch, capsys):
    monkeypatch.setitem(env.capabilities(), "cuda", env.Capability("cuda", True, "fake GPU"))
    assert sections.requires("cuda", section="00.gpu-probe") is True
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "cap, section, match",
    [
        ("cuda", "99.not-listed", "not in utils.core.sections.OPTIONAL_SECTIONS"),
        ("tensorrt", "00.gpu-probe", "listed as needing 'cuda'"),
        ("cuda", "", "needs a section name"),
    ],
)
def test_requires_rejects_bad_sections(cap, section, match):
    with pytest.raises(ValueError, match=match):
        sections.requires(cap, section=section)


def test_has_rejects_unknown_capability():
    with pytest.raises(KeyError, match="unknown capability 'warp-drive'"):
        env.has("warp-drive")


def test_choose_device():
    import torch

    assert env.choose_device("cpu") == torch.device("cpu")
    assert env.choose_device("auto").type in {"cpu", "cuda"}
    with pytest.raises(ValueError, match="DEVICE must be"):
        env.choose_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="DEVICE='cuda' was asked for but no CUDA GPU"):
            env.choose_device("cuda")


def test_smoke_default(monkeypatch):
    monkeypatch.setenv("WORKBOOK_SMOKE", "1")
    assert env.smoke_default() is True
    monkeypatch.setenv("WORKBOOK_SMOKE", "0")
    assert env.smoke_default() is False
    monkeypatch.setenv("WORKBOOK_SMOKE", "maybe")
    with pytest.raises(ValueError, match="WORKBOOK_SMOKE must be 0 or 1"):
        env.smoke_default()


def test_inventory_is_json_serialisable():
    import json

    inv = env.inventory()
    json.dumps(inv)
    assert inv["cpu_count"] >= 1
    assert inv["packages"]["torch"]


def test_versions_are_found_by_import_name_whichever_distribution_provides_it(monkeypatch):
    # The course environment has onnxruntime-gpu; a cloud notebook has plain onnxruntime: both provide `onnxruntime`.
    dist, version = env.distribution_version("onnxruntime")
    assert dist in {"onnxruntime", "onnxruntime-gpu"} and version[0].isdigit()
    assert env.package_versions()["onnxruntime"] == version
    assert env.distribution_version("surely_not_a_module_xyz") is None
    # a distribution name the lookup would once have assumed, absent here, must not matter
    monkeypatch.setattr(env, "_import_names", lambda: {"onnxruntime": ["not-installed-dist", dist]})
    assert env.distribution_version("onnxruntime") == (dist, version)


def test_doctor_short_exits_zero_when_only_optional_packages_are_missing(monkeypatch, capsys):
    monkeypatch.setattr(env, "package_versions",
                        lambda: {label: (None if label == "tensorflow" else "1.0") for label in env.PACKAGES})
    assert env._print_doctor(short=True) == 0
    assert "not installed (the sections that need them skip, saying why): tensorflow" in capsys.readouterr().out
    monkeypatch.setattr(env, "package_versions", lambda: {label: None for label in env.PACKAGES})
    assert env._print_doctor(short=True) == 1


def test_requires_records_the_sections_that_ran(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path))
    report.init("00_environment")
    monkeypatch.setattr(env, "capabilities", lambda: {"cxx": env.Capability("cxx", True, "g++ (test)")})
    assert sections.requires("cxx", section="06.cpu-kernel") is True
    assert report.current()["ran"] == ["06.cpu-kernel"]
