"""utils.serving.repository (lesson 05): configs from the schema, repository layout, clear errors; and utils.core.data."""

import numpy as np
import pytest

# Triton's model_config protobuf schema ships with tritonclient (the course environment has it; your own may not)
pytest.importorskip("tritonclient", reason="tritonclient is optional: lesson 05's model-config section needs it")

from utils.core.data import labeled_sentences
from utils.serving import repository as tr
from utils.serving.models import MODELS, model_file


def test_model_config_round_trips_through_pbtxt():
    cfg = tr.encoder_config("enc", max_batch_size=16, intra_op_threads=2, allow_spinning=False, instance_count=2,
                            dynamic_batching={"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 100})
    text = tr.to_pbtxt(cfg)
    back = tr.parse_pbtxt(text)
    assert back == cfg
    assert back.backend == "python" and back.max_batch_size == 16
    assert list(back.dynamic_batching.preferred_batch_size) == [4, 8]
    assert back.dynamic_batching.max_queue_delay_microseconds == 100
    assert back.instance_group[0].count == 2
    assert back.parameters["intra_op_threads"].string_value == "2"
    assert back.parameters["allow_spinning"].string_value == "0"
    assert [t.name for t in back.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert list(back.output[0].dims) == [-1, tr.HIDDEN_SIZE]


def test_batching_off_has_no_block_and_platform_variant_has_no_python():
    off = tr.encoder_config("enc", dynamic_batching=None)
    assert not off.HasField("dynamic_batching")
    full = tr.encoder_config("enc", platform=True, dynamic_batching=True)
    assert full.platform == "onnxruntime_onnx" and not full.backend
    assert not full.parameters and full.HasField("dynamic_batching")


def test_platform_encoder_carries_the_measured_threads_under_the_backend_keys():
    # the C++ onnxruntime backend reads intra_op_thread_count / inter_op_thread_count, not model.py's names
    full = tr.encoder_config("enc", platform=True, instance_count=2, intra_op_threads=1, allow_spinning=False)
    params = {k: v.string_value for k, v in full.parameters.items()}
    assert params == {"intra_op_thread_count": "1", "inter_op_thread_count": "1"}
    assert "intra_op_thread_count" in tr.to_pbtxt(full)
    assert "none can spin" in tr.platform_spin_note(full)
    wide = tr.encoder_config("enc", platform=True, intra_op_threads=2)
    assert wide.parameters["intra_op_thread_count"].string_value == "2"
    assert "spin" in tr.platform_spin_note(wide) and "none can" not in tr.platform_spin_note(wide)
    with pytest.raises(ValueError, match="onnxruntime_onnx"):
        tr.platform_spin_note(tr.encoder_config("enc"))
    with pytest.raises(ValueError, match="intra_op_threads"):
        tr.encoder_config("enc", platform=True, intra_op_threads=-1)


def test_parse_rejects_unknown_field_with_its_name():
    with pytest.raises(ValueError, match="max_batch_sise"):
        tr.parse_pbtxt('name: "x"\nmax_batch_sise: 4\n')
    with pytest.raises(TypeError, match="str"):
        tr.parse_pbtxt(b"name: 'x'")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_batch_size=-1), "max_batch_size"),
        (dict(max_batch_size=0, dynamic_batching=True), "needs max_batch_size > 0"),
        (dict(max_batch_size=4, dynamic_batching={"preferred_batch_size": [8]}), "preferred_batch_size"),
        (dict(max_batch_size=4, dynamic_batching={"max_queue_delay": 5}), "unknown dynamic_batching key"),
        (dict(max_batch_size=4, dynamic_batching={"max_queue_delay_microseconds": -1}), "max_queue_delay"),
        (dict(instance_count=0), "instance_count"),
        (dict(kind="KIND_TPU"), "KIND_CPU"),
        (dict(version_policy="newest"), "version_policy"),
        (dict(version_policy=[0]), "version_policy"),
        (dict(platform="onnxruntime_onnx"), "exactly one of backend"),
    ],
)
def test_model_config_bad_input(kwargs, message):
    base = dict(inputs=[("X", "FP32", [4])], outputs=[("Y", "FP32", [4])])
    with pytest.raises(ValueError, match=message):
        tr.model_config("m", **{**base, **kwargs})


@pytest.mark.parametrize(
    "spec, message",
    [(("X", "FLOAT", [1]), "unknown dtype"), (("X", "FP32", []), "dims"), (("X", "FP32", [0]), "dims"),
     (("", "FP32", [1]), "name")],
)
def test_tensor_bad_input(spec, message):
    with pytest.raises(ValueError, match=message):
        tr.tensor(*spec)


def test_version_policies():
    base = dict(inputs=[("X", "FP32", [1])], outputs=[("Y", "FP32", [1])])
    assert tr.model_config("m", version_policy="all", **base).version_policy.HasField("all")
    assert tr.model_config("m", version_policy="latest:2", **base).version_policy.latest.num_versions == 2
    assert list(tr.model_config("m", version_policy=[1, 3], **base).version_policy.specific.versions) == [1, 3]


def test_ensemble_checks_tensor_wiring():
    good = tr.pipeline_config("ens", num_classes=4)
    assert good.platform == "ensemble"
    steps = good.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["preprocess", "encoder", "postprocess"]
    assert steps[2].model_version == -1
    assert tr.pipeline_config("e", num_classes=4, encoder="encoder_x2").ensemble_scheduling.step[1].model_name == \
        "encoder_x2"
    with pytest.raises(ValueError, match="no earlier step"):
        tr.ensemble_config("e", max_batch_size=4, inputs=[("A", "FP32", [1])], outputs=[("B", "FP32", [1])],
                           steps=[{"model": "m", "input_map": {"x": "MISSING"}, "output_map": {"y": "B"}}])
    with pytest.raises(ValueError, match="produced by no step"):
        tr.ensemble_config("e", max_batch_size=4, inputs=[("A", "FP32", [1])], outputs=[("B", "FP32", [1])],
                           steps=[{"model": "m", "input_map": {"x": "A"}, "output_map": {"y": "C"}}])


def test_build_pipeline_layout(tmp_path, assets):
    onnx, tok, clf = assets
    repo = tmp_path / "repo"
    folders = tr.build_pipeline(repo, onnx_path=onnx, tokenizer_json=tok, classifiers={1: clf, 2: clf}, num_classes=3,
                                version_policy=[1, 2], dynamic_batching=True, seq_len=16)
    assert set(folders) == {"preprocess", "encoder", "postprocess", "ensemble"}
    assert (repo / "encoder" / "1" / "model.onnx").resolve() == onnx.resolve()
    assert (repo / "postprocess" / "2" / "classifier.npz").is_file()
    assert "TritonPythonModel" in (repo / "preprocess" / "1" / "model.py").read_text()
    configs = tr.repository_configs(repo)
    assert set(configs) == set(folders)
    assert list(configs["postprocess"].version_policy.specific.versions) == [1, 2]
    assert list(configs["preprocess"].output[0].dims) == [16]
    # rebuilding replaces the folders (no stale versions), the full-container variant has no model.py
    tr.build_pipeline(repo, onnx_path=onnx, tokenizer_json=tok, classifiers={2: clf}, num_classes=3,
                      encoder_platform=True)
    assert not (repo / "postprocess" / "1").exists()
    assert sorted(p.name for p in (repo / "encoder" / "1").iterdir()) == ["model.onnx"]
    assert tr.read_config(repo / "encoder").platform == "onnxruntime_onnx"


def test_build_pipeline_missing_file(tmp_path, assets):
    onnx, tok, clf = assets
    with pytest.raises(FileNotFoundError, match="onnx_path"):
        tr.build_pipeline(tmp_path / "r", onnx_path=tmp_path / "nope.onnx", tokenizer_json=tok, classifiers={1: clf},
                          num_classes=3)
    with pytest.raises(FileNotFoundError, match="config.pbtxt"):
        tr.read_config(tmp_path)


def test_write_classifier_without_pickle(tmp_path):
    path = tr.write_classifier(tmp_path / "c.npz", np.ones((4, 2)), np.zeros(2), ["x", "y"])
    with np.load(path, allow_pickle=False) as data:
        assert data["weight"].dtype == np.float32 and data["labels"].tolist() == ["x", "y"]
    with pytest.raises(ValueError, match="expected weight"):
        tr.write_classifier(tmp_path / "d.npz", np.ones((4, 2)), np.zeros(3), ["x", "y"])


def test_write_model_rejects_bad_version(tmp_path):
    cfg = tr.model_config("m", inputs=[("X", "FP32", [1])], outputs=[("Y", "FP32", [1])])
    with pytest.raises(ValueError, match="positive ints"):
        tr.write_model(tmp_path, cfg, {0: {"model.py": ""}})


def test_labeled_sentences_splits():
    texts, labels, classes = labeled_sentences()
    train, train_y, _ = labeled_sentences("train")
    test, test_y, _ = labeled_sentences("test")
    assert len(texts) == 240 and classes == sorted(set(labels)) and len(classes) == 4
    assert len(train) + len(test) == len(texts) and not set(train) & set(test)
    assert all(test_y.count(c) == len(test) // 4 for c in classes)
    with pytest.raises(ValueError, match="split"):
        labeled_sentences("validation")


def test_model_programs_are_package_files_copied_into_the_repository(tmp_path, assets):
    for name in MODELS:
        text = tr.model_source(name)
        assert text == model_file(name).read_text() and "class TritonPythonModel" in text
        assert "def execute(self, requests)" in text
    with pytest.raises(ValueError, match="expected one of"):
        model_file("tokenizer")
    onnx, tok, clf = assets
    tr.build_pipeline(tmp_path / "repo", onnx_path=onnx, tokenizer_json=tok, classifiers={1: clf}, num_classes=3)
    copy = tmp_path / "repo" / "encoder" / "1" / "model.py"
    assert not copy.is_symlink() and copy.read_text() == tr.model_source("encoder")  # a copy, not a link


def test_function_source_reads_a_method_without_importing(tmp_path):
    path = tmp_path / "model.py"
    path.write_text("import not_installed_anywhere\n\n\nclass M:\n    def a(self):\n        return 1\n\n"
                    "    @staticmethod\n    def b(x):\n        return x\n")
    assert tr.function_source(path, "M.a") == "def a(self):\n    return 1\n"
    assert tr.function_source(path, "M.b").startswith("@staticmethod\ndef b(x):")
    with pytest.raises(ValueError, match="no 'M.c'"):
        tr.function_source(path, "M.c")
    execute = tr.function_source(model_file("encoder"), "TritonPythonModel.execute")
    assert execute.startswith("def execute(self, requests):") and "self.session.run" in execute


def test_warmup_and_response_cache_in_the_config():
    cfg = tr.encoder_config("enc", max_batch_size=8, warmup_batch_sizes=(1, 8), seq_len=16,
                            dynamic_batching={"preferred_batch_size": [8], "max_queue_delay_microseconds": 500})
    back = tr.parse_pbtxt(tr.to_pbtxt(cfg))
    assert [(w.name, w.batch_size, w.count) for w in back.model_warmup] == [("zeros_batch_1", 1, 1),
                                                                             ("zeros_batch_8", 8, 1)]
    assert {k: (list(v.dims), v.zero_data) for k, v in back.model_warmup[1].inputs.items()} == {
        n: ([16], True) for n in tr.ENCODER_INPUTS}
    assert not tr.encoder_config("enc").model_warmup
    ens = tr.pipeline_config("e", num_classes=3, response_cache=True)
    assert tr.parse_pbtxt(tr.to_pbtxt(ens)).response_cache.enable
    assert not tr.pipeline_config("e", num_classes=3).HasField("response_cache")


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(warmup_batch_sizes=(1,)), "seq_len"), (dict(warmup_batch_sizes=(64,), seq_len=16), "exceeds max_batch_size"),
     (dict(warmup_batch_sizes=(0,), seq_len=16), "positive ints")],
)
def test_warmup_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tr.encoder_config("enc", max_batch_size=8, **kwargs)


def test_warmup_sample_needs_every_input_with_concrete_dims():
    with pytest.raises(ValueError, match="variable"):
        tr.warmup_sample("w", [("X", "FP32", [-1])])
    base = dict(inputs=[("X", "FP32", [4]), ("Y", "FP32", [4])], outputs=[("Z", "FP32", [4])], max_batch_size=4)
    with pytest.raises(ValueError, match="every input"):
        tr.model_config("m", warmup=[tr.warmup_sample("w", [("X", "FP32", [4])])], **base)
    with pytest.raises(ValueError, match="warmup_sample"):
        tr.model_config("m", warmup=[{"name": "w"}], **base)


def test_encoder_variants_share_preprocess_and_postprocess(tmp_path, assets):
    onnx, tok, clf = assets
    repo = tmp_path / "repo"
    with pytest.raises(FileNotFoundError, match="with_encoder=False"):
        tr.encoder_variant(repo, "a", onnx_path=onnx, num_classes=3)
    folders = tr.build_pipeline(repo, onnx_path=onnx, tokenizer_json=tok, classifiers={1: clf}, num_classes=3,
                                with_encoder=False)
    assert set(folders) == {"preprocess", "postprocess"}
    name = tr.encoder_variant(repo, "p0", onnx_path=onnx, num_classes=3, instance_count=2,
                              dynamic_batching={"preferred_batch_size": [8], "max_queue_delay_microseconds": 100})
    assert name == "ensemble_p0"
    configs = tr.repository_configs(repo)
    assert [s.model_name for s in configs[name].ensemble_scheduling.step] == ["preprocess", "encoder_p0", "postprocess"]
    assert configs["encoder_p0"].instance_group[0].count == 2
    with pytest.raises(ValueError, match="tag"):
        tr.encoder_variant(repo, "p-1", onnx_path=onnx, num_classes=3)


def test_encoder_batching_overrides_the_members_batching(tmp_path, assets):
    onnx, tok, clf = assets
    tr.build_pipeline(tmp_path, onnx_path=onnx, tokenizer_json=tok, classifiers={1: clf}, num_classes=3,
                      dynamic_batching={"max_queue_delay_microseconds": 0}, encoder_batching=None)
    configs = tr.repository_configs(tmp_path)
    assert configs["preprocess"].HasField("dynamic_batching") and not configs["encoder"].HasField("dynamic_batching")
