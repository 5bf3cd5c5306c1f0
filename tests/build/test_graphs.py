"""Unit tests for utils.graphs (lesson 02) and the lab 02 checks: correctness and clear errors, no timings."""

import collections
import re
import warnings

import pytest
import torch

from utils import graphs
from utils.checks import LabCheckFailed, lab02

pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated. Please:FutureWarning")


def test_clipnorm_branches_and_seeded_weights():
    a, b = graphs.ClipNorm(), graphs.ClipNorm()
    assert torch.equal(a.lin.weight, b.lin.weight), "same seed must give the same weights"
    assert not torch.equal(a.lin.weight, graphs.ClipNorm(seed=1).lin.weight)
    with torch.no_grad():
        assert a(torch.full((2, 4), 0.1)).norm() < 1.0  # below max_norm: untouched
        assert a(torch.full((2, 4), 10.0)).norm() == pytest.approx(1.0, abs=1e-5)  # clipped


def test_trace_freezes_the_branch_and_script_keeps_it():
    model = graphs.ClipNorm()
    small, large = torch.full((2, 4), 0.1), torch.full((2, 4), 10.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, small)
    scripted = torch.jit.script(model)
    with torch.no_grad():
        assert not torch.allclose(traced(large), model(large))
        assert torch.allclose(scripted(large), model(large))
    assert graphs.node_kinds(scripted)["prim::If"] == 1
    assert graphs.node_kinds(traced)["prim::If"] == 0


def test_gated_mlp_takes_both_paths():
    model = graphs.GatedMLP()
    x = torch.rand(3, 8) + 0.1
    with torch.no_grad():
        relu_path = x + model.fc2(torch.relu(model.fc1(x)))
        tanh_path = -x - model.fc2(torch.tanh(model.fc1(-x)))
        assert torch.allclose(model(x), relu_path)
        assert torch.allclose(model(-x), tanh_path)


def test_noisy_and_clean_mlp_agree_and_break_differently():
    x = torch.randn(8, 64)
    noisy, clean = graphs.NoisyMLP(), graphs.CleanMLP()
    with torch.no_grad():
        assert torch.allclose(noisy(x), clean(x), atol=1e-6)
    before, after = graphs.graph_breaks(noisy, x), graphs.graph_breaks(clean, x)
    assert before.break_count == 2 and before.graph_count == 3 and len(before.reasons) == 2
    assert after.break_count == 0 and after.graph_count == 1
    assert "graph break" in str(before)


def test_graph_breaks_rejects_non_callable():
    with pytest.raises(TypeError, match="needs a callable"):
        graphs.graph_breaks(42)


def test_attention_scripted_with_and_without_mask():
    attn = graphs.TinySelfAttention(dim=8, heads=2)
    scripted = torch.jit.script(attn)
    x = torch.randn(2, 4, 8)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with torch.no_grad():
        assert torch.allclose(scripted(x, mask), attn(x, mask), atol=1e-6)
        assert torch.allclose(scripted(x), attn(x), atol=1e-6)
        assert not torch.allclose(attn(x, mask), attn(x))
    with pytest.raises(ValueError, match="divisible"):
        graphs.TinySelfAttention(dim=10, heads=3)


def test_node_kinds_and_kind_changes():
    scripted = torch.jit.script(graphs.ClipNorm())
    kinds = graphs.node_kinds(scripted)
    assert kinds["aten::linear"] == 1  # inlined: the Linear submodule's call is expanded
    assert graphs.node_kinds(scripted.graph)["prim::CallMethod"] == 1  # the raw graph still calls the submodule
    rows = graphs.kind_changes(collections.Counter({"a": 3, "b": 1, "prim::Constant": 9}), collections.Counter({"a": 0, "b": 1}))
    assert rows == [("a", 3, 0)]
    with pytest.raises(TypeError, match="TorchScript"):
        graphs.node_kinds(graphs.ClipNorm())


def test_freeze_folds_batchnorm():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    scripted = torch.jit.script(model)
    frozen = torch.jit.freeze(scripted)
    rows = {kind: (a, b) for kind, a, b in graphs.kind_changes(graphs.node_kinds(scripted), graphs.node_kinds(frozen))}
    assert rows["aten::batch_norm"] == (1, 0)


def test_first_line_and_quiet_logs():
    assert graphs.first_line(ValueError("bad thing\nmore detail")) == "ValueError: bad thing"
    assert graphs.first_line(RuntimeError("")) == "RuntimeError:"
    import sys

    with graphs.quiet_torch_logs() as captured:
        print("hidden", file=sys.stderr)
    assert captured.getvalue() == "hidden\n"


def test_export_refuses_the_branch():
    with graphs.quiet_torch_logs(), pytest.raises(Exception, match="data-dependent"):
        torch.export.export(graphs.ClipNorm(), (torch.full((2, 4), 0.1),))


HLO_TEXT = """HloModule demo, entry_computation_layout={(f32[4]{0})->f32[]}

%add.red (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

%fused_computation (param_0: f32[4]) -> f32[4] {
  %param_0 = f32[4]{0} parameter(0)
  %c = f32[] constant(2)
  %b = f32[4]{0} broadcast(%c), dimensions={}
  ROOT %m = f32[4]{0} multiply(%param_0, %b)
}

ENTRY %main (arg0.1: f32[4]) -> f32[] {
  %arg0.1 = f32[4]{0} parameter(0)
  %mul_fusion = f32[4]{0} fusion(%arg0.1), kind=kLoop, calls=%fused_computation
  %zero = f32[] constant(0)
  ROOT %r = f32[] reduce(%mul_fusion, %zero), dimensions={0}, to_apply=%add.red
}
"""


def test_parse_hlo():
    module = graphs.parse_hlo(HLO_TEXT)
    assert module.name == "demo" and module.entry == "main"
    assert module.entry_ops == collections.Counter({"fusion": 1, "constant": 1, "reduce": 1})
    assert module.fusion_kinds == ["kLoop"]
    assert module.fused_ops == 3
    with pytest.raises(ValueError, match="not HLO text"):
        graphs.parse_hlo("hello")
    with pytest.raises(ValueError, match="no ENTRY"):
        graphs.parse_hlo("HloModule x\n\n%c (a: f32[]) -> f32[] {\n  ROOT %a = f32[] parameter(0)\n}\n")


def test_fusion_ops_separates_real_fusions_from_single_op_wrappers():
    wrapped = HLO_TEXT.replace(
        "ENTRY %main",
        "%wrapped_negate_computation (p: f32[4]) -> f32[4] {\n  %p = f32[4]{0} parameter(0)\n"
        "  ROOT %n = f32[4]{0} negate(%p)\n}\n\nENTRY %main",
    ).replace(
        "  %zero = f32[] constant(0)\n",
        "  %wrapped_negate = f32[4]{0} fusion(%mul_fusion), kind=kLoop, calls=%wrapped_negate_computation\n"
        "  %zero = f32[] constant(0)\n",
    )
    module = graphs.parse_hlo(wrapped)
    assert module.fusion_kinds == ["kLoop", "kLoop"]
    assert module.fusion_calls == ["fused_computation", "wrapped_negate_computation"]
    assert module.fusion_ops == [["constant", "broadcast", "multiply"], ["negate"]]
    assert graphs.parse_hlo(HLO_TEXT).fusion_ops == [["constant", "broadcast", "multiply"]]


def test_read_hlo_dump(tmp_path):
    (tmp_path / "module_0001.a_inference_f_1__.before_optimizations.txt").write_text(HLO_TEXT)
    (tmp_path / "module_0001.a_inference_f_1__.cpu_after_optimizations.txt").write_text(HLO_TEXT)
    before, after = graphs.read_hlo_dump(tmp_path, "inference_f")
    assert before.name == after.name == "demo"
    with pytest.raises(FileNotFoundError, match="matches 'nothing'"):
        graphs.read_hlo_dump(tmp_path, "nothing")
    with pytest.raises(FileNotFoundError, match="xla_dump_to"):
        graphs.read_hlo_dump(tmp_path / "missing", "f")


def test_count_retraces_rejects_plain_functions():
    with pytest.raises(TypeError, match="tf.function"):
        graphs.count_retraces(lambda x: x, [(1,)])


def test_count_retraces_with_tensorflow():
    tf = pytest.importorskip("tensorflow")
    fn = tf.function(lambda x, k: x * k)
    assert graphs.count_retraces(fn, [(tf.ones([2]), 2.0), (tf.ones([2]), 3.0), (tf.ones([2]), 3.0)]) == 2
    with pytest.raises(TypeError, match="tuple of arguments"):
        graphs.count_retraces(fn, [tf.ones([2])])


def test_run_in_fresh_process(tmp_path):
    model = graphs.ClipNorm()
    scripted = torch.jit.script(model)
    pt = tmp_path / "clip.pt"
    scripted.save(str(pt))
    x = torch.full((3, 4), 10.0)
    (run,) = graphs.run_in_fresh_process((pt, (x,)))
    with torch.no_grad():
        assert torch.allclose(run.output, model(x))
    assert run.kind == "TorchScript" and run.course_modules == [] and run.model == "clip.pt"


def test_run_in_fresh_process_bad_input(tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        graphs.run_in_fresh_process()
    with pytest.raises(FileNotFoundError, match="save the model first"):
        graphs.run_in_fresh_process((tmp_path / "missing.pt", (torch.ones(1),)))
    other = tmp_path / "model.onnx"
    other.write_text("x")
    with pytest.raises(ValueError, match=r"\.pt2"):
        graphs.run_in_fresh_process((other, (torch.ones(1),)))
    pt = tmp_path / "m.pt"
    pt.write_text("x")
    with pytest.raises(TypeError, match="tensors"):
        graphs.run_in_fresh_process((pt, ([1, 2],)))
    with pytest.raises(TypeError, match="tuple"):
        graphs.run_in_fresh_process(pt)
    with pytest.raises(RuntimeError, match="could not run"):
        graphs.run_in_fresh_process((pt, (torch.ones(1),)))


# ---- lab 02 checks on good and bad answers -------------------------------------------------------------------------


class _GoodCond(graphs.GatedMLP):
    def forward(self, x):
        return torch.cond(
            x.mean() > 0,
            lambda x: x + self.fc2(torch.relu(self.fc1(x))),
            lambda x: x - self.fc2(torch.tanh(self.fc1(x))),
            (x,),
        )


class _WrongBranch(graphs.GatedMLP):
    def forward(self, x):
        return torch.cond(
            x.mean() > 0,
            lambda x: x + self.fc2(torch.relu(self.fc1(x))),
            lambda x: x + self.fc2(torch.tanh(self.fc1(x))),  # wrong sign
            (x,),
        )


class _SwappedCond(graphs.GatedMLP):  # the same decision written the other way round: correct
    def forward(self, x):
        return torch.cond(
            x.mean() <= 0,
            lambda x: x - self.fc2(torch.tanh(self.fc1(x))),
            lambda x: x + self.fc2(torch.relu(self.fc1(x))),
            (x,),
        )


def _both_paths(self, x):
    return torch.where(x.mean() > 0, x + self.fc2(torch.relu(self.fc1(x))), x - self.fc2(torch.tanh(self.fc1(x))))


class _WhereInsideCond(graphs.GatedMLP):  # a do-nothing cond: both branches are the same torch.where
    def forward(self, x):
        return torch.cond(x.mean() > 0, lambda x: _both_paths(self, x), lambda x: _both_paths(self, x), (x,))


class _ConstantPredicate(graphs.GatedMLP):  # a cond whose predicate is always true: the false branch never runs
    def forward(self, x):
        return torch.cond(x.abs().sum() >= 0, lambda x: _both_paths(self, x), lambda x: x * 0, (x,))


def _good_export(model, example):
    return torch.export.export(model, (example,), dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=64)}})


def test_lab02_checks_pass_on_good_answers(capsys):
    lab02.check_cond_model(_GoodCond)
    lab02.check_export(_good_export, _GoodCond)
    out = capsys.readouterr().out
    assert out.count("PASSED") == 2


def test_lab02_cond_check_passes_a_cond_written_the_other_way_round(capsys):
    lab02.check_cond_model(_SwappedCond)
    assert "PASSED" in capsys.readouterr().out


# what an answer would have to contain; no failure message may show it
_ANSWER_TEXT = ("torch.cond(", "dynamic_shapes", "Dim(", "x.mean()", "for _ in range", "steps: int")


def _fails_with(check, *args, match):
    with pytest.raises(LabCheckFailed, match=match) as caught:
        check(*args)
    message = str(caught.value)
    assert not [t for t in _ANSWER_TEXT if t in message], f"the message shows the answer: {message}"
    return message


def test_lab02_checks_explain_bad_answers():
    _fails_with(lab02.check_cond_model, _WrongBranch, match="tanh")
    _fails_with(lab02.check_cond_model, graphs.GatedMLP, match="cannot be traced")  # still a Python if
    _fails_with(lab02.check_export, lambda m, x: torch.export.export(m, (x,)), _GoodCond,  # batch specialized to 4
                match="rejects batch 3.*accepts only that batch size")
    _fails_with(lab02.check_export, lambda m, x: m, _GoodCond, match="ExportedProgram")


def test_lab02_cond_check_runs_each_branch():
    # both pass an eager parity test and export with a cond node: only running each branch tells them apart
    _fails_with(lab02.check_cond_model, _WhereInsideCond, match="both branches of the cond return the same values")
    _fails_with(lab02.check_cond_model, _ConstantPredicate, match="predicate does not follow the input")


class _Loop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, steps: int) -> torch.Tensor:
        for _ in range(steps):
            x = torch.tanh(self.cell(x))
        return x


class _OffByOne(_Loop):
    def forward(self, x: torch.Tensor, steps: int) -> torch.Tensor:
        for _ in range(steps + 1):
            x = torch.tanh(self.cell(x))
        return x


class _Stub(_Loop):
    def forward(self, x: torch.Tensor, steps: int) -> torch.Tensor:
        raise NotImplementedError("TODO: loop")


def test_lab02_scripted_loop_check(capsys):
    lab02.check_scripted_loop(_Loop)
    assert "PASSED" in capsys.readouterr().out
    _fails_with(lab02.check_scripted_loop, _OffByOne, match="steps=1")
    with pytest.raises(LabCheckFailed, match="not written yet"):
        lab02.check_scripted_loop(_Stub)


def test_jit_debug_run_frames_with_and_without_the_jit():
    on, off = graphs.jit_debug_run("1"), graphs.jit_debug_run("0")
    assert on.pytorch_jit == "1" and off.pytorch_jit == "0"
    assert on.good_input_ok and off.good_input_ok
    # JIT on: a ScriptFunction, no Python frame of the function, a RuntimeError whose message marks the source line
    assert not on.is_the_python_function and on.scripted_type == "ScriptFunction"
    assert "rows_to_unit_norm" not in on.python_frames and on.error_type == "RuntimeError"
    assert "vector_norm" in on.here_line()
    # PYTORCH_JIT=0: the function itself, its frame in the traceback, eager PyTorch's own exception type
    assert off.is_the_python_function and "rows_to_unit_norm" in off.python_frames
    assert off.error_type == "IndexError" and off.here_line() == ""


def test_jit_debug_run_bad_flag():
    with pytest.raises(ValueError, match="pytorch_jit must be '0' or '1'"):
        graphs.jit_debug_run("off")


# ---- lab 02 section 5: remove the graph breaks ---------------------------------------------------------------------


def _one_graph(x):  # a correct rewrite: every decision and statistic stays a tensor
    h = torch.tanh(0.5 * x) + 0.05 * x
    peak = h.abs().amax()
    h = torch.where(peak > 1.0, h / peak, h)
    positive = h > 0
    h = h - 0.5 * torch.where(positive, h, 0.0).sum() / positive.sum()
    h = torch.where(h.mean() > 0, torch.relu(h), 0.5 * h)
    return h * torch.sigmoid(h)


def _with_cond(x):  # correct too: the last decision as a torch.cond
    h = torch.tanh(0.5 * x) + 0.05 * x
    peak = h.abs().amax()
    h = torch.where(peak > 1.0, h / peak, h)
    positive = h > 0
    h = h - 0.5 * (h * positive).sum() / positive.sum()
    return torch.cond(h.mean() > 0, lambda h: torch.relu(h) * torch.sigmoid(torch.relu(h)),
                      lambda h: 0.5 * h * torch.sigmoid(0.5 * h), (h,))


def _log_left(x):  # the tensor work rewritten, the log call kept: one break left
    h = torch.tanh(0.5 * x) + 0.05 * x
    peak = h.abs().amax()
    h = torch.where(peak > 1.0, h / peak, h)
    lab02.log.debug("peak %s", "?")
    positive = h > 0
    h = h - 0.5 * torch.where(positive, h, 0.0).sum() / positive.sum()
    h = torch.where(h.mean() > 0, torch.relu(h), 0.5 * h)
    return h * torch.sigmoid(h)


def _one_side_wrong(x):  # the shifted-mean decision's false side scaled by 0.25 instead of 0.5
    h = torch.tanh(0.5 * x) + 0.05 * x
    peak = h.abs().amax()
    h = torch.where(peak > 1.0, h / peak, h)
    positive = h > 0
    h = h - 0.5 * torch.where(positive, h, 0.0).sum() / positive.sum()
    h = torch.where(h.mean() > 0, torch.relu(h), 0.25 * h)
    return h * torch.sigmoid(h)


def _hard_coded(x):  # the branches the lab's example takes (peak > 1, mean <= 0), written without decisions
    h = torch.tanh(0.5 * x) + 0.05 * x
    h = h / h.abs().amax()
    positive = h > 0
    h = h - 0.5 * torch.where(positive, h, 0.0).sum() / positive.sum()
    h = 0.5 * h
    return h * torch.sigmoid(h)


@torch.compiler.disable
def _wraps_the_original(x):  # Dynamo still traces into the original it calls, breaks and all
    return lab02.squash_and_center(x)


_BREAK_ANSWER_TEXT = ("torch.where(", "amax()", ".sum() /", "positive.sum", "torch.cond(")


@pytest.fixture
def _record_speed(monkeypatch):
    from utils import checks

    monkeypatch.setenv(checks.SPEED_TARGETS_VAR, "record")  # a missed gain is printed here, not a test failure


def test_lab02_break_inputs_take_every_branch():
    for seed, shape in ((7, (48, 80)), (8, (48, 80)), (11, lab02.breaks_setup(True)["shape"]),
                        (11, lab02.breaks_setup(False)["shape"])):
        taken = {name: lab02.branches_taken(x) for name, x in lab02.branch_inputs_for_breaks(shape, seed).items()}
        for name, (peak_above, mean_above) in taken.items():
            assert ("peak > 1" in name) == peak_above and ("mean > 0" in name) == mean_above, (seed, name)
    original = graphs.graph_breaks(lab02.squash_and_center, lab02.branch_inputs_for_breaks()["peak > 1, mean <= 0"])
    assert original.graph_count >= 4 and original.break_count >= 3, str(original)  # .item(), log, mask, if tensor


def test_lab02_break_check_modes(monkeypatch):
    from utils.core import env

    smoke, full = lab02.breaks_setup(True), lab02.breaks_setup(False)
    assert smoke["backend"] == "eager" and full["backend"] == ("inductor" if env.has("inductor") else "eager")
    assert full["shape"][0] * full["shape"][1] >= 64 * smoke["shape"][0] * smoke["shape"][1]
    assert full["rounds"] >= 5 and lab02.BREAKS_LINE > 1.0
    # without Inductor (no C++ compiler) full mode times with Dynamo's eager backend and says why: reported, not judged
    monkeypatch.setattr(lab02.env, "has", lambda name: name != "inductor")
    fallback = lab02.breaks_setup(False)
    assert fallback["backend"] == "eager" and fallback["no_inductor"] and not smoke["no_inductor"]


@pytest.mark.parametrize("answer", [_one_graph, _with_cond])
def test_lab02_break_check_passes_a_one_graph_rewrite(answer, capsys, monkeypatch, _record_speed):
    monkeypatch.setenv("WORKBOOK_SMOKE", "1")
    result = lab02.check_graph_breaks(answer)
    out = capsys.readouterr().out
    assert "PASSED graph breaks removed" in out
    assert re.search(r"^FIGURE graph_breaks_speedup: \S+ x \(higher is better\)$", out, re.MULTILINE)
    assert "SMOKE MODE: the gain is reported, not judged" in out
    assert "first call (compile) original" in out and "your rewrite, compiled vs squash_and_center compiled" in out
    assert result["breaks_before"] >= 3 and result["backend"] == "eager"


@pytest.mark.parametrize("wrong, symptom", [
    (lab02.squash_and_center, r"still finds \d+ graphs and \d+ graph break\(s\).*Tensor\.item\(\)"),
    (_log_left, r"still finds 2 graphs and 1 graph break\(s\).*break 1: .*[Ll]ogg"),
    (_one_side_wrong, "differs from squash_and_center on a fresh input where peak <= 1, mean <= 0"),
    (_hard_coded, "differs from squash_and_center on a fresh input where peak <= 1, mean > 0"),
    (_wraps_the_original, r"still finds \d+ graphs"),
])
def test_lab02_break_check_explains_wrong_answers(wrong, symptom, monkeypatch):
    monkeypatch.setenv("WORKBOOK_SMOKE", "1")
    with pytest.raises(LabCheckFailed, match=symptom) as caught:
        lab02.check_graph_breaks(wrong)
    message = str(caught.value)
    assert not [t for t in _BREAK_ANSWER_TEXT if t in message], f"the message shows the answer: {message}"


def test_lab02_break_check_keeps_dynamos_defaults(monkeypatch):
    import torch._dynamo

    monkeypatch.setenv("WORKBOOK_SMOKE", "1")
    with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        with pytest.raises(LabCheckFailed, match="graph break"):  # the settings hide the breaks; the check resets them
            lab02.check_graph_breaks(lab02.squash_and_center)


def test_lab02_break_check_stub():
    def stub(x):
        raise NotImplementedError("TODO: rewrite")

    with pytest.raises(LabCheckFailed, match="not written yet"):
        lab02.check_graph_breaks(stub)
