"""utils.training.codeview (lesson 03): a function's source with its config switches resolved, and the diff of two."""

import pytest

from utils.training import codeview


def _step(self, x):
    """Doc."""
    cfg = self.config
    if cfg.double:
        # twice
        x = x * 2
    else:
        x = x + 0  # unchanged
    if not cfg.quiet:
        print(x)
        if cfg.verbose:
            print("more")
    return x.clamp(max=cfg.limit)


def test_specialize_resolves_switches_and_values():
    src = codeview.specialize(_step, {"double": True, "quiet": False, "verbose": True, "limit": 3})
    assert src.splitlines() == [
        "def _step(self, x):",
        '    """Doc."""',
        "    # twice",
        "    x = x * 2",
        "    print(x)",
        '    print("more")',
        "    return x.clamp(max=3)",
    ]
    src = codeview.specialize(_step, {"double": False, "quiet": True, "verbose": True, "limit": None})
    assert "x = x + 0  # unchanged" in src and "print" not in src and "max=None" in src


def test_specialized_source_runs_like_the_function():
    class Obj:
        config = type("C", (), {"double": True, "quiet": True, "verbose": False, "limit": 5.0})()

    import torch

    values = {k: getattr(Obj.config, k) for k in ("double", "quiet", "verbose", "limit")}
    namespace = {}
    exec(codeview.specialize(_step, values), namespace)
    x = torch.tensor([1.0, 4.0])
    assert torch.equal(namespace["_step"](Obj(), x), _step(Obj(), x))


def test_diff_and_bad_input():
    a = codeview.specialize(_step, {"double": True, "quiet": True, "verbose": False, "limit": 1})
    b = codeview.specialize(_step, {"double": False, "quiet": True, "verbose": False, "limit": 1})
    d = codeview.diff(a, b, before_name="double", after_name="single")
    assert "-    x = x * 2" in d and "+    x = x + 0  # unchanged" in d and d.startswith("--- double")
    with pytest.raises(ValueError, match="cfg.limit"):
        codeview.specialize(_step, {"double": True, "quiet": True, "verbose": False})
    with pytest.raises(TypeError, match="mapping"):
        codeview.specialize(_step, [("double", True)])
    with pytest.raises(TypeError, match="two source strings"):
        codeview.diff(a, None)
