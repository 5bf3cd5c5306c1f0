"""What each lesson must record (its results contract): read by tests/notebooks/test_lesson_results.py, which runs
the lessons, and by the unit tests of the claims table and the interview bank, which must only name metrics that a
lesson promises.
"""

REQUIRED_METRICS = {
    "00_environment": [
        # the course's memory roof (copy into an existing buffer) in and out of cache, and allocate + copy beside it
        "copy_into_gbps_dram", "copy_into_gbps_cache", "clone_gbps_dram", "ridge_flop_per_byte",
        "softmax_over_copy_time", "bf16_over_fp32_matmul",
        "cpu_matmul_gflops", "gpu_available", "tritonserver_available", "tensorrt_available", "nvcc_available",
    ],
    "01_inference_modes": [
        "no_grad_memory_saved_mb", "inference_mode_vs_no_grad_speedup", "eval_vs_train_max_abs_diff",
        "weights_only_blocks_pickle",
        # read by the course report's claims table (utils.core.claims)
        "state_dict_over_whole_model_size",
        # portability of a state dict vs a whole-model pickle (section 2)
        "whole_model_pickle_globals", "state_dict_pickle_globals", "state_dict_survives_code_move",
        "whole_model_survives_code_move",
    ],
    "01_serving_basics": [
        "first_call_over_steady", "resnet18_bs32_vs_bs1_throughput", "keras_call_vs_predict_speedup",
        "savedmodel_reload_max_abs_diff", "resnet50_int8_dynamic_size_ratio",
        # read by the course report's claims table (utils.core.claims)
        "minilm_int8_dynamic_size_ratio",
        # batching with its interval, the checkpointing prediction and the int8 acceptance line (review 2026-11-25)
        "resnet50_max_batch_vs_bs1_throughput", "new_shape_first_over_steady", "grad_checkpoint_time_ratio",
        "grad_checkpoint_time_ratio_3_segments", "minilm_int8_embedding_min_cosine",
        # Keras compile and file formats (section 7, TensorFlow-gated: excused in SECTION_METRICS["01.keras"])
        "keras_predict_without_compile", "keras_fit_requires_compile", "keras_format_reload_max_abs_diff",
        "h5_reload_max_abs_diff", "keras_format_size_kb", "h5_size_kb", "savedmodel_size_kb",
    ],
    "02_graphs": [
        # part 1, capturing a graph: trace vs script (section 2), torch.export (section 3)
        "trace_wrong_on_other_branch", "script_correct_both_branches", "export_cond_correct_both_branches",
        "pytorch_jit0_debuggable",
    ],
    "02_jit_compilers": [
        # part 2 of lesson 02, compiling graphs: torch.compile (section 5), freezing and the ResNet-50 comparison (6)
        "compile_graph_breaks_before", "compile_graph_breaks_after", "compile_speedup_resnet50",
        "freeze_speedup_resnet50", "tf_retraces_without_signature", "tf_retraces_with_signature", "xla_jit_speedup",
        "script_speedup_resnet50",  # the claims table's "TorchScript 10-30% faster"
        # torch.compile's one-time start-up in the process, apart from the MLP's own compile (its payback uses the latter)
        "compile_startup_first_call_s", "compile_mlp_first_call_s",
        # XLA on a CNN training step (section 8, TensorFlow-gated: excused in SECTION_METRICS["02.tf-function"])
        "xla_cnn_train_speedup", "xla_cnn_vs_eager_speedup", "xla_cnn_first_step_s", "xla_cnn_loss_max_rel_diff",
        "xla_cnn_prediction_held", "xla_cnn_fusions", "xla_cnn_keras_auto_jit_compile",
    ],
    "03_profiling_amp": [
        # part 1: the profile, the hand fix and the ablation (sections 1-5), its product checked against a direct run
        "channels_last_speedup", "dataloader_workers_speedup", "trace_events", "top_bottleneck_before",
        "ablation_speedup",
    ],
    "03_training_bound": [
        # part 2: AMP predicted then measured (section 6), slow vs optimized vs the compute bound (section 7)
        "baseline_step_ms", "optimized_step_ms", "train_speedup", "amp_speedup", "amp_loss_max_rel_diff",
        "top_bottleneck_after", "amp_prediction", "amp_prediction_held", "compute_bound_step_ms", "loop_efficiency",
        "baseline_efficiency",
        # the same step in PyTorch Lightning (section 8, optional: excused in SECTION_METRICS["03.lightning"])
        "lightning_loss_max_rel_diff", "lightning_step_overhead_ms", "lightning_vs_loop_step",
        "lightning_prediction_held", "lightning_detection_limit_ms",
    ],
    "04_onnx_tensorrt": [
        "onnx_parity_max_abs", "ort_speedup_vs_eager_bs8", "ort_nodes_before_opt", "ort_nodes_after_opt",
        "constant_folding_nodes_removed", "bert_fused_attention_nodes",
        "openvino_parity_max_abs", "tvm_parity_max_abs", "tvm_build_s", "tvm_vs_ort_speedup",
        "graph_pass_nodes_removed", "graph_pass_parity_max_abs", "graph_pass_ort_speedup",
        "preprocess_in_graph_parity_max_abs", "ort_level_all_vs_disabled",
        "bert_fused_file_vs_exported_bs1", "bert_ort_speedup_vs_eager_bs1",
    ],
    "04_porting": [
        # int8 (section 5), TensorFlow (6), the custom op (7), the conversion gate (8b) of lesson 04, part 2
        "int8_size_ratio", "int8_top1_agreement", "int8_speedup", "digits_int8_accuracy_drop", "tf2onnx_parity_max_abs",
        "custom_op_ort_parity_max_abs", "conversion_gate_checks",
    ],
    "04_quantization": [
        # the affine mapping and the integer matmul (section 1)
        "affine_roundtrip_max_error_steps", "per_channel_error_gain", "int_matmul_exact",
        "matmul_error_rms_over_predicted",
        # calibration methods with and without outliers (section 2), PTQ against QAT (section 3)
        "digits_mlp_fp32_accuracy", "calib_minmax_glitched_input_max", "calib_percentile_glitched_input_max",
        "calib_entropy_glitched_input_max", "calib_minmax_glitch_cost_pp", "calib_percentile_glitch_cost_pp",
        "calib_entropy_glitch_cost_pp", "fake_quant_vs_torch_max_abs", "qat_vs_ptq_accuracy_4bit",
        "qat_vs_ptq_accuracy_8bit", "qat_vs_ptq_accuracy_2bit", "ptq_4bit_accuracy_drop",
        # weight-only 4-bit on TinyGPT (section 4) and SmoothQuant (section 5)
        "int4_bytes_per_weight", "int4_size_ratio_vs_fp32", "gptq_vs_rtn_drift", "awq_vs_rtn_drift",
        "int4_rtn_loss_delta", "int4_gptq_loss_delta", "int4_awq_loss_delta", "smoothquant_w8a8_drift",
    ],
    "04_sparsity_distillation": [
        # unstructured magnitude pruning: the mask, accuracy, dense zeros and CSR timed (section 1)
        "digits_mlp_dense_accuracy", "unstructured_mask_matches_torch", "unstructured_accuracy_drop_50_pp",
        "unstructured_accuracy_drop_90_pp", "unstructured_90_finetuned_accuracy_drop_pp", "unstructured_90_sparsity",
        "csr_parity_max_abs", "unstructured_zeros_speedup_50", "unstructured_zeros_speedup_90", "csr_speedup_50",
        "csr_speedup_90",
        # structured pruning (section 2) and distillation (section 3)
        "structured_rebuild_parity_max_abs", "structured_flop_ratio", "structured_pruning_speedup",
        "structured_accuracy_drop_before_finetune_pp", "structured_accuracy_drop_after_finetune_pp",
        "distill_kl_by_hand_max_abs", "distill_vs_hard_accuracy", "distill_accuracy_gain_pp",
        "distill_student_seed_spread_pp",
    ],
    "05_triton_ensemble": [
        # part 1: the repository, the server's lifecycle, the batching sweep, the deployment served (sections 1-6)
        "ensemble_parity_max_abs", "bound_to_loopback_only", "sweep_winner", "sweep_p95_budget_ms",
        "server_and_stubs_gone",
    ],
    "05_triton_under_load": [
        # part 2: the rebuilt deployment checked again, then under load (sections 7-15)
        "dynamic_batching_throughput_gain", "p95_ms_batching", "p95_ms_no_batching", "ensemble_parity_max_abs",
        "load_requests", "load_requests_failed_or_wrong",
        "bound_to_loopback_only", "mean_batch_size_formed", "batching_gain_upper_bound", "batching_gain_vs_upper_bound",
        "first_request_ms_cold", "first_request_ms_warm", "response_cache_available", "replicas_needed",
        "k8s_manifest_valid", "server_and_stubs_gone",
    ],
    "05_triton_vs_torchserve": [
        # part 3: the server hardened (section 14), then the same pipeline on TorchServe (section 15)
        "ensemble_parity_max_abs", "bound_to_loopback_only", "bad_requests_rejected", "healthy_after_bad_requests",
        "chunked_request_killed_server", "serving_after_chunked_request", "server_and_stubs_gone",
        # TorchServe is optional: excused in SECTION_METRICS["05.torchserve"]
        "torchserve_parity_max_abs", "torchserve_p50_ms", "torchserve_p95_ms", "torchserve_vs_triton_p50",
        "torchserve_stopped_clean",
    ],
    "06_fused_softmax": [
        "softmax_speedup_vs_torch_geomean", "softmax_speedup_vs_naive_geomean", "softmax_best_fraction_of_copy_bw",
        "softmax_large_fraction_of_roof", "softmax_speedup_vs_torch_same_exp_geomean",
        "opcheck_passed", "gradcheck_passed",
        # the documented operator path (the C++ op with a fake kernel and autograd from Python) and its per-call cost
        "custom_op_speed_over_cpp_op",
    ],
    "06_gpu_kernels_triton": [
        # the softmax in the Triton language, in Triton's interpreter (excused in SECTION_METRICS["06.triton-interpreter"])
        "triton_softmax_parity_max_abs", "tiled_matmul_global_bytes_ratio",
    ],
    "06_numerics": [
        # summation error against an exact reference (section 1)
        "summation_order_as_predicted", "naive_sum_error_ulps", "torch_sum_error_ulps", "kahan_vs_naive_error",
        "naive_error_growth_slope", "kahan_vs_naive_error_worst_case",
        # batch invariance on lesson 07's TinyGPT and a batch-invariant matmul (section 2)
        "batch_invariance_max_diff", "batch_invariant_max_diff", "batch_invariant_bitwise",
        "batch_invariant_matmul_speedup", "batch_invariant_decode_speedup",
        # low-precision accumulation and the softmax's max subtraction (section 3)
        "bf16_accumulation_rel_error", "softmax_textbook_nan_rows", "softmax_stable_max_abs",
    ],
    "08_interview_prep": ["bank_questions", "code_proofs_run", "code_proofs_passed"],
    "07_llm_inference": [
        "kv_cache_speedup_at_max_len", "kv_cache_token_parity", "kv_cache_logit_parity", "kv_cache_bytes_per_token",
        # FlashAttention in the Triton language, in the interpreter (excused in SECTION_METRICS["07.triton-flash-attention"])
        "triton_flash_attention_parity_max_abs", "triton_flash_attention_bytes_ratio",
        "tiled_attention_parity_max_abs", "attention_naive_over_tiled_peak_memory", "decode_fraction_of_memory_bound",
        "prefill_over_decode_tokens_per_s",
    ],
    "07_llm_scheduling": [
        # static vs continuous batching (section 1, with the paged KV blocks counted) and weight-only int8 (section 2)
        "continuous_vs_static_throughput", "continuous_vs_static_tpot_speed", "serving_all_tokens_correct",
        "static_padding_waste_fraction", "kv_paged_waste_fraction", "int8_weight_size_ratio", "int8_logit_max_rel_diff",
    ],
    "07_llm_tuning": [
        # chunked prefill under a per-step token budget (section 1), an int8 KV cache (section 2)
        "chunked_prefill_itl_p95_ratio", "chunked_prefill_itl_max_ratio", "chunked_prefill_prediction_held",
        "chunked_prefill_long_ttft_cost", "chunked_prefill_throughput_ratio", "chunked_prefill_wrong_tokens",
        "int8_kv_bytes_ratio", "int8_kv_logit_drift", "int8_kv_greedy_agreement", "int8_kv_loss_delta",
        "int8_kv_decode_speedup",
        # the largest max_batch within a TTFT/TPOT p95 budget (section 3)
        "batch_sweep_best_batch", "batch_sweep_prediction_held", "batch_sweep_throughput_gain",
        "batch_sweep_ttft_p95_ms", "batch_sweep_tpot_p95_ms", "batch_sweep_wrong_tokens", "batch_sweep_budget_ms",
    ],
    "07_llm_serving": [
        "paged_logit_parity", "paged_serving_capacity_gain", "paged_serving_throughput_gain", "paged_serving_all_greedy",
        "prefix_cache_logits_max_abs", "prefix_cache_ttft_saved", "prefix_cache_hit_rate", "spec_decode_greedy_identical",
        "spec_decode_speedup", "spec_decode_speedup_best_k", "spec_decode_acceptance_rate", "spec_decode_distribution_pvalue",
        "spec_decode_wrong_rule_pvalue", "gqa_kv_bytes_ratio",
    ],
}

# Required metrics that an optional section records: excused when that section was skipped here (a machine, or your
# own environment, without TensorFlow, onnxruntime-extensions or the Triton server). GPU metrics are not required.
SECTION_METRICS = {
    "02.compile": ["compile_speedup_resnet50", "compile_startup_first_call_s", "compile_mlp_first_call_s"],
    "06.cpu-kernel": [
        "softmax_speedup_vs_torch_geomean", "softmax_speedup_vs_naive_geomean", "softmax_best_fraction_of_copy_bw",
        "softmax_large_fraction_of_roof", "softmax_speedup_vs_torch_same_exp_geomean", "opcheck_passed",
        "gradcheck_passed", "custom_op_speed_over_cpp_op",
    ],
    "01.keras": [
        "keras_call_vs_predict_speedup", "savedmodel_reload_max_abs_diff", "keras_predict_without_compile",
        "keras_fit_requires_compile", "keras_format_reload_max_abs_diff", "h5_reload_max_abs_diff",
        "keras_format_size_kb", "h5_size_kb", "savedmodel_size_kb",
    ],
    "02.tf-function": [
        "tf_retraces_without_signature", "tf_retraces_with_signature", "xla_jit_speedup",
        "xla_cnn_train_speedup", "xla_cnn_vs_eager_speedup", "xla_cnn_first_step_s", "xla_cnn_loss_max_rel_diff",
        "xla_cnn_prediction_held", "xla_cnn_fusions", "xla_cnn_keras_auto_jit_compile",
    ],
    "03.lightning": [
        "lightning_loss_max_rel_diff", "lightning_step_overhead_ms", "lightning_vs_loop_step",
        "lightning_prediction_held", "lightning_detection_limit_ms",
    ],
    "04.tensorflow": ["tf2onnx_parity_max_abs"],
    "04.ort-custom-op": ["custom_op_ort_parity_max_abs"],
    "04.openvino": ["openvino_parity_max_abs"],
    "04.tvm": ["tvm_parity_max_abs", "tvm_build_s", "tvm_vs_ort_speedup"],
    "05.model-config": [*REQUIRED_METRICS["05_triton_ensemble"], *REQUIRED_METRICS["05_triton_under_load"],
                        *REQUIRED_METRICS["05_triton_vs_torchserve"]],
    "05.triton": [*REQUIRED_METRICS["05_triton_ensemble"], *REQUIRED_METRICS["05_triton_under_load"],
                  *REQUIRED_METRICS["05_triton_vs_torchserve"]],
    "05.k8s-manifest": ["k8s_manifest_valid"],
    "05.torchserve": [
        "torchserve_parity_max_abs", "torchserve_p50_ms", "torchserve_p95_ms", "torchserve_vs_triton_p50",
        "torchserve_stopped_clean",
    ],
    "06.triton-interpreter": ["triton_softmax_parity_max_abs", "tiled_matmul_global_bytes_ratio"],
    "07.triton-flash-attention": ["triton_flash_attention_parity_max_abs", "triton_flash_attention_bytes_ratio"],
}
