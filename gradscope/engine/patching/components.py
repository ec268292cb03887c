"""Where the components of a transformer are in its graph: per decoder (or encoder) block, the residual stream
after it (``resid``), its attention module's output (``attn``: after the output projection, before any post-norm,
dropout or residual add) and its MLP's output projection (``mlp``), found from the block's residual adds; and the
branch nodes that feed each add, where GradDrop holds a block's contribution back. Any other model: the nodes the
user names."""

from __future__ import annotations

from dataclasses import dataclass

from gradscope.core.errors import GraphError
from gradscope.core.graph import LayerGraph, NodeSpec

COMPONENTS = ("resid", "attn", "mlp", "q", "k", "v")
#: Nodes a branch passes through between its module and the residual add (a dropout, a post-norm, a cast).
_PASS_THROUGH = ("Dropout", "Identity", "Cast", "Activation")


@dataclass(frozen=True)
class Block:
    """One block: its group, its residual stream's node, its attention and MLP nodes, the nodes that feed its
    residual adds from the branch side."""

    group: str
    resid: str
    attn: str
    mlp: str | None
    branches: tuple[str, ...]


def blocks(graph: LayerGraph) -> list[Block]:
    """The transformer blocks of ``graph`` in order (groups holding one attention node and a residual add); []
    for a model without them."""
    found = []
    for group in _groups_in_order(graph):
        members = [n for n in graph.nodes if _inside(n, group)]
        attention = [n for n in members if n.op_type.endswith("Attention")]
        resid = _block_output(graph, members)
        if len(attention) != 1 or resid is None or resid.op_type != "Add":
            continue
        adds = [n for n in members if n.op_type == "Add" and len(n.inputs) == 2]
        branches, mlp = [], None
        for add in adds:
            residual, branch = _split_add(graph, add, group)
            if branch is None:
                continue
            branches.append(branch)
            module = _module_behind(graph, branch)
            if add.id == resid.id and module is not None and not module.op_type.endswith("Attention"):
                mlp = module.id
        found.append(Block(group, resid.id, attention[0].id, mlp, tuple(branches)))
    return found


def component_nodes(graph: LayerGraph, components: tuple[str, ...]) -> dict[str, list[str]]:
    """Component -> its node in every block (q, k and v: the attention node, whose projections are hooked)."""
    found = blocks(graph)
    if not found:
        raise GraphError(
            f"{', '.join(components)} are parts of transformer blocks, and this model has none; name the nodes to "
            "patch instead (nodes=[...], --nodes), e.g. the outputs of a CNN's stages."
        )
    out: dict[str, list[str]] = {}
    for component in components:
        if component not in COMPONENTS:
            raise GraphError(f"Unknown component {component!r}; choose from {', '.join(COMPONENTS)}.")
        if component == "resid":
            out[component] = [b.resid for b in found]
        elif component == "mlp":
            missing = [b.group for b in found if b.mlp is None]
            if missing:
                raise GraphError(f"No MLP output projection found in {missing[0]}; name its node instead.")
            out[component] = [b.mlp for b in found]  # type: ignore[misc]
        else:
            out[component] = [b.attn for b in found]
    return out


def _groups_in_order(graph: LayerGraph) -> list[str]:
    """Groups holding an attention node, outermost first (a block's nested ``mlp/`` group is part of it)."""
    seen: dict[str, None] = {}
    for node in graph.nodes:
        if node.group and node.op_type.endswith("Attention"):
            seen.setdefault(node.group, None)
    return list(seen)


def _block_output(graph: LayerGraph, members: list[NodeSpec]) -> NodeSpec | None:
    """The last node of the group that a node outside it reads: the block's output."""
    inside = {n.id for n in members}
    leaving = [n for n in members if any(c.id not in inside for c in graph.children(n.id))]
    return leaving[-1] if leaving else None


def _split_add(graph: LayerGraph, add: NodeSpec, group: str) -> tuple[str | None, str | None]:
    """(the residual input, the branch input) of a residual add: the residual is the block's input (outside the
    group) or an earlier add of the block."""
    a, b = add.inputs
    for residual, branch in ((a, b), (b, a)):
        skip, side = graph.node(residual), graph.node(branch)
        if (not _inside(skip, group) or skip.op_type == "Add") and _inside(side, group) and side.op_type != "Add":
            return residual, branch
    return None, None


def _inside(node: NodeSpec, group: str) -> bool:
    return node.group is not None and (node.group == group or node.group.startswith(group + "/"))


def _module_behind(graph: LayerGraph, node_id: str) -> NodeSpec | None:
    """The module a branch comes from: back through dropouts, casts and norms to the first node that is none."""
    node = graph.node(node_id)
    while (node.op_type in _PASS_THROUGH or "Norm" in node.op_type) and len(node.inputs) == 1:
        node = graph.node(node.inputs[0])
    return node
