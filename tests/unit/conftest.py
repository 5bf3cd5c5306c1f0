"""Fixtures shared by unit tests."""

import numpy as np
import pytest

from utils.serving import repository


@pytest.fixture
def assets(tmp_path):
    """Stand-ins for lesson 05's pipeline files (an ONNX path, a tokenizer, a 3-class classifier): enough to write a
    model repository without exporting MiniLM."""
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"not really onnx")
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")
    rng = np.random.default_rng(0)
    clf = repository.write_classifier(tmp_path / "clf.npz", rng.normal(size=(repository.HIDDEN_SIZE, 3)), np.zeros(3),
                                      ["a", "b", "c"])
    return onnx, tok, clf
