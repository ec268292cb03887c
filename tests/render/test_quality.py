import numpy as np

from gradscope.render import degeneracy


def test_degeneracy_names_what_is_wrong():
    assert degeneracy(np.zeros((4, 4))) == "all zero"
    assert degeneracy(np.full((2, 3), 0.5)).startswith("constant")
    bad = np.ones((3, 3))
    bad[0, 0], bad[1, 1] = np.nan, np.inf
    assert degeneracy(bad) == "non-finite values (1 NaN, 1 Inf of 9)"
    assert degeneracy(np.zeros((0, 4))) == "empty"


def test_an_informative_map_is_not_degenerate():
    m = np.zeros((5, 5))
    m[2, 3] = 1e-30  # tiny but real
    assert degeneracy(m) is None
