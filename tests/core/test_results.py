"""LazyArrays: node signals are copied to numpy when read, or all at once by materialize()."""

from __future__ import annotations

import numpy as np

from gradscope.core.results import LazyArrays


class FakeTensor:
    def __init__(self, value):
        self.value, self.copies = value, 0

    def numpy(self):
        self.copies += 1
        return np.asarray(self.value)


def test_values_are_copied_once_when_read():
    a, b = FakeTensor([1.0, 2.0]), FakeTensor([3.0])
    lazy = LazyArrays({"a": a, "b": b, "c": np.zeros(2)})
    assert len(lazy) == 3 and "a" in lazy and a.copies == 0 and lazy.pending == 3
    np.testing.assert_array_equal(lazy["a"], [1.0, 2.0])
    lazy["a"]
    assert a.copies == 1 and b.copies == 0 and lazy.pending == 2
    lazy.materialize()
    assert b.copies == 1 and lazy.pending == 0 and dict(lazy)["b"].tolist() == [3.0]
    assert lazy.get("missing") is None
