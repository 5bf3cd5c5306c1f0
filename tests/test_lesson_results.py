"""What each lesson must record, and that only GPU-only sections were skipped.

The lesson notebooks run earlier in the same session through nbval (conftest orders this file last). When a lesson's
results are missing (e.g. this file was run alone) the notebook is executed here with papermill in smoke mode.
"""

import json
import os
from pathlib import Path

import pytest

from tests.gpu_only_sections import GPU_ONLY_SECTIONS
from utils import env
from utils.run import lesson_notebooks, run_notebook

REQUIRED_METRICS = {
    "00_environment": [
        "cpu_copy_gbps", "cpu_matmul_gflops", "gpu_available", "tritonserver_available", "tensorrt_available",
        "nvcc_available",
    ],
    "01_inference_modes": [
        "first_call_over_steady", "resnet18_bs32_vs_bs1_throughput", "no_grad_memory_saved_mb",
        "inference_mode_vs_no_grad_speedup", "eval_vs_train_max_abs_diff", "keras_call_vs_predict_speedup",
        "savedmodel_reload_max_abs_diff", "resnet50_int8_dynamic_size_ratio", "weights_only_blocks_pickle",
        # read by the course report's claims table (utils.claims)
        "minilm_int8_dynamic_size_ratio", "state_dict_over_whole_model_size",
    ],
    "02_graphs": [
        "trace_wrong_on_other_branch", "script_correct_both_branches", "export_cond_correct_both_branches",
        "compile_graph_breaks_before", "compile_graph_breaks_after", "compile_speedup_resnet50",
        "freeze_speedup_resnet50", "tf_retraces_without_signature", "tf_retraces_with_signature", "xla_jit_speedup",
        "script_speedup_resnet50",  # the claims table's "TorchScript 10-30% faster"
    ],
    "03_profiling_amp": [
        "baseline_step_ms", "optimized_step_ms", "train_speedup", "amp_speedup", "channels_last_speedup",
        "dataloader_workers_speedup", "amp_loss_max_rel_diff", "trace_events", "top_bottleneck_before",
        "top_bottleneck_after", "amp_prediction", "amp_prediction_held", "compute_bound_step_ms", "loop_efficiency",
        "baseline_efficiency",
    ],
    "04_onnx_tensorrt": [
        "onnx_parity_max_abs", "ort_speedup_vs_eager_bs8", "ort_nodes_before_opt", "ort_nodes_after_opt",
        "constant_folding_nodes_removed", "bert_fused_attention_nodes", "int8_size_ratio", "int8_top1_agreement",
        "int8_speedup", "digits_int8_accuracy_drop", "tf2onnx_parity_max_abs", "custom_op_ort_parity_max_abs",
        "graph_pass_nodes_removed", "graph_pass_parity_max_abs", "graph_pass_ort_speedup",
        "preprocess_in_graph_parity_max_abs", "conversion_gate_checks",
    ],
    "05_triton_ensemble": [
        "dynamic_batching_throughput_gain", "p95_ms_batching", "p95_ms_no_batching", "ensemble_parity_max_abs",
        "bad_requests_rejected", "healthy_after_bad_requests", "load_requests", "load_requests_failed_or_wrong",
        "bound_to_loopback_only", "mean_batch_size_formed",
    ],
    "06_fused_softmax": [
        "softmax_speedup_vs_torch_geomean", "softmax_speedup_vs_naive_geomean", "softmax_best_fraction_of_copy_bw",
        "softmax_large_fraction_of_copy_bw", "opcheck_passed", "gradcheck_passed",
    ],
    "07_interview_prep": ["bank_questions", "code_proofs_run", "code_proofs_passed"],
}

# Required metrics that an optional section records: excused when that section was skipped here (a machine, or your
# own environment, without TensorFlow, onnxruntime-extensions or the Triton server). GPU metrics are not required.
SECTION_METRICS = {
    "01.keras": ["keras_call_vs_predict_speedup", "savedmodel_reload_max_abs_diff"],
    "02.tf-function": ["tf_retraces_without_signature", "tf_retraces_with_signature", "xla_jit_speedup"],
    "04.tensorflow": ["tf2onnx_parity_max_abs"],
    "04.ort-custom-op": ["custom_op_ort_parity_max_abs"],
    "05.model-config": REQUIRED_METRICS["05_triton_ensemble"],
    "05.triton": REQUIRED_METRICS["05_triton_ensemble"],
}

LESSONS = [p for p in lesson_notebooks() if p.stem in REQUIRED_METRICS]


def _results(nb: Path) -> dict:
    path = env.build_dir() / "results" / f"{nb.stem}.json"
    if not path.exists():
        run_notebook(nb, env.build_dir() / "executed", smoke=True)
    return json.loads(path.read_text())


@pytest.mark.parametrize("nb", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_recorded_its_metrics(nb):
    data = _results(nb)
    assert data["notebook"] == nb.stem
    excused = {m for section in data.get("skipped", {}) for m in SECTION_METRICS.get(section, [])}
    missing = [m for m in REQUIRED_METRICS[nb.stem] if m not in data["metrics"] and m not in excused]
    assert not missing, f"{nb.name} did not record {missing} (recorded: {sorted(data['metrics'])})"
    for name, value in data["metrics"].items():
        assert isinstance(value, bool | int | float | str), f"{name}: {value!r}"


@pytest.mark.parametrize("nb", LESSONS, ids=[p.stem for p in LESSONS])
def test_only_gpu_sections_skipped(nb):
    data = _results(nb)
    for section, reason in data.get("skipped", {}).items():
        assert section in GPU_ONLY_SECTIONS, (
            f"{nb.name} skipped section {section!r} ({reason}) which is not listed in tests/gpu_only_sections.py"
        )
        cap = GPU_ONLY_SECTIONS[section]
        assert not env.has(cap), f"{nb.name} skipped {section!r} although this machine has {cap}"
        assert section.startswith(nb.stem[:2] + "."), f"section {section!r} belongs to another lesson"


def test_section_metrics_name_required_metrics_of_optional_sections():
    for section, metrics in SECTION_METRICS.items():
        assert section in env.OPTIONAL_SECTIONS, section
        lesson = next(stem for stem in REQUIRED_METRICS if stem.startswith(section[:2]))
        assert set(metrics) <= set(REQUIRED_METRICS[lesson]), (section, set(metrics) - set(REQUIRED_METRICS[lesson]))


def test_every_lesson_has_a_contract():
    stems = {p.stem for p in lesson_notebooks()}
    unknown = sorted(stems - set(REQUIRED_METRICS))
    assert not unknown, f"lesson notebooks without required metrics in {__file__}: {unknown}"
    assert os.environ.get("WORKBOOK_SMOKE") == "1"
