"""Each display is drawn by the window's and the exports' code: an image explanation's HTML holds the PNG that
``save(colorbar=True)`` writes (under its caption), a token strip and a generation matrix are coloured as
``render.positions`` colours them, right-to-left and CJK words stay whole; the graph, heat map and loss chart mark
NaN/Inf in red."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest
from PIL import Image

import gradscope.api as gs
from gradscope.io.demo import demo_image_paths, demo_model_path
from gradscope.render.positions import position_colours

keras = pytest.importorskip("keras")


def _pictures(html: str) -> list[np.ndarray]:
    found = re.findall(r'src="data:image/(?:png|jpeg);base64,([^"]+)"', html)
    return [np.asarray(Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB")) for b in found]


def _backgrounds(html: str) -> list[tuple[int, int, int]]:
    return [
        tuple(int(h[i : i + 2], 16) for i in (0, 2, 4)) for h in re.findall(r"style=\"background:#([0-9a-f]{6})", html)
    ]


def test_an_image_explanation_shows_what_save_writes_under_its_caption(tmp_path):
    e = gs.explain(demo_model_path(), demo_image_paths()[1], method="gradient")
    html = e._repr_html_()
    (shown,) = _pictures(html)
    saved = np.asarray(Image.open(e.save(tmp_path / "map.png", colorbar=True)).convert("RGB"))
    assert shown.shape == saved.shape and "data:image/jpeg;base64," in html and len(html) < 80_000
    assert np.abs(shown.astype(int) - saved).mean() < 3  # the picture itself (as JPEG), the caption once, as HTML
    probability = float(e.result.predictions[0][e.predicted_class])
    caption = f"shapes_cnn · gradient · class {e.predicted_class} (p = {probability:.3g})"
    assert html.count(caption) == 2  # the figure's caption and the image's alt text


@pytest.fixture(scope="module")
def text_model():
    keras.utils.set_random_seed(5)
    tokens = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(12, 4)(tokens)
    h = keras.layers.GlobalAveragePooling1D()(h)
    return keras.Model(tokens, keras.layers.Dense(2, activation="softmax")(h), name="words")


def test_a_token_strip_is_coloured_as_the_window_colours_it(text_model, tmp_path):
    words = ["", "[UNK]", "مرحبا", "بالعالم", "猫が", "座った", "the", "cat", "<b>", "&", "x", "y"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(words), encoding="utf-8")
    e = gs.explain(text_model, np.array([2, 3, 4, 5, 8, 9]), vocab=str(vocab))
    html = e._repr_html_()
    view = e.view()
    expected = [tuple(int(c) for c in rgb) for rgb in position_colours(e.saliency, view.colormap, view.normalization)]
    assert _backgrounds(html) == expected
    shown = re.findall(r"<bdi>(.*?)</bdi>", html)
    assert shown == ["مرحبا", "بالعالم", "猫が", "座った", "&lt;b&gt;", "&amp;"]  # whole words, escaped
    assert 'dir="auto"' in html
    titles = re.findall(r'class="tok" title="([^"]+)"', html)
    assert titles[0].startswith("0: &#x27;مرحبا&#x27;, id 2, score ")
    assert f"score {float(e.saliency[3]):.4g}" in titles[3]


def test_a_generation_matrix_is_coloured_row_by_row_as_its_png():
    g = gs.explain_generation("tests/data/hf/gpt2", "the cat", steps=3)
    html = g._repr_html_()
    rows = re.findall(r"<tr><th><bdi>.*?</tr>", html)
    assert len(rows) == 3
    matrix = g.matrix
    for i, row in enumerate(rows):
        seen = np.isfinite(matrix[i])
        expected = position_colours(np.where(seen, matrix[i], 0.0), "bwr", "signed")
        colours = _backgrounds(row)
        assert len(colours) == matrix.shape[1]
        for j, colour in enumerate(colours):
            assert colour == ((236, 239, 241) if not seen[j] else tuple(int(c) for c in expected[j]))
        assert f"p = {g.generation.probabilities[i]:.2f}" in row


def test_the_graph_fills_broken_nodes_red_and_orders_the_rest_by_gradient():
    from gradscope.render.graph_layout import compute_layout
    from gradscope.render.graph_svg import BROKEN, NO_GRADIENT, NodeFlow, graph_svg, node_fills

    flow = {"a": NodeFlow(1e-6), "b": NodeFlow(1e-2), "c": NodeFlow(float("nan")), "d": NodeFlow(None)}
    fills, (lo, hi) = node_fills(flow)
    assert (fills["c"], fills["d"]) == (BROKEN, NO_GRADIENT)
    assert (lo, hi) == (-6.0, -2.0)
    e = gs.open_engine(demo_model_path())
    layout = compute_layout(e.graph)
    ids = list(layout.boxes)
    svg = graph_svg(layout, {ids[1]: NodeFlow(float("inf")), ids[2]: NodeFlow(0.5, ("exploding",))})
    assert svg.count(f'fill="{BROKEN}"') >= 2 and svg.count("<rect") >= len(ids)
    picture = gs.graph(e, np.zeros((1, 64, 64, 3), np.float32) + 0.5)
    row = picture.flow.row(ids[1])
    assert f"mean |g| = {row.grad_mean_abs:.4g}" in picture.svg()


def test_the_heat_map_and_loss_chart_mark_nan_in_red():
    from gradscope.render.charts import RED, heatmap_picture, series_picture

    matrix = np.array([[1e-3, 1e-2, np.nan], [1e-4, 0.0, 1e-1]])
    picture = heatmap_picture(matrix, ["a", "b"], [0, 10, 20], title="t")
    reds = np.all(picture == RED, axis=-1)
    assert reds.any() and not reds[:, : picture.shape[1] // 8].any()  # the NaN cell, right of the names
    chart = series_picture([0, 1, 2, 3], [1.0, 2.0, np.nan, np.nan], title="loss", stop=2, stop_text="NaN")
    columns = np.all(chart == RED, axis=-1).sum(axis=0)
    assert columns.max() > chart.shape[0] // 2  # a red vertical line


def test_the_graph_of_a_language_model_follows_its_next_token():
    picture = gs.graph("tests/data/hf/gpt2", "the cat sat")
    assert "next token" in picture.flow.target
    html = picture._repr_html_()
    assert html.count("<svg") == 1 and "next token" in html


def test_a_table_row_shows_its_feature_bars_under_the_caption(tmp_path):
    keras.utils.set_random_seed(2)
    features = keras.Input((3,))
    model = keras.Model(features, keras.layers.Dense(2, activation="softmax")(features), name="table")
    rows = tmp_path / "rows.csv"
    rows.write_text("age,height,weight\n30,1.8,70\n")
    e = gs.explain(model, str(rows), method="gradient_x_input")
    (shown,) = _pictures(e._repr_html_())
    saved = np.asarray(Image.open(e.save(tmp_path / "row.png", colorbar=True)).convert("RGB"))
    np.testing.assert_array_equal(shown[-saved.shape[0] :], saved)
    assert e.labels == ("age", "height", "weight")


def test_an_engine_its_graph_a_plan_and_a_backward_pass_show_themselves():
    e = gs.open_engine(demo_model_path())
    graph_html = e._repr_html_()
    assert graph_html == e.graph._repr_html_() and graph_html.count("<rect") >= len(e.graph.nodes)
    plan = gs.Plan(name="mine").with_entry("activation:relu", "backward_as", {"activation": "sigmoid"})
    html = plan._repr_html_()
    assert "mine" in html and "activation:relu" in html and "backward_as" in html and "sigmoid" in html
    assert "true gradient everywhere" in gs.Plan()._repr_html_()
    x = np.full((1, 64, 64, 3), 0.5, np.float32)
    result = e.backward(x, gs.Target(index=1), plan)
    html = result._repr_html_()
    for row in result.flow_table():
        assert f"<td>{row['node']}</td>" in html
    assert "target index 1" in html and f"{sum(1 for r in result.rules)} node(s) under a rule" in html


def test_long_node_names_keep_both_ends_and_their_shape_in_the_graph_picture():
    """Cut at the end, ``feedforward_intermediate_dense:pre`` read as its neighbour and ``?x128`` as ``?x1``."""
    import dataclasses
    import re

    from gradscope.render.graph_layout import compute_layout
    from gradscope.render.graph_svg import elide_middle, graph_svg

    assert elide_middle("short", 26) == "short"
    cut = elide_middle("transformer_layer_0_feedforward_intermediate_dense:pre", 26)
    assert len(cut) == 26 and cut.startswith("transformer_") and cut.endswith("dense:pre") and "…" in cut
    layout = compute_layout(gs.open_engine(demo_model_path()).graph)
    first = next(iter(layout.boxes))
    long = dataclasses.replace(
        layout.boxes[first],
        title="transformer_layer_0_feedforward_intermediate_dense:pre",
        subtitle="EinsumDenseWithAVeryLongName  ?x128x3072",
    )
    svg = graph_svg(dataclasses.replace(layout, boxes={**layout.boxes, first: long}))
    texts = re.findall(r">([^<>]*)</text>", svg)
    assert cut in texts
    assert any(t.endswith("  ?x128x3072") and len(t) <= 30 and t.startswith("Einsum") for t in texts)
