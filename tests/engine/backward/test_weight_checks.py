"""Weights already NaN or Inf are named in every result, however large the variable and whatever its dtype (a large
one is checked where it lies, in TensorFlow; a small one by a NumPy sum)."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras
from gradscope.engine.backward.runner import Engine
from gradscope.engine.backward.weight_checks import _CHUNK, _LARGE, _non_finite_counts


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("size", [64, _LARGE])
def test_nan_and_inf_are_counted_in_small_and_large_variables(dtype, size):
    variable = keras.Variable(np.zeros((size, 2), "float32"), dtype=dtype)
    assert _non_finite_counts(variable) == (0, 0)
    poisoned = np.zeros((size, 2), "float32")
    poisoned[size - 1, 0], poisoned[0, 1], poisoned[1, 1] = np.nan, np.inf, -np.inf
    variable.assign(poisoned)
    assert _non_finite_counts(variable) == (1, 2)


def test_a_large_bfloat16_layer_with_a_nan_is_named():
    inputs = keras.Input((1024,))
    model = keras.Model(inputs, keras.layers.Dense(1024, dtype="bfloat16", name="big")(inputs))
    kernel = np.zeros((1024, 1024), "float32")
    kernel[3, 4] = np.nan
    model.get_layer("big").kernel.assign(kernel)
    assert Engine(model).weight_problems() == ["node 'big' has 1 NaN and 0 Inf weight values (big/kernel)"]


def test_a_value_in_the_last_slice_of_a_variable_checked_by_slices_is_found():
    """A variable larger than one slice is checked a slice at a time (a whole is_finite of a 1 B Llama's embedding
    held 263 MB more): a NaN in its last, partial slice is still found."""
    rows = _CHUNK // 1024 + 3
    variable = keras.Variable(np.zeros((rows, 1024), "float32"), dtype="bfloat16")
    assert _non_finite_counts(variable) == (0, 0)
    poisoned = np.zeros((rows, 1024), "float32")
    poisoned[-1, -1] = np.nan
    variable.assign(poisoned)
    assert _non_finite_counts(variable) == (1, 0)
