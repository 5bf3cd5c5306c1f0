"""What lesson 05's parts 2 and 3 rebuild from part 1 when they start in a fresh kernel.

`reference(work)` repeats part 1's sections 1 and 2 in a few seconds: the labelled sentences, the eager MiniLM pipeline
(mean pooling, L2 normalisation), classifier version 1 (nearest centroid) and version 2 (logistic regression), and the
encoder exported to ONNX. Every served answer in parts 2 and 3 is compared with `Reference.logits` / `.labels`.

`text_input` and `chunks` are part 1's two small client helpers (section 6 defines them where it first serves the ensemble).

`decision(work)` reads the configuration part 1's sweep chose (its section 6 writes `sweep_decision.json`) and, when
part 1 has not run, falls back to one encoder instance on every core with no batching knobs, saying so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import torch

from utils.core import models, onnx_io
from utils.core.data import labeled_sentences


@dataclass
class Reference:
    """Part 1's local pipeline: what a served ensemble must return for each sentence."""

    texts: list[str]
    classes: list[str]
    train_x: list[str]
    test_x: list[str]
    tokenizer: object
    encoder: torch.nn.Module
    seq_len: int  # the longest sentence's token count rounded up to a multiple of 8
    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray
    logits: np.ndarray  # classifier version 2 on every sentence (the ensemble's latest version)
    labels: list[str] = field(default_factory=list)
    onnx_path: Path | None = None

    def embed(self, batch: list[str]) -> np.ndarray:
        """Sentence embeddings with eager PyTorch, padded to `seq_len` as the served tokenizer pads them."""
        enc = self.tokenizer(batch, padding="max_length", truncation=True, max_length=self.seq_len, return_tensors="pt")
        with torch.inference_mode():
            hidden = self.encoder(**enc).last_hidden_state
        pooled = models.mean_pool(hidden, enc["attention_mask"])
        return torch.nn.functional.normalize(pooled, dim=1).numpy()

    @staticmethod
    def classify(emb: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
        return emb @ W + b


def reference(work: Path) -> Reference:
    """Rebuild part 1's reference pipeline and export its encoder to `work`/minilm.onnx."""
    from sklearn.linear_model import LogisticRegression

    texts, _, classes = labeled_sentences()
    train_x, train_y, _ = labeled_sentences("train")
    test_x, _, _ = labeled_sentences("test")
    tokenizer, encoder = models.minilm()  # eager attention, eval mode, loaded offline
    longest = max(len(ids) for ids in tokenizer(texts)["input_ids"])
    empty = np.zeros((0,), np.float32)
    ref = Reference(texts, classes, train_x, test_x, tokenizer, encoder, 8 * math.ceil(longest / 8),
                    empty, empty, empty, empty, empty)
    emb_all = ref.embed(texts)
    emb_train = emb_all[[texts.index(t) for t in train_x]]
    y_train = np.array([classes.index(y) for y in train_y])
    centroids = np.stack([emb_train[y_train == k].mean(0) for k in range(len(classes))])
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    ref.W1, ref.b1 = centroids.T.astype(np.float32), np.zeros(len(classes), np.float32)
    logreg = LogisticRegression(C=10.0, max_iter=2000).fit(emb_train, y_train)
    ref.W2, ref.b2 = logreg.coef_.T.astype(np.float32), logreg.intercept_.astype(np.float32)
    ref.logits = ref.classify(emb_all, ref.W2, ref.b2)
    ref.labels = [classes[k] for k in ref.logits.argmax(1)]
    ref.onnx_path = onnx_io.export_minilm(Path(work) / "minilm.onnx", dynamo=False, model=encoder)
    return ref


def decision(work: Path) -> tuple[dict, str]:
    """Part 1's sweep decision (winner, tie band, p95 budget...) and a sentence saying where it came from."""
    path = Path(work) / "sweep_decision.json"
    if path.is_file():
        chosen = json.loads(path.read_text())
        return chosen, f"part 1's decision ({chosen['mode']} mode sweep, {path}): {chosen['winner']}"
    cores = psutil.cpu_count(logical=False) or psutil.cpu_count()
    chosen = {"winner": {"instances": 1, "threads": cores, "preferred": [], "delay_us": 0}, "tie_band": 0.05}
    return chosen, (f"no decision from part 1 at {path}: using {chosen['winner']} and a 5% tie band (run part 1 to "
                    "choose the configuration by measurement)")


def text_input(module, batch: list[str]):
    """A TEXT InferInput (for tritonclient.http, .grpc or .grpc.aio) holding a batch of sentences (part 1, section 6)."""
    inp = module.InferInput("TEXT", [len(batch), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[t.encode()] for t in batch], dtype=object))
    return inp


def chunks(seq, n):
    """`seq` in consecutive pieces of at most n."""
    return [seq[i:i + n] for i in range(0, len(seq), n)]
