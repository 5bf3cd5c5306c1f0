"""postprocess: mean pooling + L2 norm + a linear classifier (lesson 05; copied by utils.serving.repository).

classifier.npz (weight [hidden, classes], bias [classes], labels) sits in the version folder, so each version of this
model can be a different classifier served by the same code.
"""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        with np.load(os.path.join(folder, "classifier.npz"), allow_pickle=False) as data:
            self.weight = data["weight"].astype(np.float32)
            self.bias = data["bias"].astype(np.float32)
            self.labels = np.array([s.encode() for s in data["labels"].tolist()], dtype=object)

    def _classify(self, hidden, mask):
        mask = mask.astype(np.float32)[:, :, None]
        pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        emb = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        logits = (emb @ self.weight + self.bias).astype(np.float32)
        return logits, self.labels[logits.argmax(axis=1)].reshape(-1, 1)

    def execute(self, requests):
        hidden = [pb_utils.get_input_tensor_by_name(r, "last_hidden_state").as_numpy() for r in requests]
        masks = [pb_utils.get_input_tensor_by_name(r, "attention_mask").as_numpy() for r in requests]
        if len({h.shape[1:] for h in hidden}) == 1:  # one vectorised pass over every request in this batch
            logits, labels = self._classify(np.concatenate(hidden), np.concatenate(masks))
            cuts = np.cumsum([h.shape[0] for h in hidden])[:-1]
            parts = zip(np.split(logits, cuts), np.split(labels, cuts), strict=True)
        else:
            parts = [self._classify(h, m) for h, m in zip(hidden, masks, strict=True)]
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("LOGITS", lg), pb_utils.Tensor("LABEL", lb)])
                for lg, lb in parts]
