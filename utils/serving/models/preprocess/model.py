"""preprocess: UTF-8 text -> MiniLM token ids, padded to a fixed length (lesson 05; copied by utils.serving.repository).

Config parameters: seq_len (every text is padded or truncated to it, so requests of any text can be batched) and
max_text_bytes (a longer text is refused with INVALID_ARG, HTTP 400). tokenizer.json sits in the version folder.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        self.seq_len = int(params["seq_len"])
        self.max_text_bytes = int(params["max_text_bytes"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=self.seq_len)
        self.tokenizer.enable_padding(length=self.seq_len, pad_id=0, pad_token="[PAD]")

    def _texts(self, request):
        raw = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
        texts = []
        for item in raw:
            data = item if isinstance(item, bytes) else str(item).encode()
            if len(data) > self.max_text_bytes:
                raise ValueError(f"TEXT is {len(data)} bytes; this model accepts at most {self.max_text_bytes}")
            texts.append(data.decode("utf-8"))  # invalid UTF-8 raises UnicodeDecodeError: a clear client error
        return texts

    def execute(self, requests):
        # one tokenizer call for every text of every request Triton batched into this execute()
        texts, spans, responses = [], [], [None] * len(requests)
        for i, request in enumerate(requests):
            try:
                mine = self._texts(request)
            except (ValueError, UnicodeDecodeError) as exc:
                error = pb_utils.TritonError(f"preprocess: {exc}", pb_utils.TritonError.INVALID_ARG)  # HTTP 400
                responses[i] = pb_utils.InferenceResponse(error=error)
                continue
            spans.append((i, len(texts), len(texts) + len(mine)))
            texts.extend(mine)
        if texts:
            encoded = self.tokenizer.encode_batch(texts)
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            types = np.zeros_like(ids)
            for i, a, b in spans:
                responses[i] = pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("input_ids", ids[a:b]),
                    pb_utils.Tensor("attention_mask", mask[a:b]),
                    pb_utils.Tensor("token_type_ids", types[a:b]),
                ])
        return responses
