"""utils.inference (lesson 01): predict, boundary checks, autograd memory, sizes (correctness only, no timings)."""

import itertools

import numpy as np
import pytest
import torch

from utils import inference
from utils.checks import LabCheckFailed, lab01


@pytest.fixture
def net():
    return inference.tiny_cnn(seed=0)


def test_tiny_cnn_is_seeded_and_in_train_mode():
    a, b = inference.tiny_cnn(seed=3), inference.tiny_cnn(seed=3)
    assert a.training
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert any(isinstance(m, torch.nn.Dropout) for m in a.modules())
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in a.modules())


def test_predict_matches_eval_forward_and_builds_no_graph(net):
    x = torch.randn(11, 3, 32, 32)
    out = inference.predict(net, x, max_batch=4)
    assert not net.training, "predict leaves the model in eval mode"
    with torch.no_grad():
        expected = net(x)
    assert out.shape == (11, 10) and out.device.type == "cpu"
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert out.grad_fn is None and not out.requires_grad


def test_predict_respects_max_batch(net):
    seen = []
    net.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    inference.predict(net, torch.randn(10, 3, 16, 16), max_batch=4)
    assert seen == [4, 4, 2]
    with pytest.raises(ValueError, match="max_batch must be a positive int, got 0"):
        inference.predict(net, torch.randn(2, 3, 16, 16), max_batch=0)
    with pytest.raises(ValueError, match="True"):
        inference.predict(net, torch.randn(2, 3, 16, 16), max_batch=True)


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (torch.randn(3, 32, 32), ValueError, r"3-D tensor of shape \(3, 32, 32\).*unsqueeze\(0\)"),
        (torch.randn(2, 32, 32, 3), ValueError, r"3 channels.*\(2, 32, 32, 3\).*permute\(0, 3, 1, 2\)"),
        (torch.randn(2, 1, 32, 32), ValueError, r"3 channels.*\(2, 1, 32, 32\)"),
        (torch.randn(0, 3, 32, 32), ValueError, "empty batch"),
        (torch.randn(2, 3), ValueError, "2-D tensor"),
        (torch.zeros(2, 3, 8, 8, dtype=torch.uint8), TypeError, r"torch.uint8.*float\(\)"),
        (np.zeros((2, 3, 8, 8), dtype=np.float32), TypeError, r"numpy.ndarray with shape \(2, 3, 8, 8\)"),
        ([1, 2, 3], TypeError, "builtins.list"),
    ],
)
def test_validate_images_explains_bad_input(bad, error, message):
    with pytest.raises(error, match=message):
        inference.validate_images(bad)


def test_validate_images_accepts_good_input_and_min_size():
    x = torch.randn(2, 3, 8, 8)
    assert inference.validate_images(x) is x
    assert inference.validate_images(torch.randn(1, 1, 8, 8), channels=1) is not None
    with pytest.raises(ValueError, match="at least 16x16"):
        inference.validate_images(x, min_size=16)


def test_model_device_and_mismatch_errors(net):
    assert inference.model_device(net) == torch.device("cpu")
    with pytest.raises(ValueError, match="no parameters or buffers"):
        inference.model_device(torch.nn.ReLU())
    with pytest.raises(TypeError, match="torch.nn.Module"):
        inference.model_device("not a model")
    split = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).to("meta"))
    with pytest.raises(inference.DeviceMismatchError, match=r"several devices \['cpu', 'meta'\]"):
        inference.model_device(split)


def test_check_same_device_names_input_and_fix():
    lin = torch.nn.Linear(4, 2)
    x = torch.randn(1, 4)
    assert inference.check_same_device(lin, x) == torch.device("cpu")
    with pytest.raises(inference.DeviceMismatchError, match=r"images is on meta but .* on cpu: .*x.to\('cpu'\)"):
        inference.check_same_device(lin, x, x.to("meta"), names=["x", "images"])
    with pytest.raises(ValueError, match="2 tensors but 1 names"):
        inference.check_same_device(lin, x, x, names=["x"])
    with pytest.raises(TypeError, match="input 0 must be a torch.Tensor"):
        inference.check_same_device(lin, [1.0])


def test_autograd_saved_bytes_counts_activations_only_with_grad():
    lin = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    x = torch.randn(64, 256)
    nbytes, out = inference.autograd_saved_bytes(lambda: lin(x), exclude=lin.parameters())
    assert out.grad_fn is not None
    # the first Linear saves x, the ReLU its output, the second Linear its input (the same storage as ReLU's output)
    assert nbytes == 2 * 64 * 256 * 4
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            assert inference.autograd_saved_bytes(lambda: lin(x))[0] == 0
    with pytest.raises(TypeError, match="callable"):
        inference.autograd_saved_bytes(42)


def test_heap_bytes_held_by_sees_what_the_result_keeps_alive():
    big = 8 * 2**20  # 8 MiB: far above malloc's mmap threshold and any noise from Python objects
    held, out = inference.heap_bytes_held_by(lambda: torch.ones(big // 4))
    assert out.numel() * 4 == big
    assert big <= held < big + 2**20, held
    del out
    held_none, _ = inference.heap_bytes_held_by(lambda: torch.ones(big // 4).sum())  # the big tensor is freed
    assert held_none < 2**20, held_none
    with pytest.raises(TypeError, match="callable"):
        inference.heap_bytes_held_by(42)


def test_gradient_checkpointing_holds_less_and_keeps_the_gradients():
    from torch.utils.checkpoint import checkpoint_sequential

    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh()) for _ in range(8)])
    x = torch.randn(256, 512)
    results = {}
    for label, forward in (("plain", lambda: net(x)),
                           ("checkpoint", lambda: checkpoint_sequential(net, 4, x, use_reentrant=False))):
        forward().sum().backward()  # warm-up: checkpoint's first call allocates ~30 MB once (lazy set-up)
        net.zero_grad(set_to_none=True)
        held, out = inference.heap_bytes_held_by(forward)
        out.sum().backward()
        results[label] = (held, [p.grad.clone() for p in net.parameters()])
    # plain keeps one 512 KiB tensor per block (each Linear's input is the previous Tanh's saved output) and more;
    # 4 segments keep only the segment inputs and the last segment's activations
    assert results["plain"][0] >= 8 * 512 * 2**10
    assert results["checkpoint"][0] < 0.8 * results["plain"][0], [r[0] for r in results.values()]
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(results["plain"][1], results["checkpoint"][1], strict=True))


def test_path_size_bytes_and_size_table(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 1000)
    folder = tmp_path / "saved" / "1"
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"y" * 300)
    (folder / "variables" / "data").write_bytes(b"z" * 200)
    assert inference.path_size_bytes(tmp_path / "a.bin") == 1000
    assert inference.path_size_bytes(folder) == 500
    with pytest.raises(FileNotFoundError, match="does not exist"):
        inference.path_size_bytes(tmp_path / "missing.pt")
    rows = inference.size_table([("m", "state_dict", tmp_path / "a.bin"), ("m", "SavedModel", folder),
                                 ("other", "int8", 250)])
    assert [r["mb"] for r in rows] == [1000 / 1e6, 500 / 1e6, 250 / 1e6]
    assert rows[1]["vs_baseline"] == pytest.approx(0.5)
    assert rows[2]["vs_baseline"] is None


def test_onnx_size_includes_external_data(tmp_path):
    pytest.importorskip("onnx")
    path = tmp_path / "lin.onnx"
    torch.onnx.export(torch.nn.Linear(8, 4), (torch.randn(1, 8),), str(path), dynamo=False)
    assert inference.path_size_bytes(path) == path.stat().st_size


def test_savedmodel_variable_bytes_rejects_non_savedmodel(tmp_path):
    pytest.importorskip("tensorflow", reason="TensorFlow is optional (lesson 01's Keras section)")
    with pytest.raises(FileNotFoundError, match="not a SavedModel"):
        inference.savedmodel_variable_bytes(tmp_path)


@pytest.mark.parametrize("protocol", [2, 4])  # 2: torch.save's default (GLOBAL opcodes); 4+: STACK_GLOBAL
def test_pickle_globals_whole_model_names_its_classes_state_dict_does_not(tmp_path, protocol):
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    whole, sd = tmp_path / "whole.pt", tmp_path / "sd.pt"
    torch.save(net, whole, pickle_protocol=protocol)
    torch.save(net.state_dict(), sd, pickle_protocol=protocol)
    whole_names, sd_names = inference.pickle_globals(whole), inference.pickle_globals(sd)
    classes = {"torch.nn.modules.container.Sequential", "torch.nn.modules.linear.Linear",
               "torch.nn.modules.activation.ReLU"}
    assert classes <= set(whole_names)
    assert not classes & set(sd_names) and "collections.OrderedDict" in sd_names
    assert set(sd_names) < set(whole_names)
    if protocol == 2:  # torch's own scanner reads protocol 2 only (protocol 4's FRAME opcode: "Unsupported operand")
        # independent check: what torch's restricted unpickler would refuse is among the names found
        assert set(torch.serialization.get_unsafe_globals_in_checkpoint(whole)) <= set(whole_names)
        assert torch.serialization.get_unsafe_globals_in_checkpoint(sd) == []


def test_pickle_globals_reads_plain_pickles_and_explains_bad_files(tmp_path):
    import collections
    import pickle
    import zipfile

    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"a": collections.OrderedDict(), "b": [1, 2]}, protocol=5))
    assert inference.pickle_globals(plain) == ["collections.OrderedDict"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        inference.pickle_globals(tmp_path / "missing.pt")
    other_zip = tmp_path / "model.keras"
    with zipfile.ZipFile(other_zip, "w") as zf:
        zf.writestr("config.json", "{}")
    with pytest.raises(ValueError, match="not a torch.save archive"):
        inference.pickle_globals(other_zip)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="does not hold a readable pickle"):
        inference.pickle_globals(junk)


def _sweep(round_ms, iqr=0.0):
    from utils.core.bench import BenchResult

    results = {bs: BenchResult(f"batch {bs}", sorted(ms)[len(ms) // 2], iqr, len(ms), items=bs) for bs, ms in round_ms.items()}
    return inference.Sweep(results, round_ms)


def test_sweep_gain_is_per_round_throughput_ratio_with_interval():
    sweep = _sweep({1: [10.0, 10.0, 10.0], 4: [20.0, 25.0, 50.0]})  # per-round gains 2.0, 1.6, 0.8
    gain = sweep.gain(4)
    assert (gain.value, gain.low, gain.high, gain.rounds) == pytest.approx((1.6, 0.8, 2.0, 3))
    assert sweep.gain(1).interval == (1.0, 1.0)
    assert not gain.noisy and "IQR" in _sweep({1: [10.0], 2: [10.0]}, iqr=5.0).gain(2).noisy
    with pytest.raises(KeyError, match="batch 8 was not swept"):
        sweep.gain(8)


def test_sweep_flags_only_drops_every_round_agrees_on():
    sweep = _sweep({1: [10.0, 10.0], 2: [30.0, 31.0], 4: [40.0, 70.0]})  # 2 falls in both rounds; 4 vs 2: 1.5x, 0.89x
    assert [(a, b) for a, b, _ in sweep.drops()] == [(1, 2)]


def test_throughput_sweep_interleaves_rounds_and_checks_sizes(net):
    net.eval()
    seen = []
    net.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    sweep = inference.throughput_sweep(net, [1, 3], lambda bs: torch.randn(bs, 3, 8, 8), rounds=2,
                                       min_run_time=0.001, warmup=1)
    assert sorted(sweep.results) == [1, 3] and sweep.results[3].items == 3
    assert [len(v) for v in sweep.round_ms.values()] == [2, 2]
    runs = [bs for bs, _ in itertools.groupby(seen)]
    assert runs == [1, 3, 1], "each round times every batch size once, in turn (every other round in reverse order)"
    for bad in ([], [0], [2, 2], [True]):
        with pytest.raises(ValueError, match="batch_sizes"):
            inference.throughput_sweep(net, bad, lambda bs: torch.randn(bs, 3, 8, 8))


def test_activation_sizes_counts_every_leaf_output():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    assert inference.activation_sizes(model, torch.randn(5, 4)) == [5 * 8 * 4, 5 * 8 * 4, 5 * 2 * 4]
    assert not any(m._forward_hooks for m in model.modules()), "the hooks are removed afterwards"


def test_cold_start_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch must be >= 1"):
        inference.cold_start(batch=0)


# ---------------------------------------------------------------------------------------------------------------------
# lab 01 checks: they pass on a hand-written predict and fail clearly on typical mistakes and on the reference
# ---------------------------------------------------------------------------------------------------------------------


def _learner_predict(model, x, max_batch=16):
    """A learner's correct predict, written by hand (the lab's solution)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4 or x.shape[0] == 0 or x.shape[1] != 3:
        raise ValueError(f"x must be a non-empty (N, 3, H, W) batch, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    device = next(model.parameters()).device
    model.eval()
    with torch.inference_mode():
        return torch.cat([model(chunk.to(device)).cpu() for chunk in x.split(max_batch)])


def test_lab_checks_pass_on_a_hand_written_predict(capsys):
    lab01.check_predict_correct(_learner_predict)
    lab01.check_no_graph(_learner_predict)
    lab01.check_batching(_learner_predict)
    lab01.check_validation(_learner_predict)
    lab01.check_device_placement(_learner_predict)
    assert capsys.readouterr().out.count("PASSED") == 5


def test_lab_checks_fail_an_answer_that_calls_the_reference():
    from utils.inference import predict as imported_by_name  # however it is bound
    from utils.inference import validate_images

    def wraps_reference(model, x, max_batch=16):
        return inference.predict(model, x, max_batch=max_batch)

    def validates_with_reference(model, x, max_batch=16):
        validate_images(x)
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        return _learner_predict(model, x, max_batch)

    for answer in (wraps_reference, lambda m, x, max_batch=16: imported_by_name(m, x, max_batch=max_batch)):
        for check in (lab01.check_predict_correct, lab01.check_batching, lab01.check_validation):
            with pytest.raises(LabCheckFailed, match=r"calls utils\.inference\.predict, the course's reference"):
                check(answer)
    with pytest.raises(LabCheckFailed, match=r"calls utils\.inference\.validate_images"):
        lab01.check_validation(validates_with_reference)


def test_lab_checks_catch_typical_mistakes():
    def no_eval(model, x, max_batch=16):
        with torch.inference_mode():
            return model(x)

    with pytest.raises(LabCheckFailed, match="Dropout"):
        lab01.check_predict_correct(no_eval)

    def detach_only(model, x, max_batch=16):
        model.eval()
        return model(x).detach()

    with pytest.raises(LabCheckFailed, match="saved .* tensors for backward") as caught:
        lab01.check_no_graph(detach_only)
    assert "inference_mode" not in str(caught.value), "the message names the symptom, not the fix"

    def one_big_batch(model, x, max_batch=16):
        if max_batch < 1:
            raise ValueError(f"max_batch {max_batch}")
        return _learner_predict(model, x, max_batch=10**6)

    with pytest.raises(LabCheckFailed, match="batches of \\[37\\]") as caught:
        lab01.check_batching(one_big_batch)
    assert "split" not in str(caught.value)

    def no_validation(model, x, max_batch=16):
        model.eval()
        with torch.inference_mode():
            return model(x)

    with pytest.raises(LabCheckFailed, match="single image"):
        lab01.check_validation(no_validation)

    def ignores_device(model, x, max_batch=16):
        model.eval()
        with torch.inference_mode():
            return model(x)

    with pytest.raises(LabCheckFailed, match="received inputs on \\['cpu'\\]") as caught:
        lab01.check_device_placement(ignores_device)
    assert "parameters()" not in str(caught.value)


def test_lab_benchmark_and_pick_checks():
    from utils.core import bench

    def good(model, batch_sizes, image_size=64, min_run_time=0.02):
        model.eval()
        out = {}
        for bs in batch_sizes:
            x = torch.randn(bs, 3, image_size, image_size)
            with torch.inference_mode():
                ms = bench.measure(lambda x=x: model(x), warmup=1, min_run_time=min_run_time).median_ms
            out[bs] = {"latency_ms": ms, "images_per_s": bs / (ms / 1e3)}
        return out

    assert sorted(lab01.check_benchmark(good)) == [1, 4, 16]

    def seconds_not_ms(model, batch_sizes, image_size=64):
        res = good(model, batch_sizes, image_size)
        return {bs: {"latency_ms": r["latency_ms"] / 1e3, "images_per_s": r["images_per_s"] * 1e3}
                for bs, r in res.items()}

    with pytest.raises(LabCheckFailed, match="not the time of one call in milliseconds"):
        lab01.check_benchmark(seconds_not_ms)

    def with_grad(model, batch_sizes, image_size=64):
        model.eval()
        return {bs: {"latency_ms": 1.0, "images_per_s": bs * 1e3} for bs in batch_sizes if model(torch.randn(bs, 3, 8, 8)) is not None}

    with pytest.raises(LabCheckFailed, match="autograd recording"):
        lab01.check_benchmark(with_grad)

    def with_course_sweep(model, batch_sizes, image_size=64):
        model.eval()
        sweep = inference.throughput_sweep(model, batch_sizes, lambda bs: torch.randn(bs, 3, image_size, image_size),
                                           rounds=1, min_run_time=0.01)
        return {bs: {"latency_ms": r.median_ms, "images_per_s": r.throughput} for bs, r in sweep.results.items()}

    with pytest.raises(LabCheckFailed, match="calls utils.inference.throughput_sweep"):
        lab01.check_benchmark(with_course_sweep)

    def pick(results, budget):
        fitting = {bs: r for bs, r in results.items() if r["latency_ms"] <= budget}
        if not fitting:
            raise ValueError(f"nothing fits {budget} ms")
        return max(fitting, key=lambda bs: fitting[bs]["images_per_s"])

    lab01.check_pick_batch_size(pick)
    with pytest.raises(LabCheckFailed, match="best batch size is"):
        lab01.check_pick_batch_size(lambda results, budget: max(results))


def test_no_reference_catches_calls_however_they_are_made():
    """utils.checks.no_reference, the helper behind "your predict calls utils.inference.predict": Python functions by
    their code object (aliases, other threads), built-ins (torch's C functions) by identity."""
    import sys
    import threading

    from utils.checks import no_reference

    alias = inference.predict
    calls = {
        "alias": lambda: alias(inference.tiny_cnn(), torch.randn(2, 3, 8, 8)),
        "thread": lambda: [t := threading.Thread(target=inference.validate_images, args=(torch.randn(1, 3, 4, 4),)),
                           t.start(), t.join()],
        "builtin": lambda: torch._softmax_backward_data(torch.ones(3), torch.ones(3), 0, torch.float32),
    }
    watched = (inference.predict, inference.validate_images, torch._softmax_backward_data)
    for body in calls.values():
        with pytest.raises(LabCheckFailed, match="your answer calls (utils.inference|torch)"):
            with no_reference(*watched, what="your answer"):
                body()
    with no_reference(*watched, what="your answer"):
        torch.softmax(torch.ones(3), 0)  # anything else runs untouched
    assert sys.getprofile() is None and threading.getprofile() is None, "the profiler hook is removed afterwards"
    with pytest.raises(TypeError, match="Python functions or built-ins"):
        with no_reference(inference.Sweep):
            pass
