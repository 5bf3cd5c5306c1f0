"""utils.conversion.tvm_tools: the plumbing around lesson 04's Apache TVM section (optional: skips without tvm)."""

import subprocess
import sys

import numpy as np
import pytest

from utils.core import env


def test_importing_the_helpers_does_not_import_tvm():
    code = "import sys, utils.conversion.tvm_tools; print('tvm' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=env.repo_root(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


@pytest.fixture(scope="module")
def linear_module():
    """A two-node ONNX graph y = x @ W + b (MatMul + Add), imported into Relax and through the zero pipeline."""
    pytest.importorskip("tvm", reason="apache-tvm is optional: lesson 04's TVM section (04.tvm) needs it")
    onnx = pytest.importorskip("onnx")
    import tvm
    from onnx import TensorProto, helper, numpy_helper
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((16, 24)).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 24])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    relax_mod = from_onnx(model, shape_dict={"x": [2, 16]})
    target = tvm.target.Target.from_device("cpu")
    with target:
        lowered = relax.get_pipeline("zero")(relax_mod)
    return relax_mod, lowered, target, w, b


def test_relax_ops_and_tensorir_functions(linear_module):
    from utils.conversion import tvm_tools

    relax_mod, lowered, *_ = linear_module
    ops = tvm_tools.relax_op_histogram(relax_mod)
    assert ops["relax.matmul"] == 1 and ops["relax.add"] == 1, ops
    funcs = tvm_tools.prim_functions(lowered)
    assert any("matmul" in name for name in funcs), sorted(funcs)
    assert tvm_tools.relax_op_histogram(lowered)["relax.call_tir"] >= 1
    assert tvm_tools.loop_kinds(lowered) == {"parallel": 0, "vectorized": 0, "unrolled": 0}  # nothing scheduled


def test_one_function_runs_alone_and_matches_numpy(linear_module):
    import tvm

    from utils.conversion import tvm_tools

    _, lowered, target, w, b = linear_module
    name = next(n for n in tvm_tools.prim_functions(lowered) if "matmul" in n)
    op = tvm_tools.single_function(lowered, name)
    assert [gv.name_hint for gv in op.get_global_vars()] == ["main"]
    args = tvm_tools.random_arguments(op, seed=3)
    shapes = [a.shape for a in args]
    assert shapes[0] == (2, 16) and shapes[-1] == (2, 24), shapes
    assert all(str(a.dtype) == "float32" for a in args)
    again = tvm_tools.random_arguments(op, seed=3)
    np.testing.assert_array_equal(args[0].numpy(), again[0].numpy())  # seeded
    lib = tvm.compile(op, target=target).jit()
    lib["main"](*args)
    x, weight, bias = (a.numpy() for a in args[:3])
    np.testing.assert_allclose(args[-1].numpy(), x @ weight + bias, atol=1e-5, rtol=1e-5)


def test_helpers_reject_bad_input_with_what_was_expected(linear_module):
    import tvm

    from utils.conversion import tvm_tools

    _, lowered, target, *_ = linear_module
    with pytest.raises(KeyError, match="no TensorIR function 'nope'"):
        tvm_tools.single_function(lowered, "nope")
    with pytest.raises(KeyError, match="function 'nope' is not in the module"):
        tvm_tools.relax_op_histogram(lowered, func="nope")
    with pytest.raises(TypeError, match="expected a tvm.IRModule"):
        tvm_tools.prim_functions({"main": None})
    with pytest.raises(ValueError, match="cores must be >= 1"):
        tvm_tools.tuning_target(target, cores=0)
    with pytest.raises(ValueError, match="llvm"):
        tvm_tools.tuning_target(tvm.target.Target({"kind": "c"}), cores=2)


def test_tuning_target_keeps_the_cpu_and_adds_the_core_count(linear_module):
    from utils.conversion import tvm_tools

    target = linear_module[2]
    tuned = tvm_tools.tuning_target(target, cores=2).export()
    assert tuned["kind"] == "llvm" and tuned["num-cores"] == 2
    assert tuned.get("mcpu") == target.export().get("mcpu")
