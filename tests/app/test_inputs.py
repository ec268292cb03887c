"""The ``Inputs`` model alone (no Session, no Qt, no TensorFlow): image, scaling, the batch and its version."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gradscope.app.inputs import Inputs
from gradscope.app.view import ViewError
from gradscope.core.errors import ImageLoadError
from gradscope.core.graph import LayerGraph, NodeSpec


def graph(*shapes) -> LayerGraph:
    nodes = tuple(
        NodeSpec(id=f"in{k}", name=f"in{k}", op_type="InputLayer", inputs=(), input_shapes=(), output_shapes=(s,),
                 dtype="float32", is_input=True)
        for k, s in enumerate(shapes)
    )
    return LayerGraph(nodes, tuple(n.id for n in nodes), (nodes[-1].id,))


def test_an_image_is_scaled_into_a_batch_of_the_input_shape(tmp_path):
    path = tmp_path / "in.png"
    Image.fromarray(np.full((20, 30, 3), 51, np.uint8)).save(path)
    fed, events = Inputs(), []
    fed.image_changed.connect(events.append)
    fed.open(path)
    assert fed.image_path == str(path) and fed.image.shape == (20, 30, 3) and len(events) == 1
    fed.prepare(graph((None, 8, 8, 3)))
    assert fed.batch.shape == (1, 8, 8, 3) and fed.note == "" and fed.version == 1
    np.testing.assert_allclose(fed.batch, 0.2, rtol=1e-6)  # "unit": pixels / 255
    assert fed.set_preprocessing("minus_one_one") and not fed.set_preprocessing("minus_one_one")
    fed.prepare(graph((None, 8, 8, 3)))
    np.testing.assert_allclose(fed.batch, 51 / 127.5 - 1, rtol=1e-6)
    assert fed.version == 2
    with pytest.raises(ViewError, match="Unknown preprocessing 'nope'"):
        fed.set_preprocessing("nope")


def test_a_model_that_takes_no_image_gets_a_seeded_random_batch_and_says_so():
    fed = Inputs()
    fed.set_image(np.zeros((4, 4, 3), np.uint8))
    fed.prepare(graph((None, 5), (None, 2, 3)))
    assert [a.shape for a in fed.batch] == [(1, 5), (1, 2, 3)] and "random input (seed 0)" in fed.note
    again = Inputs()
    again.prepare(graph((None, 5), (None, 2, 3)))
    np.testing.assert_array_equal(again.batch[0], fed.batch[0])  # seeded: the same every time


def test_files_that_are_not_images_are_refused_with_the_reason(tmp_path):
    bad = tmp_path / "x.png"
    bad.write_text("not an image")
    fed = Inputs()
    with pytest.raises(ImageLoadError, match="x.png"):
        fed.open(bad)
    assert fed.image is None and fed.image_path is None
