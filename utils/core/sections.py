"""The course's optional sections and the one guard for their cells (lesson 00; every lesson).

Every GPU-only or optional cell in the course is written as::

    if sections.requires("cuda", section="01.pinned-memory"):
        ...  # the GPU path

``requires`` returns True when the capability is present. Otherwise it prints one line saying what is missing and
why, records the skip in the notebook's results (so tests can check that only listed sections were skipped) and
returns False: never a traceback. Platform dependencies are capabilities too (02.compile needs Inductor's compiler,
03.keep-freed-memory glibc's allocator, 04.ort-cuda ONNX Runtime's CUDA provider): WORKBOOK_EMULATE
(utils.core.platforms) makes them skip as they would on macOS, Windows or Linux aarch64. OPTIONAL_SECTIONS is the one
list of such sections; lesson 00 prints it for the
learner's machine and `make gpu-check` runs those that need a GPU.
"""

from __future__ import annotations

from utils.core import env, report

__all__ = ["OPTIONAL_SECTIONS", "INSIDE", "requires", "predict"]

# Every section of the course that may be skipped: id -> (capability it needs, what it does). requires() takes
# these ids; lesson 00 prints this table for the learner's machine; tests fail when a notebook skips anything else.
OPTIONAL_SECTIONS: dict[str, tuple[str, str]] = {
    "00.gpu-probe": ("cuda", "GPU copy bandwidth and matmul roofline probe"),
    "00.triton-smoke": ("tritonserver", "start and stop the bundled Triton server"),
    "01.pinned-memory": ("cuda", "pinned host memory and non_blocking copies"),
    "01.gpu-speedup": ("cuda", "GPU vs CPU inference speed"),
    "01.gpu-oom": ("cuda", "a controlled CUDA out-of-memory and its fix"),
    "01.tf-memory-growth": ("cuda", "TensorFlow GPU memory growth"),
    "01.keras": ("tensorflow", "Keras call vs predict, tf.function and a SavedModel for TF Serving"),
    "02.tf-function": ("tensorflow", "tf.function tracing and retracing, AutoGraph, XLA fusion"),
    "02.compile": ("inductor", "torch.compile with Inductor: start-up and compile time, parity and speed of the "
                   "compiled MLP and ResNet-50"),
    "02.cuda-graphs": ("cuda", "CUDA graph capture and replay"),
    "03.lightning": ("lightning", "the training step as a LightningModule run by lightning.Trainer: loss parity, "
                     "per-step cost vs the course's loop"),
    "03.keep-freed-memory": ("glibc_malloc", "glibc's malloc told to keep freed memory (mallopt, GLIBC_TUNABLES): page "
                             "faults per step and speed, interleaved"),
    "03.gpu-amp": ("cuda", "fp16 autocast with GradScaler"),
    "03.cudnn-benchmark": ("cuda", "cudnn.benchmark autotuning"),
    "03.gpu-utilization": ("cuda", "GPU utilization during training"),
    "03.nsight": ("cuda", "Nsight Systems / Compute command lines with NVTX ranges"),
    "04.tensorflow": ("tf2onnx", "Keras -> SavedModel -> ONNX with tf2onnx, and TFLite int8"),
    "04.ort-custom-op": ("onnxruntime_extensions", "a custom-domain op run inside ONNX Runtime (onnxruntime-extensions)"),
    "04.openvino": ("openvino", "OpenVINO on the same ONNX file: default precision, parity, speed vs ONNX Runtime"),
    "04.tvm": ("tvm", "Apache TVM compiles the same ONNX file: parity, speed vs ONNX Runtime, a schedule"),
    "04.ort-cuda": ("ort_cuda", "ONNX Runtime CUDA execution provider and IO binding"),
    "04.tensorrt": ("tensorrt", "TensorRT engine build, fusion inspection, parity and latency"),
    "04.trt-plugin": ("tensorrt", "the soft_clip TensorRT plugin (tensorrt.plugin API) and an engine built with it"),
    "05.model-config": ("tritonclient", "config.pbtxt through Triton's protobuf schema and the model repository"),
    "05.triton": ("tritonserver", "the Triton ensemble, load tests and hardening"),
    "05.gpu-instances": ("cuda", "Triton KIND_GPU instances and a GPU encoder"),
    "05.k8s-manifest": ("kubernetes_validate", "the Kubernetes manifest checked against the bundled Kubernetes schema"),
    "05.proxy-limit": ("nginx", "a proxy in front of Triton that buffers and caps request bodies (nginx on 127.0.0.1)"),
    "05.torchserve": ("torchserve", "the same PyTorch pipeline on TorchServe: archive, REST, parity, latency vs Triton"),
    "06.cpu-kernel": ("cxx", "build the C++ softmax extension"),
    "06.cuda-kernel": ("cuda+nvcc", "build and run the CUDA softmax kernel"),
    "06.cuda-compile-check": ("nvcc", "compile-check the .cu source with nvcc"),
    "06.gpu-sweep": ("cuda+nvcc", "softmax bandwidth sweep on the GPU"),
    "06.triton-interpreter": ("triton", "the softmax in the Triton language, run by Triton's interpreter on CPU tensors"),
    "06.triton-gpu": ("cuda", "the Triton softmax compiled on the GPU: parity, and GB/s against torch.softmax and the "
                      "device's copy"),
    "07.triton-flash-attention": ("triton", "FlashAttention's forward in the Triton language, run by Triton's "
                                  "interpreter on CPU tensors: parity and bytes moved"),
    "07.gpu-sdpa": ("cuda", "SDPA flash vs math backend on the GPU: time and peak memory"),
}


# Sections a lesson only reaches inside another one (`if HAVE_TRITON and sections.requires(...)`): where the outer one
# is skipped, the inner one is neither run nor recorded as skipped. The doctor's plan and the emulation CI read this.
INSIDE: dict[str, str] = {
    "01.tf-memory-growth": "01.keras",
    "05.triton": "05.model-config",
    "05.proxy-limit": "05.triton",
    "05.k8s-manifest": "05.triton",
    "05.gpu-instances": "05.triton",
}


def predict(caps: dict | None = None) -> dict[str, tuple[str, str]]:
    """{section: (status, why)} for every optional section on this machine (or for `caps`, env.capabilities()-like):
    status 'runs', 'skipped' (its capability is missing: what requires() will print) or 'not reached' (inside a
    section that is skipped). `make doctor` prints it; `make test-platforms` compares it with what the lessons did."""
    caps = env.capabilities() if caps is None else caps
    out: dict[str, tuple[str, str]] = {}

    def status(section: str) -> tuple[str, str]:
        if section in out:
            return out[section]
        outer = INSIDE.get(section)
        cap = caps[OPTIONAL_SECTIONS[section][0]]
        if outer and status(outer)[0] != "runs":
            own = "" if cap.available else f"; it also needs {cap.name}: {cap.reason}"
            out[section] = ("not reached", f"runs inside {outer}, which does not run here{own}")
        else:
            out[section] = ("runs", cap.reason) if cap.available else ("skipped", f"needs {cap.name}: {cap.reason}")
        return out[section]

    for section in OPTIONAL_SECTIONS:
        status(section)
    return {section: out[section] for section in OPTIONAL_SECTIONS}


def requires(name: str, section: str) -> bool:
    """The guard for optional cells (lesson 00). True when `name` is available; else a one-line reason and False.

    `section` is an id from OPTIONAL_SECTIONS (e.g. "04.tensorrt") listed with the capability it needs; tests check
    that a notebook skipped nothing else.
    """
    if not section or not isinstance(section, str):
        raise ValueError(f"requires() needs a section name such as '04.tensorrt', got {section!r}")
    if section not in OPTIONAL_SECTIONS:
        raise ValueError(f"section {section!r} is not in utils.core.sections.OPTIONAL_SECTIONS; add it there with its capability")
    if OPTIONAL_SECTIONS[section][0] != name:
        raise ValueError(f"section {section!r} is listed as needing {OPTIONAL_SECTIONS[section][0]!r}, not {name!r}")
    caps = env.capabilities()
    if name not in caps:
        raise KeyError(f"unknown capability {name!r}; expected one of {sorted(caps)}")
    cap = caps[name]
    if cap.available:
        report.record_ran(section)
        return True
    print(f"SKIPPED [{section}] needs {name}: {cap.reason}. On a machine with {name} this cell runs its full path.")
    report.record_skip(section, f"needs {name}: {cap.reason}")
    return False
