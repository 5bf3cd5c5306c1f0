"""The Python-backend programs of lesson 05's pipeline, as ordinary files of this package (lesson 05).

Each folder holds one ``model.py`` that Triton's Python backend runs inside its stub process:

- ``preprocess/model.py``: UTF-8 text -> MiniLM token ids, padded to a fixed length;
- ``encoder/model.py``: MiniLM (ONNX) run with ONNX Runtime;
- ``postprocess/model.py``: mean pooling, L2 normalisation and a linear classifier.

They import ``triton_python_backend_utils``, which exists only inside the server's stub, so nothing here imports them;
``utils.serving.repository`` copies them into a model repository (``model_file`` / ``build_pipeline``) and the lesson prints
them from the copy the server runs. Ruff lints them like the rest of the package; tests/test_triton_server.py serves
each of them on the real server.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["MODELS", "model_file"]

MODELS = ("preprocess", "encoder", "postprocess")


def model_file(model: str) -> Path:
    """The model.py of one of MODELS (lesson 05)."""
    if model not in MODELS:
        raise ValueError(f"no Python-backend program named {model!r}; expected one of {list(MODELS)}")
    return Path(__file__).parent / model / "model.py"
