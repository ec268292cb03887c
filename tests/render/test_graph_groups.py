"""Large graphs open as their blocks: groups read from Keras' layer names (two levels), collapsed by default,
expanded one level at a time; small graphs stay flat; nested models stay groups of their own."""

from __future__ import annotations

from gradscope.core.graph import LayerGraph
from gradscope.render.graph_layout import (
    AUTO_GROUP_MIN_NODES,
    GROUP_PREFIX,
    compute_layout,
    default_collapsed,
    display_groups,
)
from tests.render.graphs import model_shaped_graph


def test_blocks_are_read_from_layer_names_in_two_levels():
    graph = model_shaped_graph(300)
    groups = display_groups(graph)
    assert groups.of["conv2_block1_1_conv"] == "conv2/conv2_block1"
    assert groups.of["conv2_block1_add"] == "conv2/conv2_block1"
    assert groups.of["input_1"] is None
    assert "conv2" in groups.top_level() and "conv2/conv2_block1" in groups.paths
    free = [n for n in graph.nodes if not n.is_input]
    for path in groups.paths:  # a group never holds most of the model
        members = [n for n in free if (groups.of[n.id] or "").split("/")[0] == path.split("/")[0]]
        assert 3 <= len(members) <= len(free) // 2


def test_a_large_graph_opens_collapsed_and_every_node_is_shown_exactly_once():
    graph = model_shaped_graph(1000)
    collapsed = default_collapsed(graph)
    layout = compute_layout(graph, collapsed)
    assert len(layout.boxes) < 40
    shown: list[str] = []
    for box in layout.boxes.values():
        shown += list(box.members) if box.collapsed_group else [box.id]
    assert sorted(shown) == sorted(n.id for n in graph.nodes)
    # expanding a stage shows its blocks, still collapsed
    expanded = compute_layout(graph, collapsed - {"conv2"})
    assert GROUP_PREFIX + "conv2/conv2_block1" in expanded.boxes
    assert "conv2_block1_1_conv" not in expanded.boxes
    assert any(frame.id == "conv2" for frame in expanded.frames)
    assert expanded.boxes[GROUP_PREFIX + "conv2/conv2_block1"].subtitle == "block  10 nodes"


def test_small_graphs_stay_flat():
    graph = model_shaped_graph(AUTO_GROUP_MIN_NODES - 1)
    assert display_groups(graph).paths == () and default_collapsed(graph) == set()
    assert len(compute_layout(graph).boxes) == len(graph)


def test_nested_models_stay_their_own_groups():
    from gradscope.engine.backward.keras_graph import build_exec_graph
    from tests.engine.fixtures import nested

    graph: LayerGraph = build_exec_graph(nested()).graph
    groups = display_groups(graph)
    assert set(groups.nested) == set(graph.groups) and set(graph.groups) <= set(groups.paths)
    layout = compute_layout(graph, set(graph.groups))
    box = next(b for b in layout.boxes.values() if b.collapsed_group)
    assert box.subtitle.startswith("nested model")


def test_left_to_right_layout_runs_along_x_without_overlaps():
    graph = model_shaped_graph(40)  # flat
    layout = compute_layout(graph, direction="LR")
    assert layout.direction == "LR"
    first, last = layout.boxes["input_1"], layout.boxes[graph.nodes[-1].id]
    assert last.x > first.x + 10 * first.w  # the flow runs left to right
    boxes = list(layout.boxes.values())
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert abs(a.x - b.x) >= a.w or abs(a.y - b.y) >= a.h, (a.id, b.id)
    for edge in layout.edges:  # edges leave a box on its right side and enter the next on its left side
        assert edge.points[0][0] == layout.boxes[edge.src].x + first.w / 2
        assert edge.points[-1][0] == layout.boxes[edge.dst].x - first.w / 2


def test_the_same_graph_is_laid_out_the_same_in_every_process(tmp_path):
    """grandalf iterates sets of its vertices and edges, hashed by address: GPT-2's inputs opened left of its
    blocks in one run and right of them in the next."""
    import pickle
    import subprocess
    import sys

    import gradscope as gs

    graph = gs.open_engine("demo:tiny_gpt2").graph
    (tmp_path / "graph.pkl").write_bytes(pickle.dumps(graph))
    code = (
        "import pickle, sys\n"
        "from gradscope.render.graph_layout import compute_layout, default_collapsed\n"
        "graph = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "from grandalf.graphs import Edge, Vertex\n"
        "taken = [Vertex(i) for i in range(int(sys.argv[2]))]  # other objects at other addresses\n"
        "taken += [Edge(taken[0], taken[0]) for _ in range(int(sys.argv[2]) // 2)] if taken else []\n"
        "layout = compute_layout(graph, default_collapsed(graph))\n"
        "print(sorted((k, round(b.x), round(b.y)) for k, b in layout.boxes.items()))\n"
    )
    command = [sys.executable, "-c", code, str(tmp_path / "graph.pkl")]
    runs = {
        subprocess.run([*command, str(n)], capture_output=True, text=True, timeout=120, check=True).stdout
        for n in (0, 1, 7, 100, 1001, 5003)
    }
    assert len(runs) == 1 and "token_ids" in next(iter(runs))
