"""The layer graph as plain data: what the GUI draws, the CLI prints and plans select from.

No TensorFlow here: the engine builds a ``LayerGraph`` from a Keras model once, and everything else
(views, selectors, session files) works on these frozen dataclasses.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from gradscope.core.display import RichDisplay

Shape = tuple[int | None, ...]

PRE_SUFFIX = ":pre"  # "feat:pre": the linear part of a layer with a fused activation; "feat" is its output


@dataclass(frozen=True)
class NodeSpec:
    """One call of one operation in the model (a shared layer called twice is two nodes).

    ``id`` is stable across save/load: the layer path (``outer/inner/layer``) plus ``#k`` for the k-th call of a
    shared layer (k > 0). A layer with a fused ``activation=`` is two nodes: its id names the activation, whose
    output is what Keras calls the layer's output, and ``<id>:pre`` the linear part before it.
    """

    id: str
    name: str
    op_type: str
    inputs: tuple[str, ...]
    input_shapes: tuple[Shape, ...]
    output_shapes: tuple[Shape, ...]
    dtype: str
    params: int = 0
    trainable_params: int = 0
    group: str | None = None  # id of the nested model this node belongs to (None: top level)
    activation: str | None = None  # activation function name for activation nodes (split or standalone)
    layer_name: str | None = None  # name of the Keras layer/operation that runs this node
    is_input: bool = False
    is_output: bool = False
    fused_with: str | None = None  # on a split activation: the id of its layer's linear part ("<id>:pre")
    fused_activation: str | None = None  # on that linear part: the activation split off after it
    first_call: str | None = None  # the node that first called this node's layer, when another did (shared weights)
    config: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def output_shape(self) -> Shape:
        return self.output_shapes[0] if self.output_shapes else ()

    @property
    def kind(self) -> str:
        """The node's type in words: ``Conv2D``; for a layer with a fused activation ``Conv2D (pre-relu)`` and
        ``relu (output)``, so the graph shows which of the two nodes is the layer's output."""
        if self.fused_with is not None:
            return f"{self.activation} (output)"
        if self.fused_activation is not None:
            return f"{self.op_type} (pre-{self.fused_activation})"
        return self.op_type

    @property
    def label(self) -> str:
        """What the graph view draws: the id (the name JSON, the CLI and diagnostics use), type and shape."""
        shape = "x".join("?" if d is None else str(d) for d in self.output_shape[1:])
        return f"{self.id}\n{self.kind} {shape}".rstrip()


#: Names of the integer inputs that come with token ids (keras_hub, Hugging Face): what each is made from.
_COMPANION_HINTS = (("mask", "mask"), ("segment", "segment"), ("token_type", "segment"))


def companion_kind(input_name: str) -> str | None:
    """ "mask" for a padding/attention mask input, "segment" for segment / token-type ids, else None."""
    name = input_name.lower()
    return next((kind for hint, kind in _COMPANION_HINTS if hint in name), None)


#: Config key of a composite layer (a transformer block) that stayed one node, with why: rules cannot reach inside
#: it, and the presets say so naming it.
KEPT_WHOLE = "kept whole"
#: Config key of an attention layer's head count (set by the engine's graph builder, whatever the layer calls it).
ATTENTION_HEADS = "attention heads"
#: From this many tokens on a prompt is long: the engine keeps no per-node tapes and answers every plan live, so
#: attention's (heads, L, L) tensors are alive one layer at a time (``Engine.is_long_input``).
LONG_INPUT_TOKENS = 512


@dataclass(frozen=True)
class LayerGraph(RichDisplay):
    """A DAG of nodes in topological order (inputs first)."""

    _html_maker = "gradscope.app.display.reports:layer_graph_html"  # in a notebook (gradscope.core.display)

    nodes: tuple[NodeSpec, ...]
    input_ids: tuple[str, ...]
    output_ids: tuple[str, ...]
    model_name: str = "model"
    groups: tuple[str, ...] = ()  # ids of nested models, outermost first
    notes: tuple[str, ...] = ()  # how the graph was obtained, when that is worth telling (subclassed models)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {n.id: n for n in self.nodes})

    def __iter__(self) -> Iterator[NodeSpec]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._by_id  # type: ignore[attr-defined]

    @property
    def is_language_model(self) -> bool:
        """Token ids in, (batch, sequence, vocabulary) logits out: a class target is the next token."""
        shape = self.node(self.output_ids[0]).output_shape if self.output_ids else ()
        return self.token_input is not None and len(shape) == 3

    def class_count(self) -> int | None:
        """How many classes the first output scores, when it is (batch, classes); else None."""
        shape = self.node(self.output_ids[0]).output_shape if self.output_ids else ()
        return shape[-1] if len(shape) == 2 and shape[-1] else None

    def is_integer_input(self, node_id: str) -> bool:
        """True for a model input of whole numbers (token ids, category codes): no gradient reaches it."""
        node = self.node(node_id)
        return node.is_input and node.dtype.startswith(("int", "uint", "bool"))

    @property
    def token_input(self) -> str | None:
        """The input of a model that takes one sequence of token ids, else None: its only input is integer, or
        every input is, and all but one are companions derived from the ids (``token_companions``: BERT's
        ``padding_mask`` and ``segment_ids``) of the same shape."""
        if not self.input_ids or not all(self.is_integer_input(i) for i in self.input_ids):
            return None
        if len(self.input_ids) == 1:
            return self.input_ids[0]
        main = [i for i in self.input_ids if companion_kind(i) is None]
        shape = self.node(main[0]).output_shape if len(main) == 1 else None
        if shape is None or any(self.node(i).output_shape != shape for i in self.input_ids):
            return None
        return main[0]

    @property
    def token_companions(self) -> dict[str, str]:
        """The inputs a token model derives from its ids: input id -> "mask" (1 where a token is) or "segment"
        (0: one segment); empty for a model with one input."""
        main = self.token_input
        if main is None:
            return {}
        return {i: companion_kind(i) or "" for i in self.input_ids if i != main}

    def vocabulary_size(self, input_id: str) -> int | None:
        """How many ids the embedding of an integer input has (its ``input_dim``), when it says."""
        embedding = self.embedding_of(input_id)
        size = embedding.config.get("input_dim") if embedding is not None else None
        return size if isinstance(size, int) else None

    @property
    def compute_dtype(self) -> str:
        """The floating dtype most nodes compute in ("bfloat16" for a checkpoint opened as stored), else "float32"."""
        dtypes = [n.dtype for n in self.nodes if not n.is_input and n.dtype.startswith(("float", "bfloat"))]
        return max(set(dtypes), key=dtypes.count) if dtypes else "float32"

    def position_limit(self) -> tuple[int, str] | None:
        """(how many positions, the node that has them): a learned position embedding's ``sequence_length``
        (GPT-2's 1,024), the most tokens the model can read; None where nothing bounds it (rotary positions)."""
        limits = [
            (n.config["sequence_length"], n.id)
            for n in self.nodes
            if "PositionEmbedding" in n.op_type and isinstance(n.config.get("sequence_length"), int)
        ]
        return min(limits) if limits else None

    def attention_heads(self) -> list[int]:
        """The head count of each attention layer: each holds (heads, L, L) scores for a sequence of L tokens."""
        return [n.config[ATTENTION_HEADS] for n in self.nodes if isinstance(n.config.get(ATTENTION_HEADS), int)]

    def bytes_per_token(self) -> int:
        """Bytes of every node's floating output for one more token of a sequence (batch 1): what a pass that keeps
        each node's output, or its signal, holds per token (a Llama-3-shaped 309 M model: 0.13 MB)."""
        sizes = {"bfloat16": 2, "float16": 2, "float64": 8}  # else float32's 4
        return sum(
            math.prod(shape[2:]) * sizes.get(n.dtype, 4)
            for n in self.nodes
            if not n.is_input and n.dtype.startswith(("float", "bfloat"))
            for shape in n.output_shapes
            if len(shape) >= 3 and all(isinstance(d, int) for d in shape[2:])
        )

    def embedding_of(self, input_id: str) -> NodeSpec | None:
        """Where an integer input becomes real numbers (its ``Embedding``): the first node fed by it whose
        output is floating point, following integer-valued nodes (casts, slices) on the way; None if none."""
        frontier, seen = [input_id], set()
        while frontier:
            current = frontier.pop(0)
            for child in self.children(current):
                if child.id in seen:
                    continue
                seen.add(child.id)
                if child.dtype.startswith(("float", "bfloat")):
                    return child
                frontier.append(child.id)
        return None

    def node(self, node_id: str) -> NodeSpec:
        try:
            return self._by_id[node_id]  # type: ignore[attr-defined]
        except KeyError:
            from gradscope.core.errors import GraphError

            base, _, suffix = node_id.rpartition(":")
            if suffix == "act" and base in self:  # an id of plan/session schema 1
                raise GraphError(
                    f"No node {node_id!r} in model {self.model_name!r}: a fused activation is now {base!r} (the "
                    f"layer's output, as Keras defines it) and the linear part before it {base + PRE_SUFFIX!r}."
                ) from None
            close = [n.id for n in self.nodes if node_id.lower() in n.id.lower()][:5]
            hint = f" Did you mean: {', '.join(close)}?" if close else " Run `gradscope graph MODEL` to list nodes."
            raise GraphError(f"No node {node_id!r} in model {self.model_name!r}.{hint}") from None

    def ids(self) -> list[str]:
        return [n.id for n in self.nodes]

    def edges(self) -> list[tuple[str, str]]:
        return [(src, n.id) for n in self.nodes for src in n.inputs]

    def parents(self, node_id: str) -> list[NodeSpec]:
        return [self.node(i) for i in self.node(node_id).inputs]

    def children(self, node_id: str) -> list[NodeSpec]:
        return [n for n in self.nodes if node_id in n.inputs]

    def find(self, text: str) -> list[NodeSpec]:
        """Nodes whose id, name or type contains ``text`` (case-insensitive): the search box."""
        t = text.lower()
        return [n for n in self.nodes if t in n.id.lower() or t in n.name.lower() or t in n.op_type.lower()]

    def to_table(self) -> str:
        """A fixed-width table for the CLI (`gradscope graph MODEL`)."""
        rows = [("id", "type", "output shape", "params", "inputs")]
        for n in self.nodes:
            shape = "(" + ", ".join("None" if d is None else str(d) for d in n.output_shape) + ")"
            rows.append((n.id, n.op_type, shape, f"{n.params:,}", ", ".join(n.inputs)))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        lines.append(f"{len(self.nodes)} nodes, {self.param_count():,} parameters")
        return "\n".join(line.rstrip() for line in lines)

    def id_from_v1(self, old_id: str) -> str:
        """The id a node had in files of gradscope's first id scheme (plan/session schema 1), in today's scheme.

        Schema 1 called a fused layer's linear part ``feat`` and its activation ``feat:act``; today ``feat`` is
        the layer's output (the activation) and ``feat:pre`` the linear part. Other ids are unchanged.
        """
        base, _, suffix = old_id.rpartition(":")
        if suffix == "act" and base in self and self.node(base).fused_with is not None:
            return base
        return old_id + PRE_SUFFIX if old_id + PRE_SUFFIX in self else old_id

    def param_count(self) -> int:
        """The model's parameters, each layer once (Keras' ``count_params()``): shared calls and split
        activations hold no weights of their own."""
        return sum(n.params for n in self.nodes if n.first_call is None)

    def to_dict(self) -> dict:
        return {
            "model_name": self.model_name,
            "input_ids": list(self.input_ids),
            "output_ids": list(self.output_ids),
            "groups": list(self.groups),
            "notes": list(self.notes),
            "nodes": [
                {
                    "id": n.id,
                    "name": n.name,
                    "op_type": n.op_type,
                    "inputs": list(n.inputs),
                    "output_shapes": [list(s) for s in n.output_shapes],
                    "params": n.params,
                    "group": n.group,
                    "activation": n.activation,
                }
                for n in self.nodes
            ],
        }
