"""utils.core.data.image_data (lesson 03): encoded synthetic images, per-sample seeded augmentation, loaders."""

import pytest
import torch

from utils.core.data import image_data


@pytest.fixture(scope="module")
def images():
    return image_data.synthetic_cifar(24, cache=False)


def test_synthetic_is_deterministic_and_cifar_shaped(images):
    again = image_data.synthetic_cifar(24, cache=False)
    assert again.blobs == images.blobs and again.labels == images.labels
    other = image_data.synthetic_cifar(24, seed=1, cache=False)
    assert other.blobs != images.blobs
    assert len(images) == 24 and images.fmt == "png" and images.num_classes == 10
    assert set(images.labels) <= set(range(10))
    img = image_data.decode(images.blobs[0])
    assert img.dtype == torch.uint8 and img.shape == (3, 32, 32)


def test_cache_round_trip_and_jpeg():
    first = image_data.synthetic_cifar(10, seed=3, fmt="jpeg")
    cached = image_data.synthetic_cifar(10, seed=3, fmt="jpeg")  # read back from build/data
    assert cached == first
    assert image_data.decode(first.blobs[0]).shape == (3, 32, 32)


@pytest.mark.parametrize(
    "kwargs, message",
    [({"n": 0}, "positive"), ({"fmt": "gif"}, "fmt"), ({"size": 4}, "size"), ({"num_classes": 1}, "num_classes")],
)
def test_synthetic_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        image_data.synthetic_cifar(**{"n": 4, "cache": False, **kwargs})


def test_encoded_images_validates():
    with pytest.raises(ValueError, match="labels"):
        image_data.EncodedImages((b"x",), (1, 2), "png", 10)
    with pytest.raises(ValueError, match="at least one"):
        image_data.EncodedImages((), (), "png", 10)


def test_augment_is_seeded_and_shaped(images):
    img = image_data.decode(images.blobs[0])
    a = image_data.augment(img, 24, torch.Generator().manual_seed(5))
    b = image_data.augment(img, 24, torch.Generator().manual_seed(5))
    c = image_data.augment(img, 24, torch.Generator().manual_seed(6))
    assert a.shape == (3, 24, 24) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
    light = image_data.augment(img, 24, torch.Generator().manual_seed(5), heavy=False)
    assert light.shape == (3, 24, 24)
    with pytest.raises(ValueError, match="uint8 tensor"):
        image_data.augment(img.float(), 24, torch.Generator())


def test_augmented_dataset_indexing(images):
    ds = image_data.AugmentedImages(images, image_size=16, length=50)
    assert len(ds) == 50
    x, y = ds[30]  # wraps onto image 30 % 24 with its own augmentation
    assert x.shape == (3, 16, 16) and y == images.labels[30 % 24]
    assert torch.equal(ds[30][0], x)
    with pytest.raises(IndexError, match="out of range"):
        ds[50]
    with pytest.raises(TypeError, match="EncodedImages"):
        image_data.AugmentedImages([b"x"])
    with pytest.raises(ValueError, match="image_size"):
        image_data.AugmentedImages(images, image_size=4)


def test_epoch_shuffle_depends_on_seed_and_epoch_only():
    a, b = image_data.EpochShuffle(10, seed=1), image_data.EpochShuffle(10, seed=1)
    first, second = list(a), list(a)
    assert sorted(first) == list(range(10)) and first != second
    assert list(b) == first and list(b) == second
    with pytest.raises(ValueError, match="empty"):
        image_data.EpochShuffle(0)


def test_batches_do_not_depend_on_workers(images):
    ds = image_data.AugmentedImages(images, image_size=16)
    x0, y0 = next(iter(image_data.make_loader(ds, 4, num_workers=0)))
    x1, y1 = next(iter(image_data.make_loader(ds, 4, num_workers=1)))
    assert torch.equal(x0, x1) and torch.equal(y0, y1)


def test_make_loader_rejects_bad_arguments(images):
    ds = image_data.AugmentedImages(images, image_size=16)
    with pytest.raises(ValueError, match="batch_size"):
        image_data.make_loader(ds, 0)
    with pytest.raises(ValueError, match="num_workers > 0"):
        image_data.make_loader(ds, 4, persistent_workers=True)
    with pytest.raises(ValueError, match="num_workers"):
        image_data.make_loader(ds, 4, num_workers=-1)


def test_cifar10_without_files_says_how_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="download=True"):
        image_data.cifar10(tmp_path / "nothing-here")
