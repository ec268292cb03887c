"""The ``Inputs`` model alone (no Session, no Qt, no TensorFlow): image, scaling, tokens, files, the batch and
its version."""

from __future__ import annotations

import numpy as np
from PIL import Image

from gradscope.app.models.feedback import Feedback
from gradscope.app.models.inputs import Inputs
from gradscope.core.graph import LayerGraph, NodeSpec
from tests.io.test_sequences import table_graph, text_graph


def told() -> tuple[Inputs, list, list]:
    """Inputs with what it says and emits recorded: (inputs, errors, changes)."""
    feedback, errors, changes = Feedback(), [], []
    feedback.error_raised.connect(lambda *a: errors.append(a))
    fed = Inputs(feedback)
    fed.changed.connect(lambda: changes.append(True))
    return fed, errors, changes


def graph(*shapes) -> LayerGraph:
    nodes = tuple(
        NodeSpec(
            id=f"in{k}",
            name=f"in{k}",
            op_type="InputLayer",
            inputs=(),
            input_shapes=(),
            output_shapes=(s,),
            dtype="float32",
            is_input=True,
        )
        for k, s in enumerate(shapes)
    )
    return LayerGraph(nodes, tuple(n.id for n in nodes), (nodes[-1].id,))


def test_an_image_is_scaled_into_a_batch_of_the_input_shape(tmp_path):
    path = tmp_path / "in.png"
    Image.fromarray(np.full((20, 30, 3), 51, np.uint8)).save(path)
    (fed, errors, changes), events = told(), []
    fed.image_changed.connect(events.append)
    assert fed.open(path)
    assert fed.image_path == str(path) and fed.image.shape == (20, 30, 3) and len(events) == 1 and changes
    fed.prepare(graph((None, 8, 8, 3)))
    assert fed.batch.shape == (1, 8, 8, 3) and fed.note == "" and fed.version == 1
    np.testing.assert_allclose(fed.batch, 0.2, rtol=1e-6)  # "unit": pixels / 255
    assert fed.set_preprocessing("minus_one_one") and not fed.set_preprocessing("minus_one_one")
    fed.prepare(graph((None, 8, 8, 3)))
    np.testing.assert_allclose(fed.batch, 51 / 127.5 - 1, rtol=1e-6)
    assert fed.version == 2
    assert not fed.set_preprocessing("nope") and errors[-1][0] == "Unknown preprocessing"


def test_a_model_that_takes_no_image_gets_a_seeded_random_batch_and_says_so():
    fed = told()[0]
    fed.set_image(np.zeros((4, 4, 3), np.uint8))
    fed.prepare(graph((None, 5), (None, 2, 3)))
    assert [a.shape for a in fed.batch] == [(1, 5), (1, 2, 3)] and "random input (seed 0)" in fed.note
    again = told()[0]
    again.prepare(graph((None, 5), (None, 2, 3)))
    np.testing.assert_array_equal(again.batch[0], fed.batch[0])  # seeded: the same every time


def test_files_that_are_not_images_are_refused_with_the_reason(tmp_path):
    bad = tmp_path / "x.png"
    bad.write_text("not an image")
    fed, errors, changes = told()
    assert not fed.open(bad)
    assert errors[0][0] == "Cannot open the image" and "x.png" in errors[0][1]
    assert fed.image is None and fed.image_path is None and not changes
    assert not fed.open(tmp_path / "missing.npy") and errors[-1][1].startswith("Input file not found")


def test_typed_tokens_files_and_a_vocabulary_become_the_batch(tmp_path):
    fed, errors, changes = told()
    g = text_graph(6, 10)
    fed.prepare(g)  # nothing chosen: random ids the embedding has, shown as tokens
    assert fed.fed.kind == "tokens" and fed.batch.shape == (1, 6) and fed.batch.max() < 10
    assert "Random token ids" in fed.note and len(fed.labels) == 6
    assert fed.set_typed("1 2 3 4 5 6")
    fed.prepare(g)
    assert fed.batch.tolist() == [[1, 2, 3, 4, 5, 6]] and fed.labels == ("1", "2", "3", "4", "5", "6")
    (tmp_path / "v.txt").write_text("\n[UNK]\nthe\nmovie\n")
    assert fed.set_vocabulary(tmp_path / "v.txt") and len(changes) == 2
    assert fed.set_typed("the movie")
    fed.prepare(g)
    assert fed.batch.tolist() == [[2, 3, 0, 0, 0, 0]] and fed.labels[:2] == ("the", "movie") and "Padded" in fed.note
    assert not fed.set_typed("1 2 99")  # an id outside the embedding's vocabulary: refused, the last input stays
    assert errors[-1][0] == "Input refused" and errors[-1][1].startswith("Token 2 of input 'tokens' is id 99")
    fed.prepare(g)
    assert fed.batch.tolist() == [[2, 3, 0, 0, 0, 0]] and fed.typed == "the movie"
    fresh, _, _ = told()
    fresh.set_typed(
        "1 2 99 4 5 6"
    )  # typed before any model: checked when a model's batch is made, and why it is not used
    fresh.prepare(g)
    assert fresh.problem.startswith("Token 2 of input 'tokens' is id 99") and "random" in fresh.note.lower()
    (tmp_path / "row.csv").write_text("a,b,c\n1,2,3\n")
    assert fed.open(tmp_path / "row.csv") and fed.source.endswith("row.csv")
    fed.prepare(table_graph(3))
    assert fed.batch.tolist() == [[1.0, 2.0, 3.0]] and fed.labels == ("a", "b", "c") and fed.problem == ""
    assert not fed.set_typed("   ") and errors[-1][0] == "No input"
    assert not fed.set_vocabulary(tmp_path / "none.txt") and errors[-1][0] == "Cannot read the vocabulary"
