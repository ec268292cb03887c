"""Layered DAG layout of a ``LayerGraph`` as plain data (no Qt): boxes and edge polylines in scene units.

Computed with grandalf's Sugiyama layout (the layered "dot" style) off the UI thread; the graph view only draws
the result. Nested models can be collapsed into one box. A pure-Python longest-path layering is the fallback
when grandalf fails on a graph (it should not, but a layout problem must never stop the model from opening).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gradscope.core.graph import LayerGraph, NodeSpec

NODE_W = 172.0
NODE_H = 44.0
GROUP_PREFIX = "group:"
_X_SPACE = 26.0
_Y_SPACE = 34.0


@dataclass(frozen=True)
class NodeBox:
    """One drawn box: a node, or a collapsed nested model (``id`` = ``group:<group id>``)."""

    id: str
    x: float  # centre
    y: float  # centre
    w: float
    h: float
    title: str
    subtitle: str
    group: str | None = None  # nested model the box is drawn inside (None: top level)
    collapsed_group: str | None = None  # set for a collapsed nested model's box
    members: tuple[str, ...] = ()  # node ids a collapsed box stands for


@dataclass(frozen=True)
class EdgePath:
    src: str
    dst: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class GroupFrame:
    """The bounding rectangle of an expanded nested model (drawn behind its nodes)."""

    id: str
    x0: float
    y0: float
    x1: float
    y1: float


@dataclass
class GraphLayout:
    boxes: dict[str, NodeBox]
    edges: list[EdgePath]
    frames: list[GroupFrame] = field(default_factory=list)
    collapsed: frozenset[str] = frozenset()
    engine: str = "grandalf"
    seconds: float = 0.0
    direction: str = "TB"  # "TB" top to bottom, "LR" left to right

    def box_of(self, node_id: str) -> NodeBox | None:
        """The box that shows ``node_id`` (its own, or its collapsed nested model's)."""
        if node_id in self.boxes:
            return self.boxes[node_id]
        for box in self.boxes.values():
            if node_id in box.members:
                return box
        return None

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        if not self.boxes:
            return (0.0, 0.0, 0.0, 0.0)
        xs0 = [b.x - b.w / 2 for b in self.boxes.values()]
        ys0 = [b.y - b.h / 2 for b in self.boxes.values()]
        xs1 = [b.x + b.w / 2 for b in self.boxes.values()]
        ys1 = [b.y + b.h / 2 for b in self.boxes.values()]
        return (min(xs0), min(ys0), max(xs1), max(ys1))


def shape_text(node: NodeSpec) -> str:
    return "x".join("?" if d is None else str(d) for d in node.output_shape[1:]) or "scalar"


AUTO_GROUP_MIN_NODES = 60  # graphs smaller than this are drawn flat (only nested models are groups)


@dataclass(frozen=True)
class DisplayGroups:
    """How the graph view groups nodes: each node's group path ('outer/inner', None: top level) and every group
    path, parents first. Nested models are groups; on large graphs, so are the blocks Keras' layer names spell
    out ("conv2_block1_1_conv" is in "conv2/conv2_block1"). Drawing only: plans, selectors and the engine never
    see these groups."""

    of: dict[str, str | None]
    paths: tuple[str, ...]
    nested: frozenset[str]  # the paths that are nested models (the rest come from names)

    def top_level(self) -> list[str]:
        return [p for p in self.paths if "/" not in p]


def display_groups(graph: LayerGraph) -> DisplayGroups:
    of: dict[str, str | None] = {n.id: n.group for n in graph.nodes}
    nested = frozenset(graph.groups)
    free = [n for n in graph.nodes if n.group is None and not n.is_input]
    if len(graph) < AUTO_GROUP_MIN_NODES or not free:
        return DisplayGroups(of, tuple(graph.groups), nested)
    stems = {n.id: n.id.split(":")[0].split("_") for n in free}
    counts: dict[str, int] = {}
    for tokens in stems.values():
        for depth in (1, 2):
            if len(tokens) > depth:
                prefix = "_".join(tokens[:depth])
                counts[prefix] = counts.get(prefix, 0) + 1
    limit = len(free) // 2  # a "group" of most of the model (MobileNet's "block") groups nothing

    def qualifies(prefix: str) -> bool:
        return 3 <= counts.get(prefix, 0) <= limit and prefix not in of  # never a node's own id

    paths: dict[str, None] = dict.fromkeys(graph.groups)
    for n in free:
        tokens = stems[n.id]
        parts = [
            "_".join(tokens[:depth]) for depth in (1, 2) if len(tokens) > depth and qualifies("_".join(tokens[:depth]))
        ]
        if parts:
            path = "/".join(parts)
            of[n.id] = path
            for prefix in _outer_first(path):
                paths.setdefault(prefix)
    return DisplayGroups(of, tuple(paths), nested)


def groups_holding(graph: LayerGraph, node_id: str) -> list[str]:
    """The display groups a node sits in, outermost first (what must be expanded to show it)."""
    path = display_groups(graph).of.get(node_id)
    return _outer_first(path) if path else []


def default_collapsed(graph: LayerGraph) -> set[str]:
    """What a large graph opens with: every group collapsed, so expanding a stage shows its blocks, and
    expanding a block its layers (a small graph opens flat)."""
    if len(graph) < AUTO_GROUP_MIN_NODES:
        return set()
    return set(display_groups(graph).paths)


def _outer_first(path: str) -> list[str]:
    """A group path and the groups around it, outermost first: "a/b/c" -> ["a", "a/b", "a/b/c"]."""
    parts = path.split("/")
    return ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]


def _collapsed_root(group: str | None, collapsed: frozenset[str] | set[str]) -> str | None:
    """The outermost collapsed group containing ``group`` (groups nest as 'outer/inner')."""
    if group is None:
        return None
    for prefix in _outer_first(group):
        if prefix in collapsed:
            return prefix
    return None


def visible_graph(
    graph: LayerGraph, collapsed: Iterable[str] = (), groups: DisplayGroups | None = None
) -> tuple[list[tuple[str, str, str, str | None, str | None, tuple[str, ...]]], list[tuple[str, str]]]:
    """Boxes ``(id, title, subtitle, group, collapsed_group, members)`` and deduplicated edges after collapsing."""
    groups = groups or display_groups(graph)
    collapsed = frozenset(collapsed) & frozenset(groups.paths)
    rep: dict[str, str] = {}
    boxes: dict[str, tuple] = {}
    members: dict[str, list[str]] = {}
    for n in graph.nodes:
        group = groups.of[n.id]
        root = _collapsed_root(group, collapsed)
        if root is None:
            rep[n.id] = n.id
            # the title is the node's id (inside its group's frame, the part after the group's "/"), the name JSON,
            # the CLI and diagnostics use; a fused layer is "conv1:pre" (linear) and "conv1" (activation: the output)
            title = n.id[len(n.group) + 1 :] if n.group and n.id.startswith(n.group + "/") else n.id
            boxes[n.id] = (n.id, title, f"{n.kind}  {shape_text(n)}", group, None)
        else:
            box_id = GROUP_PREFIX + root
            rep[n.id] = box_id
            members.setdefault(box_id, []).append(n.id)
            if box_id not in boxes:
                outer = root.rpartition("/")[0] or None
                boxes[box_id] = (box_id, root.split("/")[-1], "", outer, root)
    out_boxes = []
    for box_id, (bid, title, sub, group, cgroup) in boxes.items():
        mem = tuple(members.get(box_id, ()))
        if cgroup is not None:
            sub = f"{'nested model' if cgroup in groups.nested else 'block'}  {len(mem)} nodes"
        out_boxes.append((bid, title, sub, group, cgroup, mem))
    edges: dict[tuple[str, str], None] = {}
    for src, dst in graph.edges():
        a, b = rep[src], rep[dst]
        if a != b:
            edges[(a, b)] = None
    return out_boxes, list(edges)


def compute_layout(
    graph: LayerGraph,
    collapsed: Iterable[str] = (),
    *,
    use_grandalf: bool = True,
    should_stop: Callable[[], bool] | None = None,
    direction: str = "TB",
) -> GraphLayout:
    """Lay the (visible) graph out top to bottom (``direction`` "TB": inputs at the top) or left to right
    ("LR": inputs on the left; laid out top to bottom with the box sides swapped, then transposed)."""
    if direction not in ("TB", "LR"):
        raise ValueError(f"direction must be 'TB' or 'LR', not {direction!r}")
    t0 = time.perf_counter()
    lr = direction == "LR"
    groups = display_groups(graph)
    collapsed = frozenset(collapsed) & frozenset(groups.paths)
    boxes, edges = visible_graph(graph, collapsed, groups)
    size = (NODE_H, NODE_W) if lr else (NODE_W, NODE_H)  # (across a layer, along the flow) before transposing
    positions: dict[str, tuple[float, float]] = {}
    routes: dict[tuple[str, str], list[tuple[float, float]]] = {}
    engine = "grandalf"
    if use_grandalf:
        try:
            positions, routes = _grandalf_positions([b[0] for b in boxes], edges, should_stop, size)
        except Exception:  # a layout quirk must not stop the model from opening
            positions, routes = {}, {}
    if not positions:
        engine = "layered"
        positions = _layered_positions([b[0] for b in boxes], edges, size)
    flip = (lambda p: (p[1], p[0])) if lr else (lambda p: p)
    out = {}
    for bid, title, sub, group, cgroup, mem in boxes:
        x, y = flip(positions[bid])
        out[bid] = NodeBox(bid, x, y, NODE_W, NODE_H, title, sub, group, cgroup, mem)
    paths = []
    for a, b in edges:
        pts = [flip(p) for p in routes.get((a, b)) or [positions[a], positions[b]]]
        # Start/end on the box borders, not the centres, so arrows stay visible.
        if lr:
            pts = [(out[a].x + NODE_W / 2, pts[0][1]), *pts[1:-1], (out[b].x - NODE_W / 2, pts[-1][1])]
        else:
            pts = [(pts[0][0], out[a].y + NODE_H / 2), *pts[1:-1], (pts[-1][0], out[b].y - NODE_H / 2)]
        paths.append(EdgePath(a, b, tuple(pts)))
    frames = _group_frames(groups, out, collapsed)
    return GraphLayout(out, paths, frames, collapsed, engine, time.perf_counter() - t0, direction)


class _View:
    def __init__(self, w: float, h: float) -> None:
        self.w, self.h = w, h
        self.xy = (0.0, 0.0)


class _EdgeView:
    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []

    def setpath(self, pts: list) -> None:
        self.points = [(float(x), float(y)) for x, y in pts]


def _grandalf_positions(
    ids: list[str],
    edges: list[tuple[str, str]],
    should_stop: Callable[[], bool] | None,
    size: tuple[float, float] = (NODE_W, NODE_H),
) -> tuple[dict[str, tuple[float, float]], dict[tuple[str, str], list[tuple[float, float]]]]:
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout

    # grandalf keeps vertices and edges in sets, which iterate in the order of their hashes: the objects'
    # addresses, so one model was laid out two ways from run to run (GPT-2's inputs left or right of its
    # blocks). Hashed by their creation order instead, the same graph always gets the same layout.
    class OrderedVertex(Vertex):
        def __hash__(self) -> int:
            return self.order

    class OrderedEdge(Edge):
        def __hash__(self) -> int:
            return self.order

    vs = {i: OrderedVertex(i) for i in ids}
    for k, v in enumerate(vs.values()):
        v.view, v.order = _View(*size), k
    es = []
    for k, (a, b) in enumerate(edges):
        e = OrderedEdge(vs[a], vs[b])
        e.view, e.order = _EdgeView(), k
        es.append(e)
    g = Graph(list(vs.values()), es)
    positions: dict[str, tuple[float, float]] = {}
    routes: dict[tuple[str, str], list[tuple[float, float]]] = {}
    x_offset = 0.0
    for comp in g.C:  # connected components side by side
        if should_stop is not None and should_stop():
            raise InterruptedError
        sug = SugiyamaLayout(comp)
        sug.xspace, sug.yspace = _X_SPACE, _Y_SPACE
        roots = [v for v in comp.sV if len(v.e_in()) == 0]
        sug.init_all(roots=roots, inverted_edges=[])
        # Fewer ordering sweeps on big graphs: the layout stays readable and opening stays fast.
        sug.draw(N=1.5 if len(comp.sV) > 300 else 3.5)
        xs = [v.view.xy[0] for v in comp.sV]
        shift = x_offset - min(xs)
        for v in comp.sV:
            positions[v.data] = (v.view.xy[0] + shift, v.view.xy[1])
        for e in comp.sE:
            routes[(e.v[0].data, e.v[1].data)] = [(x + shift, y) for x, y in e.view.points]
        x_offset = max(xs) + shift + size[0] + 3 * _X_SPACE
    return positions, routes


def _layered_positions(
    ids: list[str], edges: list[tuple[str, str]], size: tuple[float, float] = (NODE_W, NODE_H)
) -> dict[str, tuple[float, float]]:
    """Longest-path layers, nodes in each layer in graph order (the fallback layout)."""
    parents: dict[str, list[str]] = {i: [] for i in ids}
    for a, b in edges:
        parents[b].append(a)
    rank: dict[str, int] = {}
    for i in ids:  # ids are in topological order
        rank[i] = 1 + max((rank[p] for p in parents[i] if p in rank), default=-1)
    per_rank: dict[int, list[str]] = {}
    for i in ids:
        per_rank.setdefault(rank[i], []).append(i)
    pos = {}
    for r, row in per_rank.items():
        width = len(row) * (size[0] + _X_SPACE)
        for k, i in enumerate(row):
            pos[i] = (k * (size[0] + _X_SPACE) - width / 2, r * (size[1] + _Y_SPACE))
    return pos


def _group_frames(groups: DisplayGroups, boxes: dict[str, NodeBox], collapsed: frozenset[str]) -> list[GroupFrame]:
    frames = []
    max_depth = max((g.count("/") for g in groups.paths), default=0)
    inside_of: dict[str, list[NodeBox]] = {}  # group path -> the boxes drawn inside it (at any depth)
    for b in boxes.values():
        if b.group is not None:
            for prefix in _outer_first(b.group):
                inside_of.setdefault(prefix, []).append(b)
    for gid in groups.paths:
        if _collapsed_root(gid, collapsed) is not None:
            continue
        inside = inside_of.get(gid)
        if not inside:
            continue
        # Outer frames get more padding than the ones nested in them; the title row stays inside the gap
        # between layers (_Y_SPACE) so a frame never covers the box above it.
        p = 4.0 + 4.0 * (max_depth - gid.count("/"))
        title = 13.0
        frames.append(
            GroupFrame(
                gid,
                min(b.x - b.w / 2 for b in inside) - p,
                min(b.y - b.h / 2 for b in inside) - min(p + title, _Y_SPACE - 4),
                max(b.x + b.w / 2 for b in inside) + p,
                max(b.y + b.h / 2 for b in inside) + min(p, _Y_SPACE / 2 - 2),
            )
        )
    return frames
