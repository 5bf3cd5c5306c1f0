"""Unit tests for utils.conversion.onnx_tools (lesson 04): export, sessions, parity, inspection, bad input."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tests.build.test_conversion_gate import within_budget  # noqa: E402
from utils.conversion import onnx_tools as ot  # noqa: E402
from utils.core import onnx_io  # noqa: E402


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2.0


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    model = Tiny().eval()
    onnx_io.export_model(model, (torch.randn(2, 8),), path, input_names=["x"], output_names=["y"],
                    dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return model, path


@pytest.fixture(scope="module")
def minilm_onnx(tmp_path_factory):
    from utils.core.models import minilm

    tok, model = minilm("eager")
    path = onnx_io.export_minilm(tmp_path_factory.mktemp("minilm") / "minilm.onnx")
    return tok, model, path


def test_export_model_and_parity_dynamic_batch(tiny_onnx):
    model, path = tiny_onnx
    ot.check_model(path)
    sess = onnx_io.ort_session(path, threads=1)
    samples = [(torch.randn(b, 8),) for b in (1, 3, 17)]
    err = onnx_io.parity(model, sess, samples)
    assert 0 <= err < 1e-5


def test_parity_raises_clear_error_out_of_tolerance(tiny_onnx):
    model, path = tiny_onnx
    sess = onnx_io.ort_session(path)
    with pytest.raises(onnx_io.ParityError, match="parity failed on sample 0"):
        onnx_io.parity(lambda x: model(x) + 0.01, sess, torch.randn(2, 8))
    with pytest.raises(ValueError, match="expects 1 inputs"):
        onnx_io.parity(model, sess, (torch.randn(2, 8), torch.randn(2, 8)))
    with pytest.raises(ValueError, match="atol and rtol"):
        onnx_io.parity(model, sess, torch.randn(2, 8), atol=-1)


def test_ort_session_bad_input(tiny_onnx, tmp_path):
    _, path = tiny_onnx
    with pytest.raises(FileNotFoundError, match="does not exist"):
        onnx_io.ort_session(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="level must be one of"):
        onnx_io.ort_session(path, level="max")
    with pytest.raises(ValueError, match="threads"):
        onnx_io.ort_session(path, threads=0)
    with pytest.raises(ValueError, match="not available"):
        onnx_io.ort_session(path, providers=["NoSuchExecutionProvider"])


def test_inspection_helpers(tiny_onnx, tmp_path):
    _, path = tiny_onnx
    hist = ot.op_histogram(path)
    assert hist["Relu"] == 1 and ot.node_count(path) == sum(hist.values())
    assert onnx_io.onnx_size_bytes(path) == path.stat().st_size
    opt = ot.optimized_graph(path, tmp_path / "opt.onnx", level="basic")
    assert len(opt.graph.node) <= ot.node_count(path)


def test_export_minilm_dynamic_axes_and_parity(minilm_onnx):
    tok, model, path = minilm_onnx
    sess = onnx_io.ort_session(path, threads=2)
    assert [i.name for i in sess.get_inputs()] == list(onnx_io.MINILM_INPUTS)
    assert all(i.type == "tensor(int64)" for i in sess.get_inputs())
    assert [o.name for o in sess.get_outputs()] == ["last_hidden_state"]
    assert sess.get_inputs()[0].shape == ["batch", "sequence"]
    samples = [onnx_io.minilm_inputs(tok, ["hi"]), onnx_io.minilm_inputs(tok, ["a", "a longer sentence about runtimes", "c"])]
    assert onnx_io.parity(model, sess, samples) < 1e-4


def test_export_minilm_bad_input(tmp_path):
    with pytest.raises(ValueError, match=r"\.onnx"):
        onnx_io.export_minilm(tmp_path / "model.pt")
    with pytest.raises(ValueError, match="opset"):
        onnx_io.export_minilm(tmp_path / "m.onnx", opset=3)
    with pytest.raises(TypeError, match="str or os.PathLike"):
        onnx_io.export_minilm(123)


def test_parity_accepts_numpy_inputs(tiny_onnx):
    model, path = tiny_onnx
    sess = onnx_io.ort_session(path)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    assert onnx_io.parity(lambda t: model(torch.as_tensor(t)), sess, x) < 1e-5


def test_dynamo_export_writes_external_data_and_is_counted(tmp_path):
    model = Tiny().eval()
    path = onnx_io.export_model(model, (torch.randn(2, 8),), tmp_path / "tiny_dyn.onnx", input_names=["x"],
                           output_names=["y"], dynamo=True, opset=17,
                           dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},))
    proto = onnx.load(str(path), load_external_data=False)
    assert proto.opset_import[0].version >= 18  # the torch.export-based exporter implements opset 18+
    assert onnx_io.onnx_size_bytes(path) >= path.stat().st_size
    sess = onnx_io.ort_session(path)
    assert onnx_io.parity(model, sess, [(torch.randn(b, 8),) for b in (1, 5)]) < 1e-5


def test_calibration_reader_and_static_quantization(tiny_onnx, tmp_path):
    from onnxruntime.quantization import QuantFormat, quantize_static

    model, path = tiny_onnx
    reader = ot.calibration_reader("x", [torch.randn(4, 8), np.ones((4, 8), np.float32)])
    first = reader.get_next()
    assert set(first) == {"x"} and first["x"].shape == (4, 8)
    reader.rewind()
    out = tmp_path / "tiny_int8.onnx"
    quantize_static(str(path), str(out), reader, quant_format=QuantFormat.QDQ)
    assert "QuantizeLinear" in ot.op_histogram(out)
    with pytest.raises(ValueError, match="at least one batch"):
        ot.calibration_reader("x", [])


def test_to_fp16_keeps_io_types_and_is_close(tiny_onnx, tmp_path):
    model, path = tiny_onnx
    out = ot.to_fp16(path, tmp_path / "tiny_fp16.onnx")
    sess = onnx_io.ort_session(out)
    assert sess.get_inputs()[0].type == "tensor(float)"
    assert onnx_io.parity(model, sess, torch.randn(3, 8), atol=1e-2, rtol=1e-2) < 1e-2
    with pytest.raises(FileNotFoundError):
        ot.to_fp16(tmp_path / "missing.onnx", tmp_path / "x.onnx")


def test_trt_helpers_without_tensorrt(tmp_path):
    from utils.conversion import trt as trt_tools

    cmd = trt_tools.trtexec_command(tmp_path / "m.onnx", tmp_path / "m.plan", input_name="images",
                                    sample_shape=(3, 224, 224), min_batch=1, opt_batch=8, max_batch=32)
    assert "--minShapes=images:1x3x224x224" in cmd and "--maxShapes=images:32x3x224x224" in cmd
    assert "--fp16" in cmd and cmd.startswith("trtexec ")
    assert "--fp16" not in trt_tools.trtexec_command("a.onnx", "a.plan", input_name="x", sample_shape=(4,), fp16=False)
    with pytest.raises(ValueError, match="min_batch <= opt_batch"):
        trt_tools.trtexec_command("a.onnx", "a.plan", input_name="x", sample_shape=(4,), min_batch=8, opt_batch=2)
    with pytest.raises(ValueError, match="sample_shape"):
        trt_tools.trtexec_command("a.onnx", "a.plan", input_name="x", sample_shape=(0, 3))
    assert "--fp16" not in trt_tools.trtexec_command("a.onnx", "a.plan", input_name="x", sample_shape=(4,),
                                                     trt_major=11)
    with pytest.raises(ValueError, match="trt_major"):
        trt_tools.trtexec_command("a.onnx", "a.plan", input_name="x", sample_shape=(4,), trt_major=9)
    fp16_11 = trt_tools.build_recipe("m.onnx", "m.plan", precision="fp16", trt_major=11, input_name="x",
                                     sample_shape=(4,))
    assert len(fp16_11) == 2 and "modelopt.onnx.autocast" in fp16_11[0] and "--onnx=m_fp16.onnx" in fp16_11[1]
    assert not any("--fp16" in step for step in fp16_11)
    int8_10 = trt_tools.build_recipe("m.onnx", "m.plan", precision="int8", trt_major=10, input_name="x",
                                     sample_shape=(4,))
    assert "modelopt.onnx.quantization" in int8_10[0] and "--stronglyTyped" in int8_10[1] and "--int8" not in int8_10[1]
    assert trt_tools.build_recipe("m.onnx", "m.plan", precision="fp16", trt_major=10, input_name="x",
                                  sample_shape=(4,))[-1].endswith("--fp16")
    with pytest.raises(ValueError, match="precision"):
        trt_tools.build_recipe("m.onnx", "m.plan", precision="bf8", trt_major=10, input_name="x", sample_shape=(4,))
    summary = trt_tools.fusion_summary({"Layers": [{"Name": "conv1 + bn1 + relu1", "LayerType": "CaskConvolution"},
                                                   {"Name": "fc", "LayerType": "CaskGemm"}, "reformat"]})
    assert summary["layers"] == 3 and summary["fused_layers"] == 1
    assert summary["types"]["CaskConvolution"] == 1
    providers = trt_tools.ort_tensorrt_providers(tmp_path / "cache")
    assert providers[0][0] == "TensorrtExecutionProvider" and providers[-1] == "CPUExecutionProvider"
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        with pytest.raises(trt_tools.TensorRTMissing, match="not installed"):
            trt_tools.build_engine(tmp_path / "m.onnx", tmp_path / "m.plan", input_name="images",
                                   sample_shape=(3, 8, 8))


def test_conversion_gate_failure_names_the_broken_budget():
    within_budget("latency_vs_eager", 0.5, 1.5)  # within budget: no exception
    with pytest.raises(AssertionError, match=r"budget 'size_over_fp32_params' broken: measured 2x > limit 1.25x"):
        within_budget("size_over_fp32_params", 2.0, 1.25, "x")
    with pytest.raises(AssertionError, match=r"budget 'parity_atol' cannot be checked: measured value is nan"):
        within_budget("parity_atol", float("nan"), 1e-4)


def test_native_logs_silenced_hides_fd_writes(capfd):
    import os

    from utils.conversion import onnx_tools as tools

    with onnx_io.native_logs_silenced():
        os.write(2, b"E0000 failed call to cuInit\n")
    os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert "cuInit" not in err and "after" in err
    with pytest.raises(ValueError), onnx_io.native_logs_silenced():
        raise ValueError("exceptions still propagate")
