"""Custom layers of the hypernetwork examples (import this file to load them).

A hypernetwork predicts the weights of another network's layer. There are two ways to use the prediction:

- ``AssignedDense`` (BROKEN on purpose): writes the predicted kernel into its target ``Dense`` layer's variable
  with ``variable.assign`` and then calls the layer. The forward pass is right, but a variable is state: the
  read after the write starts a new path, so the hypernetwork that predicted the kernel gets **no gradient**
  (``gradscope diagnose`` names the ``AssignVariableOp`` and this layer). ``set_weights`` is the same thing.
- ``PredictedDense`` (correct): uses the predicted kernel as a tensor, ``y = x @ W(c) + b`` per sample with
  ``keras.ops.einsum``, so the gradient reaches the hypernetwork. For an existing layer the same is
  ``layer.stateless_call([kernel, bias], [], x)``: weights passed as tensors, not stored.

Both take ``[x, predicted_weights]`` with ``predicted_weights`` of shape ``(batch, in_dim * units)``; in a
functional model that tensor is an edge from the hypernetwork's head to this layer in the layer graph.

Load the saved examples with ``gradscope ... --custom-objects resources/hypernet/hyperlayers.py`` (CLI) or
``load_model(path, custom_objects=load_custom_objects_file("resources/hypernet/hyperlayers.py"))`` (API).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402

PACKAGE = "gradscope_hypernet"


@keras.saving.register_keras_serializable(package=PACKAGE)
class AssignedDense(keras.layers.Layer):
    """Dense layer whose kernel is *assigned* from a hypernetwork's prediction (cuts the gradient).

    One kernel per batch (the batch mean of the predictions): a variable holds one value.
    """

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        self.target = keras.layers.Dense(self.units, name="target")

    def build(self, input_shape):
        x_shape, _ = input_shape
        self.target.build(x_shape)

    def call(self, inputs):
        x, predicted = inputs
        in_dim = x.shape[-1]
        kernel = keras.ops.reshape(keras.ops.mean(predicted, axis=0), (in_dim, self.units))
        self.target.kernel.assign(kernel)  # the bug: a state write, no gradient flows back through it
        return self.target(x)

    def compute_output_shape(self, input_shape):
        return (*input_shape[0][:-1], self.units)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable(package=PACKAGE)
class PredictedDense(keras.layers.Layer):
    """Dense layer computed with the hypernetwork's predicted kernel as a tensor (one kernel per sample)."""

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)

    def build(self, input_shape):
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")

    def call(self, inputs):
        x, predicted = inputs
        in_dim = x.shape[-1]
        kernel = keras.ops.reshape(predicted, (-1, in_dim, self.units))
        return keras.ops.einsum("bi,biu->bu", x, kernel) + self.bias

    def compute_output_shape(self, input_shape):
        return (*input_shape[0][:-1], self.units)

    def get_config(self):
        return {**super().get_config(), "units": self.units}
