"""A TorchServe handler for lesson 05's pipeline: MiniLM in eager PyTorch, mean pooling, a linear classifier.

torch-model-archiver packs this file into a model archive (.mar) with the files it reads: the encoder's config.json
and model.safetensors, tokenizer.json, classifier.npz and handler.json (seq_len, torch_threads, max_text_bytes).
A TorchServe worker is a Python process that imports this module, makes one instance of its only class, calls
initialize(context) once, then handle(requests, context) for every batch the Java frontend sends it: one request
without batching, up to the registration's batchSize with it. Nothing is unpickled: weights come from safetensors
and an .npz read with allow_pickle=False. Nothing in utils imports this file (lesson 05 copies it and prints it).
"""

import json
import os

import numpy as np
import torch


class MiniLMClassifierHandler:
    def initialize(self, context):
        from tokenizers import Tokenizer
        from transformers import AutoModel

        model_dir = context.system_properties["model_dir"]  # where the worker unpacked the archive
        with open(os.path.join(model_dir, "handler.json")) as fh:
            settings = json.load(fh)
        torch.set_num_threads(int(settings["torch_threads"]))
        self.seq_len = int(settings["seq_len"])
        self.max_text_bytes = int(settings["max_text_bytes"])
        self.tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=self.seq_len)
        self.tokenizer.enable_padding(length=self.seq_len, pad_id=0, pad_token="[PAD]")
        self.encoder = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
        with np.load(os.path.join(model_dir, "classifier.npz"), allow_pickle=False) as clf:
            self.weight = torch.from_numpy(clf["weight"])
            self.bias = torch.from_numpy(clf["bias"])
            self.labels = [str(x) for x in clf["labels"]]

    def _text(self, request) -> str:
        body = request.get("data") or request.get("body")  # bytes; str for text/*; parsed JSON for application/json
        if isinstance(body, dict):
            body = body.get("text")
        if isinstance(body, str):
            body = body.encode("utf-8")
        if not isinstance(body, bytes | bytearray) or not body:
            raise ValueError('send the text as the request body, or JSON {"text": "..."}')
        if len(body) > self.max_text_bytes:
            raise ValueError(f"the text is {len(body)} bytes; this model accepts at most {self.max_text_bytes}")
        return bytes(body).decode("utf-8")

    def preprocess(self, requests):
        """Every request's text -> one batch of token tensors, padded to seq_len; bad requests are set aside."""
        texts, errors = [], {}
        for i, request in enumerate(requests):
            try:
                texts.append(self._text(request))
            except (ValueError, UnicodeDecodeError) as exc:
                errors[i] = str(exc)
        encoded = self.tokenizer.encode_batch(texts)
        ids = torch.tensor([e.ids for e in encoded], dtype=torch.long).reshape(len(texts), self.seq_len)
        mask = torch.tensor([e.attention_mask for e in encoded], dtype=torch.long).reshape(len(texts), self.seq_len)
        return ids, mask, errors

    def inference(self, ids, mask):
        """One encoder call for the whole batch, then mean pooling, L2 normalisation and the classifier."""
        with torch.inference_mode():
            hidden = self.encoder(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))
            weights = mask.unsqueeze(-1).to(hidden.last_hidden_state.dtype)
            pooled = (hidden.last_hidden_state * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=1) @ self.weight + self.bias

    def postprocess(self, logits, errors, context):
        """One response per request, in order: label and logits, or HTTP 400 with the reason."""
        rows, out = iter(logits.tolist()), []
        for i in range(len(logits) + len(errors)):
            if i in errors:
                context.set_response_status(code=400, phrase=errors[i], idx=i)
                out.append({"error": errors[i]})
            else:
                row = next(rows)
                out.append({"label": self.labels[int(np.argmax(row))], "logits": row})
        return out

    def handle(self, requests, context):
        ids, mask, errors = self.preprocess(requests)
        logits = self.inference(ids, mask) if len(ids) else torch.zeros(0, len(self.labels))
        return self.postprocess(logits, errors, context)
