"""Training data for lesson 03: CIFAR-10-shaped images stored *encoded*, decoded and augmented per sample.

The lesson profiles a training loop, so the input pipeline must do the work a real one does. The default dataset is
synthetic and deterministic (no download): 32x32 RGB images in 10 classes, each class a different coloured stripe
pattern plus noise, stored as PNG (or JPEG) bytes exactly like an image folder on disk. A DataLoader worker therefore
*decodes* every image and *augments* it (random resized crop, flip, colour jitter with hue, blur, rotation).

Augmentation is seeded per sample (from the dataset seed and the sample index), not from the global RNG, so a batch is
bit-identical whatever the number of DataLoader workers: a faster loader cannot change the loss curve. That is what
lets lesson 03 and its lab compare a slow and a fast loop step by step.

The real CIFAR-10 (torchvision) is behind ``cifar10(download=...)``, an opt-in for machines with network access; it
goes through the same encode -> decode -> augment path.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from utils.core import env

__all__ = [
    "CIFAR_MEAN",
    "CIFAR_STD",
    "EncodedImages",
    "synthetic_cifar",
    "cifar10",
    "decode",
    "augment",
    "AugmentedImages",
    "EpochShuffle",
    "make_loader",
]

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
_FORMATS = {"png": "PNG", "jpeg": "JPEG"}


@dataclass(frozen=True)
class EncodedImages:
    """Images as encoded bytes (PNG or JPEG) with integer labels (lesson 03)."""

    blobs: tuple[bytes, ...]
    labels: tuple[int, ...]
    fmt: str
    num_classes: int

    def __post_init__(self):
        if len(self.blobs) != len(self.labels):
            raise ValueError(f"{len(self.blobs)} images but {len(self.labels)} labels: they must match")
        if not self.blobs:
            raise ValueError("an EncodedImages set needs at least one image")
        if self.fmt not in _FORMATS:
            raise ValueError(f"fmt must be one of {sorted(_FORMATS)}, got {self.fmt!r}")

    def __len__(self) -> int:
        return len(self.blobs)

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.blobs)


def _stripes(n: int, size: int, num_classes: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n uint8 images (n, size, size, 3): class c is a stripe pattern at angle c*pi/num_classes in its own colour."""
    labels = rng.integers(0, num_classes, size=n)
    yy, xx = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    angle = labels[:, None, None] * math.pi / num_classes
    freq = rng.uniform(0.25, 0.6, size=(n, 1, 1))
    phase = rng.uniform(0, 2 * math.pi, size=(n, 1, 1))
    wave = np.sin(freq * (np.cos(angle) * xx + np.sin(angle) * yy) + phase)  # (n, size, size) in [-1, 1]
    hue = labels / num_classes * 2 * math.pi
    colour = np.stack([np.cos(hue), np.cos(hue - 2.094), np.cos(hue + 2.094)], axis=1) * 0.35 + 0.5  # (n, 3)
    img = 0.5 + 0.4 * wave[..., None] * colour[:, None, None, :] + rng.normal(0, 0.08, size=(n, size, size, 3))
    return (np.clip(img, 0, 1) * 255).astype(np.uint8), labels.astype(np.int64)


def _encode(arrays: np.ndarray, fmt: str) -> list[bytes]:
    from PIL import Image

    out = []
    for arr in arrays:
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format=_FORMATS[fmt], **({"quality": 90} if fmt == "jpeg" else {}))
        out.append(buf.getvalue())
    return out


def _save(path: Path, images: EncodedImages) -> None:
    offsets = np.cumsum([0] + [len(b) for b in images.blobs])
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, blob=np.frombuffer(b"".join(images.blobs), dtype=np.uint8), offsets=offsets,
             labels=np.asarray(images.labels, dtype=np.int64), num_classes=images.num_classes)
    tmp.replace(path)


def _load(path: Path, fmt: str) -> EncodedImages:
    with np.load(path, allow_pickle=False) as z:
        blob, offsets = z["blob"].tobytes(), z["offsets"]
        blobs = tuple(blob[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1))
        return EncodedImages(blobs, tuple(int(v) for v in z["labels"]), fmt, int(z["num_classes"]))


def synthetic_cifar(n: int = 1024, *, size: int = 32, num_classes: int = 10, fmt: str = "png", seed: int = 0,
                    cache: bool = True) -> EncodedImages:
    """A deterministic CIFAR-10-shaped dataset of `n` encoded images (lesson 03).

    Cached as build/data/synthetic-cifar-*.npz (same arguments, same bytes), so later runs skip the encoding.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of images, got {n!r}")
    if size < 8 or num_classes < 2:
        raise ValueError(f"size must be >= 8 pixels and num_classes >= 2, got size={size}, num_classes={num_classes}")
    if fmt not in _FORMATS:
        raise ValueError(f"fmt must be one of {sorted(_FORMATS)}, got {fmt!r}")
    path = env.build_dir() / "data" / f"synthetic-cifar-n{n}-s{size}-c{num_classes}-{fmt}-seed{seed}.npz"
    if cache and path.is_file():
        return _load(path, fmt)
    arrays, labels = _stripes(n, size, num_classes, np.random.default_rng(seed))
    images = EncodedImages(tuple(_encode(arrays, fmt)), tuple(int(v) for v in labels), fmt, num_classes)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        _save(path, images)
    return images


def cifar10(root: str | Path | None = None, *, train: bool = True, download: bool = False, limit: int | None = None,
            fmt: str = "png") -> EncodedImages:
    """The real CIFAR-10 from torchvision, re-encoded as PNG bytes (lesson 03; opt-in, needs the files or network).

    `download=True` fetches it into `root` (default build/data/cifar10); the course never does this by itself.
    """
    from torchvision.datasets import CIFAR10

    root = Path(root) if root is not None else env.build_dir() / "data" / "cifar10"
    try:
        ds = CIFAR10(str(root), train=train, download=download)
    except RuntimeError as exc:
        raise FileNotFoundError(
            f"CIFAR-10 is not in {root} ({exc}). Pass download=True on a machine with network access, "
            "or use the synthetic dataset (DATA_SOURCE='synthetic')."
        ) from None
    arrays = ds.data[:limit] if limit else ds.data
    labels = ds.targets[: len(arrays)]
    return EncodedImages(tuple(_encode(arrays, fmt)), tuple(int(v) for v in labels), fmt, 10)


# ---------------------------------------------------------------------------------------------------------------------
# decode + augment
# ---------------------------------------------------------------------------------------------------------------------


def decode(blob: bytes):
    """Encoded image bytes -> uint8 tensor of shape (3, H, W) (lesson 03)."""
    import torch
    from PIL import Image

    with Image.open(io.BytesIO(blob)) as img:
        arr = np.asarray(img.convert("RGB"))
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


def augment(img, size: int, generator, *, heavy: bool = True):
    """Random resized crop + flip (+ colour jitter, hue, blur, rotation when `heavy`), normalized float32 (lesson 03).

    Every random choice comes from `generator`, so the same generator seed gives the same tensor.
    """
    import torch
    import torchvision.transforms.v2.functional as F

    if not (isinstance(img, torch.Tensor) and img.dtype == torch.uint8 and img.ndim == 3 and img.shape[0] == 3):
        got = f"{type(img).__name__} {getattr(img, 'dtype', '')} {tuple(getattr(img, 'shape', ()))}"
        raise ValueError(f"augment() expects a uint8 tensor of shape (3, H, W) from decode(), got {got}")

    def u(lo, hi):
        return lo + (hi - lo) * torch.rand((), generator=generator).item()

    _, h, w = img.shape
    area = h * w * u(0.6, 1.0)
    ratio = math.exp(u(math.log(3 / 4), math.log(4 / 3)))
    ch = max(1, min(h, round(math.sqrt(area / ratio))))
    cw = max(1, min(w, round(math.sqrt(area * ratio))))
    top, left = int(u(0, h - ch + 1)), int(u(0, w - cw + 1))
    x = F.resized_crop(img, top, left, ch, cw, [size, size], antialias=True)
    if u(0, 1) < 0.5:
        x = F.horizontal_flip(x)
    x = F.to_dtype(x, torch.float32, scale=True)
    if heavy:
        x = F.adjust_brightness(x, u(0.6, 1.4))
        x = F.adjust_contrast(x, u(0.6, 1.4))
        x = F.adjust_saturation(x, u(0.6, 1.4))
        x = F.adjust_hue(x, u(-0.1, 0.1))
        x = F.gaussian_blur(x, [3, 3], [u(0.1, 1.0)])
        x = F.rotate(x, u(-15, 15), interpolation=F.InterpolationMode.BILINEAR)
    return F.normalize(x, CIFAR_MEAN, CIFAR_STD)


class AugmentedImages:
    """A map-style dataset: sample i decodes image i % len(images) and augments it with a generator seeded by i.

    `length` may exceed the number of stored images (more samples than images, each augmented differently). Works with
    torch.utils.data.DataLoader and any number of workers; batches do not depend on the number of workers (lesson 03).
    """

    def __init__(self, images: EncodedImages, *, image_size: int = 32, length: int | None = None, heavy: bool = True,
                 seed: int = 0):
        if not isinstance(images, EncodedImages):
            raise TypeError(f"images must be an EncodedImages (from synthetic_cifar or cifar10), got {type(images).__name__}")
        if image_size < 8:
            raise ValueError(f"image_size must be at least 8 pixels, got {image_size}")
        if length is not None and length < 1:
            raise ValueError(f"length must be positive or None, got {length}")
        self.images, self.image_size, self.heavy, self.seed = images, image_size, heavy, seed
        self.length = length or len(images)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        import torch

        if not 0 <= index < self.length:
            raise IndexError(f"sample {index} is out of range for a dataset of {self.length}")
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        img = decode(self.images.blobs[index % len(self.images)])
        return augment(img, self.image_size, generator, heavy=self.heavy), self.images.labels[index % len(self.images)]


class EpochShuffle:
    """A sampler: a fresh permutation every epoch, from a generator seeded by (seed, epoch) alone (lesson 03).

    DataLoader's own shuffle draws from one stateful generator that persistent workers consume differently, so the
    order of epoch 2 could depend on the loader's settings; here it cannot.
    """

    def __init__(self, n: int, seed: int = 0):
        if n < 1:
            raise ValueError(f"cannot shuffle an empty dataset (n={n})")
        self.n, self.seed, self.epoch = n, seed, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        import torch

        generator = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        self.epoch += 1
        return iter(torch.randperm(self.n, generator=generator).tolist())


def make_loader(dataset, batch_size: int, *, num_workers: int = 0, pin_memory: bool = False,
                persistent_workers: bool = False, prefetch_factor: int | None = None, seed: int = 0,
                shuffle: bool = True, drop_last: bool = True):
    """A DataLoader whose sample order depends only on `seed` (lesson 03 turns its knobs one at a time)."""
    import torch
    from torch.utils.data import DataLoader

    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if num_workers == 0 and (persistent_workers or prefetch_factor is not None):
        raise ValueError("persistent_workers and prefetch_factor need num_workers > 0 (they configure worker processes)")
    if pin_memory and not torch.cuda.is_available():
        pin_memory = False  # pinned host memory only helps copies to a GPU; without one torch would warn and ignore it
    return DataLoader(
        dataset, batch_size=batch_size, sampler=EpochShuffle(len(dataset), seed) if shuffle else None,
        drop_last=drop_last, num_workers=num_workers,
        pin_memory=pin_memory, persistent_workers=persistent_workers, prefetch_factor=prefetch_factor,
        generator=torch.Generator().manual_seed(seed),
    )
