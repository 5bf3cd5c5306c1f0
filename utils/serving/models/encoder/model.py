"""encoder: MiniLM (ONNX) run by ONNX Runtime inside the Python backend (lesson 05; copied by utils.serving.repository).

Config parameters: intra_op_threads (0 = ONNX Runtime's default, one per physical core) and allow_spinning ("0": idle
pool threads sleep instead of busy-waiting on a core another process needs). model.onnx sits in the version folder.
A KIND_GPU instance asks ONNX Runtime for its CUDA execution provider on the device Triton assigned.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

NAMES = ("input_ids", "attention_mask", "token_type_ids")


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(params.get("intra_op_threads", "0"))
        options.inter_op_num_threads = 1
        if params.get("allow_spinning", "1") == "0":
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        if args["model_instance_kind"] == "GPU":
            device = int(args["model_instance_device_id"])
            providers = [("CUDAExecutionProvider", {"device_id": device}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=providers)

    def execute(self, requests):
        # Triton hands over every request its scheduler batched together (one, without dynamic batching).
        # Requests of the same sequence length are concatenated into ONE ONNX Runtime call: that is the batching.
        feeds = {n: [pb_utils.get_input_tensor_by_name(r, n).as_numpy() for r in requests] for n in NAMES}
        sizes = [a.shape[0] for a in feeds["input_ids"]]
        if len({a.shape[1] for a in feeds["input_ids"]}) == 1:
            batch = {n: np.concatenate(v) if len(v) > 1 else v[0] for n, v in feeds.items()}
            hidden = self.session.run(["last_hidden_state"], batch)[0]
            parts = np.split(hidden, np.cumsum(sizes)[:-1])  # one slice of the batch's output per request
        else:  # different sequence lengths cannot share a tensor: one call per request
            parts = [self.session.run(["last_hidden_state"], {n: feeds[n][i] for n in NAMES})[0]
                     for i in range(len(requests))]
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("last_hidden_state", p)]) for p in parts]
