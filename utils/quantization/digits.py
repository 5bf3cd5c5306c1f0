"""The small model that lesson 04's quantization part calibrates and quantizes: an MLP on scikit-learn's bundled 8x8
digits (1,797 images, nothing downloaded), trained in a few seconds on one core."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["digits_split", "mlp", "train", "accuracy"]


def digits_split(seed: int = 0):
    """(X_train, y_train, X_test, y_test) as tensors: pixels scaled to [0, 1], flattened to 64 features, a stratified
    70/30 split (the split lesson 04's first part uses)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    X = (d.images.reshape(len(d.images), -1) / 16.0).astype("float32")
    X_tr, X_te, y_tr, y_te = train_test_split(X, d.target, test_size=0.3, random_state=seed, stratify=d.target)
    return torch.from_numpy(X_tr), torch.from_numpy(y_tr), torch.from_numpy(X_te), torch.from_numpy(y_te)


def mlp(hidden: int = 128, seed: int = 0) -> nn.Sequential:
    """64 -> hidden -> hidden -> 10, ReLU between: three Linear layers to quantize."""
    if hidden < 1:
        raise ValueError(f"hidden must be >= 1, got {hidden}")
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def train(model: nn.Module, X: torch.Tensor, y: torch.Tensor, epochs: int, *, lr: float = 3e-3, batch: int = 64,
          seed: int = 0) -> list[float]:
    """Adam on cross-entropy for `epochs` passes over (X, y); returns the mean loss of each epoch. Leaves eval mode."""
    if len(X) != len(y) or len(X) == 0:
        raise ValueError(f"X and y must be non-empty and of the same length, got {len(X)} and {len(y)}")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(epochs):
        total = 0.0
        for idx in torch.randperm(len(X), generator=gen).split(batch):
            opt.zero_grad()
            loss = F.cross_entropy(model(X[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        losses.append(total / len(X))
    model.eval()
    return losses


@torch.no_grad()
def accuracy(model_or_logits, X: torch.Tensor | None = None, y: torch.Tensor | None = None) -> float:
    """Top-1 accuracy of a model on (X, y), or of a logits array against y (X None)."""
    logits = model_or_logits if X is None else model_or_logits(X)
    logits = torch.as_tensor(logits)
    if y is None or logits.shape[0] != len(y):
        raise ValueError(f"need one row of logits per label, got {tuple(logits.shape)} logits and "
                         f"{None if y is None else len(y)} labels")
    return float((logits.argmax(1) == torch.as_tensor(y)).float().mean())
