"""Synthetic graphs shaped and named like real Keras models (layout tests and benchmarks)."""

from __future__ import annotations


def model_shaped_graph(n: int):
    """A ResNet-shaped DAG of ``n`` nodes named as Keras names them (conv{stage}_block{block}_{k}_{kind}), each
    block ending in an Add of its input and its last layer."""
    from gradscope.core.graph import LayerGraph, NodeSpec

    def spec(node_id, inputs, op="Conv2D", is_input=False):
        return NodeSpec(
            id=node_id,
            name=node_id,
            op_type=op,
            inputs=inputs,
            input_shapes=(),
            output_shapes=((1,),),
            dtype="float32",
            is_input=is_input,
        )

    nodes = [spec("input_1", (), "InputLayer", True)]
    last, stage, block = "input_1", 2, 1
    while len(nodes) < n:
        block_in = last
        for k in range(1, 4):
            for kind in ("conv", "bn", "relu"):
                if len(nodes) >= n - 1:
                    break
                node_id = f"conv{stage}_block{block}_{k}_{kind}"
                nodes.append(spec(node_id, (last,)))
                last = node_id
        add = f"conv{stage}_block{block}_add"
        nodes.append(spec(add, (last, block_in) if block_in != last else (last,), "Add"))
        last, block = add, block + 1
        if block > 6:
            stage, block = stage + 1, 1
    return LayerGraph(tuple(nodes[:n]), ("input_1",), (nodes[n - 1].id,))
