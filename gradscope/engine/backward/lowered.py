"""Common Keras layers as the raw TensorFlow ops they run: forward and true VJP, for the live path.

The live path runs the forward pass and cold backward nodes eagerly, one layer at a time. Keras' eager layer
call costs far more than the ops in it (measured on ResNet50 224x224 batch 1, 2-core CPU: the Keras calls of
a forward take 0.20-0.25 s, the same ops called directly 0.09 s), and a node's VJP recorded on a tape costs a
tape walk per node. A lowered layer calls the ops Keras would call, in the same order, and its VJP is the op
TensorFlow's registered gradient runs (``Conv2DBackpropInput``, ``ReluGrad``, ``MaxPoolGrad``, ...): the
values are those of the Keras call and of ``tape.gradient`` (``tests/engine/backward/test_lowered.py``, to 1e-6).

Only plain configurations are lowered: built-in classes (not subclasses), float32 throughout, channels-last,
no masks, LoRA or quantization. Anything else returns None and runs through Keras as before. A language model's
head (``ReversibleEmbedding`` called with ``reverse=True``) is lowered in any float dtype, for its memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gradscope.backend import keras, tf
from gradscope.engine.backward.keras_graph import Step

Tensors = Sequence[Any]


@dataclass(frozen=True)
class Lowered:
    """A layer call as ``forward(xs, ws) -> ys`` and ``vjp(xs, ys, ws, dys) -> dxs`` (one per x), ``ws`` the
    values of the layer's variables in ``layer.variables`` order (a rule may pass other weights: ``W+``, or
    None for a bias it drops). ``vjp`` reads ``ys`` only for layers without weights (ReLU, max pool) and never
    reads a bias, so at the forward ``xs`` and ``ys`` it is the true VJP for any ``ws`` (``RuleContext.vjp``)."""

    forward: Callable[[Tensors, Tensors], list[Any]]
    vjp: Callable[[Tensors, Tensors, Tensors, Tensors], list[Any]]


def lower(step: Step, args: tuple, kwargs: dict) -> Lowered | None:
    """The lowered form of ``step`` called with ``(args, kwargs)``, or None when it is not a plain case."""
    op = step.operation
    if step.kind not in ("call", "activation") or len(args) != 1:
        return None
    xs = list(args[0]) if isinstance(args[0], (list, tuple)) else [args[0]]
    if kwargs.get("reverse") is True and isinstance(op, keras.layers.ReversibleEmbedding):
        return _reverse_embedding(op, xs, kwargs)
    if not _plain_call(op, xs, kwargs):
        return None
    if step.kind == "activation":
        return _RELU if op.activation is keras.activations.relu else None
    make = _LOWERINGS.get(type(op))
    return make(op, step.linear_call, xs) if make is not None else None


def _plain_call(op: Any, xs: list, kwargs: dict) -> bool:
    if any(k not in ("training", "mask") or v not in (None, False) for k, v in kwargs.items()):
        return False
    return (
        all(tf.is_tensor(x) and x.dtype == tf.float32 and x.shape.rank is not None for x in xs)
        and getattr(op, "compute_dtype", "float32") == "float32"
        and getattr(op, "variable_dtype", "float32") == "float32"
        and getattr(op, "data_format", "channels_last") == "channels_last"
        and not getattr(op, "lora_enabled", False)
        and getattr(op, "quantization_mode", None) is None
    )


def _linear(op: Any, linear_call: bool) -> bool:
    """Whether the layer's own activation is linear in this call (or split off into its own node)."""
    return linear_call or op.activation in (None, keras.activations.linear)


def _index(op: Any, variable: Any) -> int:
    """Where ``variable`` sits in ``op.variables`` (the order of ``ws``)."""
    return next(i for i, v in enumerate(op.variables) if v is variable)


def _relu_forward(xs: Tensors, ws: Tensors) -> list[Any]:
    return [tf.nn.relu(xs[0])]


def _relu_vjp(xs: Tensors, ys: Tensors, ws: Tensors, dys: Tensors) -> list[Any]:
    return [tf.raw_ops.ReluGrad(gradients=dys[0], features=ys[0])]


_RELU = Lowered(_relu_forward, _relu_vjp)


def _conv2d(op: Any, linear_call: bool, xs: list) -> Lowered | None:
    if op.rank != 2 or op.groups != 1 or tuple(op.dilation_rate) != (1, 1) or not _linear(op, linear_call):
        return None
    strides, padding = list(op.strides), op.padding.upper()
    k = _index(op, op.kernel)
    b = _index(op, op.bias) if op.use_bias else None

    def forward(xs: Tensors, ws: Tensors) -> list[Any]:
        y = tf.nn.convolution(xs[0], ws[k], strides, padding, data_format="NHWC")
        return [y if b is None or ws[b] is None else tf.add(y, ws[b])]  # None: a rule dropped the bias

    def vjp(xs: Tensors, ys: Tensors, ws: Tensors, dys: Tensors) -> list[Any]:
        dx = tf.raw_ops.Conv2DBackpropInput(
            input_sizes=tf.shape(xs[0]),
            filter=ws[k],
            out_backprop=dys[0],
            strides=[1, *strides, 1],
            padding=padding,
            data_format="NHWC",
        )
        return [dx]

    return Lowered(forward, vjp)


def _dense(op: Any, linear_call: bool, xs: list) -> Lowered | None:
    """A Dense on the last axis: one MatMul on the input flattened to 2-d (a language model's (batch, sequence,
    width) too), reshaped back: the op Keras's ``matmul`` runs for these ranks."""
    rank = xs[0].shape.rank
    if rank is None or rank < 2 or not _linear(op, linear_call):
        return None
    k = _index(op, op.kernel)
    b = _index(op, op.bias) if op.bias is not None else None

    def flat(t: Any) -> Any:
        return t if rank == 2 else tf.reshape(t, [-1, tf.shape(t)[-1]])

    def back(t: Any, like: Any) -> Any:
        return t if rank == 2 else tf.reshape(t, tf.concat([tf.shape(like)[:-1], tf.shape(t)[-1:]], 0))

    def forward(xs: Tensors, ws: Tensors) -> list[Any]:
        y = back(tf.matmul(flat(xs[0]), ws[k]), xs[0])
        return [y if b is None or ws[b] is None else tf.add(y, ws[b])]  # None: a rule dropped the bias

    def vjp(xs: Tensors, ys: Tensors, ws: Tensors, dys: Tensors) -> list[Any]:
        return [back(tf.matmul(flat(dys[0]), ws[k], transpose_b=True), xs[0])]

    return Lowered(forward, vjp)


#: Vocabulary rows per product in a language model's head (``_reverse_embedding``).
HEAD_CHUNK_ROWS = 32_768
#: The head's VJP multiplies only the positions with a gradient when they are at most 1 in this many.
SPARSE_HEAD_FRACTION = 4


def _reverse_embedding(op: Any, xs: list, kwargs: dict) -> Lowered | None:
    """A language model's head, ``ReversibleEmbedding(x, reverse=True)``: logits = x @ E^T (tied) or x @ K, in
    products of ``HEAD_CHUNK_ROWS`` vocabulary rows. Keras transposes the whole embedding first and a bfloat16
    product widens its operands to float32: a Gemma-3-1B-shaped head (262,144 x 1,152) took 1.8 GB above the model
    for its forward and 1.2 GB for its VJP, the largest transient of a first map; in chunks, ~0.2 GB. Any float
    dtype; not with a logit soft-cap, quantization or LoRA (those run through Keras)."""
    if set(kwargs) - {"reverse", "training"} or kwargs.get("training") not in (None, False) or len(xs) != 1:
        return None
    x = xs[0]
    if not (tf.is_tensor(x) and x.dtype.is_floating and x.shape.rank is not None and x.shape.rank >= 2):
        return None
    if getattr(op, "logit_soft_cap", None) is not None or getattr(op, "quantization_mode", None) is not None:
        return None
    if getattr(op, "lora_enabled", False) or x.dtype.name != op.compute_dtype:
        return None
    tied = bool(op.tie_weights)
    k = _index(op, op.embeddings if tied else op.reverse_embeddings)
    dtype = op.reverse_dtype or op.compute_dtype
    vocabulary = int(op.input_dim)
    chunks = [(i, min(i + HEAD_CHUNK_ROWS, vocabulary)) for i in range(0, vocabulary, HEAD_CHUNK_ROWS)]

    def part(w: Any, i: int, j: int) -> Any:  # (rows, width) of the vocabulary, as the product's dtype
        return tf.cast(w[i:j] if tied else tf.transpose(w[:, i:j]), dtype)

    def forward(xs: Tensors, ws: Tensors) -> list[Any]:
        h = tf.cast(xs[0], dtype)
        return [tf.concat([tf.matmul(h, part(ws[k], i, j), transpose_b=True) for i, j in chunks], axis=-1)]

    def product(dy: Any, w: Any) -> Any:
        return tf.add_n([tf.matmul(dy[..., i:j], part(w, i, j)) for i, j in chunks])

    def vjp(xs: Tensors, ys: Tensors, ws: Tensors, dys: Tensors) -> list[Any]:
        dy = tf.cast(dys[0], dtype)
        # A next-token target seeds one position: the product of the others' zero rows is skipped (2,048 tokens
        # of a 128,256-word head: a 537 GFLOP product for one row). Exact: those rows of dx are zeros either way.
        # Eager only (a traced plan keeps one product for any input).
        rows = tf.reduce_any(tf.not_equal(dy, 0), axis=-1) if tf.executing_eagerly() else None
        if rows is not None and int(tf.math.count_nonzero(rows)) * SPARSE_HEAD_FRACTION <= int(tf.size(rows)):
            where = tf.where(rows)
            dx = tf.scatter_nd(where, product(tf.gather_nd(dy, where), ws[k]), tf.shape(xs[0], out_type=tf.int64))
        else:
            dx = product(dy, ws[k])
        return [tf.cast(dx, xs[0].dtype)]

    return Lowered(forward, vjp)


def _batch_norm(op: Any, linear_call: bool, xs: list) -> Lowered | None:
    if op.axis not in (-1, xs[0].shape.rank - 1):  # the vectors broadcast along the last axis only
        return None
    mean, variance = _index(op, op.moving_mean), _index(op, op.moving_variance)
    gamma = _index(op, op.gamma) if op.scale else None
    beta = _index(op, op.beta) if op.center else None

    def inverse(ws: Tensors) -> Any:
        # tf.nn.batch_normalization's order (what Keras calls): rsqrt(var + eps) * gamma
        inv = tf.math.rsqrt(ws[variance] + op.epsilon)
        return inv if gamma is None else inv * ws[gamma]

    def forward(xs: Tensors, ws: Tensors) -> list[Any]:
        inv = inverse(ws)
        offset = -ws[mean] * inv if beta is None else ws[beta] - ws[mean] * inv
        return [xs[0] * inv + offset]

    def vjp(xs: Tensors, ys: Tensors, ws: Tensors, dys: Tensors) -> list[Any]:
        return [dys[0] * inverse(ws)]

    return Lowered(forward, vjp)


def _add(op: Any, linear_call: bool, xs: list) -> Lowered | None:
    if any(x.shape != xs[0].shape for x in xs):  # broadcasting: the VJP would need reductions
        return None

    def forward(xs: Tensors, ws: Tensors) -> list[Any]:
        y = xs[0]
        for x in xs[1:]:
            y = tf.add(y, x)
        return [y]

    def vjp(xs: Tensors, ys: Tensors, ws: Tensors, dys: Tensors) -> list[Any]:
        return [dys[0]] * len(xs)

    return Lowered(forward, vjp)


def _zero_padding2d(op: Any, linear_call: bool, xs: list) -> Lowered:
    (top, bottom), (left, right) = op.padding

    def forward(xs: Tensors, ws: Tensors) -> list[Any]:
        return [tf.pad(xs[0], [[0, 0], [top, bottom], [left, right], [0, 0]])]

    def vjp(xs: Tensors, ys: Tensors, ws: Tensors, dys: Tensors) -> list[Any]:
        return [tf.slice(dys[0], [0, top, left, 0], tf.shape(xs[0]))]

    return Lowered(forward, vjp)


def _max_pool2d(op: Any, linear_call: bool, xs: list) -> Lowered:
    ksize, strides, padding = [1, *op.pool_size, 1], [1, *op.strides, 1], op.padding.upper()

    def forward(xs: Tensors, ws: Tensors) -> list[Any]:
        return [tf.nn.max_pool2d(xs[0], ksize, strides, padding)]

    def vjp(xs: Tensors, ys: Tensors, ws: Tensors, dys: Tensors) -> list[Any]:
        grad = tf.raw_ops.MaxPoolGrad(
            orig_input=xs[0], orig_output=ys[0], grad=dys[0], ksize=ksize, strides=strides, padding=padding
        )
        return [grad]

    return Lowered(forward, vjp)


def _global_average_pool2d(op: Any, linear_call: bool, xs: list) -> Lowered | None:
    if xs[0].shape.rank != 4:
        return None

    def forward(xs: Tensors, ws: Tensors) -> list[Any]:
        return [tf.reduce_mean(xs[0], axis=[1, 2], keepdims=op.keepdims)]

    def vjp(xs: Tensors, ys: Tensors, ws: Tensors, dys: Tensors) -> list[Any]:
        shape = tf.shape(xs[0])
        dy = dys[0] if op.keepdims else dys[0][:, None, None, :]
        return [tf.broadcast_to(dy, shape) / tf.cast(shape[1] * shape[2], dy.dtype)]

    return Lowered(forward, vjp)


def _relu_layer(op: Any, linear_call: bool, xs: list) -> Lowered | None:
    plain = op.max_value is None and float(op.negative_slope) == 0.0 and float(op.threshold) == 0.0
    return _RELU if plain else None


def _activation_layer(op: Any, linear_call: bool, xs: list) -> Lowered | None:
    return _RELU if op.activation is keras.activations.relu else None


_LOWERINGS: dict[type, Callable[[Any, bool, list], Lowered | None]] = {
    keras.layers.Conv2D: _conv2d,
    keras.layers.Dense: _dense,
    keras.layers.BatchNormalization: _batch_norm,
    keras.layers.Add: _add,
    keras.layers.ZeroPadding2D: _zero_padding2d,
    keras.layers.MaxPooling2D: _max_pool2d,
    keras.layers.GlobalAveragePooling2D: _global_average_pool2d,
    keras.layers.ReLU: _relu_layer,
    keras.layers.Activation: _activation_layer,
}
