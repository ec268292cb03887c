"""TensorFlow kernels this machine lacks, told as the layer and the cause instead of a traceback.

Which kernels exist depends on the TensorFlow build and the CPU: without oneDNN (TensorFlow enables it only on
some x86 CPUs, or ``TF_ENABLE_ONEDNN_OPTS=0``) the CPU has, e.g., no ``Conv2DBackpropInput`` for dilation rates
above 1, which is the forward op of ``Conv2DTranspose(dilation_rate=2)``."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from gradscope.backend import tf
from gradscope.core.errors import MissingKernelError
from gradscope.core.graph import LayerGraph

# Phrases of TensorFlow's messages for a kernel that this build or CPU does not have.
_MISSING = (
    "do not yet support",
    "No OpKernel was registered",
    "not supported on CPU",
    "is not supported on this",
)


def missing_kernel_cause(exc: BaseException) -> str | None:
    """TensorFlow's own sentence when ``exc`` says a kernel is missing here, else None."""
    if not isinstance(exc, tf.errors.OpError):
        return None
    message = re.sub(r"\x1b\[[0-9;]*m", "", str(getattr(exc, "message", "") or exc))
    for phrase in _MISSING:
        found = re.search(r"[^.\n{}\]]*" + re.escape(phrase) + r"[^.\n{\[]*", message)
        if found:
            return found.group(0).strip()
    if isinstance(exc, tf.errors.UnimplementedError):
        return message.strip().splitlines()[0][:200] if message.strip() else "not implemented here"
    return None


def missing_kernel_op(exc: BaseException) -> str | None:
    """The TensorFlow op without a kernel (``Conv2DBackpropInput``), or None when the message does not say
    (a compiled function's error names the function, ``[Op:__inference_fn_12]``, not the op)."""
    message = str(exc)
    candidates = re.findall(r"__wrapped__(\w+?)_device", message) + re.findall(r"\[Op:(\w+)\]", message)
    candidates.append(getattr(getattr(exc, "op", None), "type", None) or "")
    return next((c for c in candidates if c and not c.startswith("__")), None)


def _node_of_op(graph: LayerGraph, exc: BaseException) -> str | None:
    """The node whose layer name is a scope of the failing op's name (graph mode: ``<layer>_1/conv_transpose``;
    Keras adds ``_<k>`` when a layer's scope is entered again)."""
    message = str(exc)
    op = getattr(exc, "op", None)
    names = [getattr(op, "name", None) or ""]
    names += re.findall(r"\{\{node ([^}]+)\}\}", message) + re.findall(r"Detected at node (\S+)", message)
    scopes = [part for name in names for part in name.split("/")[:-1]]
    layers = [(spec.layer_name, spec.id) for spec in graph.nodes if spec.layer_name]
    for exact in (True, False):
        for scope in scopes:
            for layer_name, node_id in layers:
                if scope == layer_name or (not exact and re.fullmatch(re.escape(layer_name) + r"_\d+", scope)):
                    return node_id
    called = re.search(r"when calling (\w+)\.call\(\)", message)  # eager: Keras names the layer class
    if called:
        of_type = [spec.id for spec in graph.nodes if spec.op_type == called.group(1)]
        if len(of_type) == 1:
            return of_type[0]
    return None


def as_missing_kernel(exc: BaseException, graph: LayerGraph, node_id: str | None = None) -> MissingKernelError | None:
    """A ``MissingKernelError`` naming the layer for ``exc``, or None when ``exc`` is something else."""
    cause = missing_kernel_cause(exc)
    if cause is None:
        return None
    node_id = node_id or _node_of_op(graph, exc)
    where = "a layer of the model"
    if node_id is not None:
        spec = graph.node(node_id)
        where = f"layer '{spec.layer_name or spec.id}' ({spec.op_type})"
    op = missing_kernel_op(exc)
    onednn = (
        " (oneDNN is switched off here: TF_ENABLE_ONEDNN_OPTS=0)"
        if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0"
        else ""
    )
    return MissingKernelError(
        f"TensorFlow on this machine cannot run {where}: {cause}{f' (op {op})' if op else ''}. Which kernels "
        f"exist depends on the TensorFlow build and the CPU{onednn}: try another build or a GPU, or change the "
        "layer.",
        node_id=node_id,
    )


@contextmanager
def kernels_named(graph: LayerGraph, node_id: str | None = None) -> Iterator[None]:
    """Turn a missing-kernel error raised inside the block into a ``MissingKernelError`` for ``node_id``."""
    try:
        yield
    except tf.errors.OpError as exc:
        translated = as_missing_kernel(exc, graph, node_id)
        if translated is None:
            raise
        raise translated from exc
