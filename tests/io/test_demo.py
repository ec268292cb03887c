"""The bundled demo model and images: present, loadable in safe mode, and the model does its job."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.io.demo import demo_boxes, demo_image_paths, demo_meta, demo_model_path
from gradscope.io.images import load_image, prepare_input
from gradscope.io.models import load_model
from gradscope.io.synthetic import SHAPE_CLASSES, make_shapes_dataset


@pytest.fixture(scope="module")
def model():
    return load_model(demo_model_path())  # safe mode: the demo must not need --unsafe


def test_demo_files_exist_and_are_small():
    path = demo_model_path()
    assert path.name == "shapes_cnn.keras" and path.stat().st_size < 2 * 1024 * 1024
    meta = demo_meta()
    assert tuple(meta["class_names"]) == SHAPE_CLASSES
    assert meta["input_size"] == [64, 64, 3] and meta["preprocessing"] == "unit"
    assert meta["val_accuracy"] > 0.9


def test_demo_model_exercises_the_engine(model):
    types = {layer.name: type(layer).__name__ for layer in model.layers}
    assert types["conv1"] == "Conv2D" and model.get_layer("conv1").activation.__name__ == "relu"
    assert types["relu2"] == "ReLU" and types["bn2"] == "BatchNormalization"
    assert types["res_add"] == "Add" and types["gap"] == "GlobalAveragePooling2D"
    assert types["logits"] == "Dense" and model.get_layer("logits").activation.__name__ == "linear"
    assert types["probs"] == "Activation" and model.layers[-1].name == "probs"
    assert "MaxPooling2D" in types.values()
    assert tuple(model.input_shape) == (None, 64, 64, 3) and tuple(model.output_shape) == (None, 4)


def test_demo_model_accuracy_on_fresh_data(model):
    images, labels, _, _ = make_shapes_dataset(200, seed=20240601)
    probs = np.asarray(model.predict(images, batch_size=100, verbose=0))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    accuracy = float(np.mean(probs.argmax(axis=1) == labels))
    assert accuracy > 0.8, accuracy


def test_demo_images_load_and_match_boxes(model):
    paths = demo_image_paths()
    assert 4 <= len(paths) <= 6
    boxes = demo_boxes()
    assert sorted(boxes) == [p.name for p in paths]
    assert {b["class"] for b in boxes.values()} == set(SHAPE_CLASSES)
    for path in paths:
        entry = boxes[path.name]
        assert path.name.startswith(entry["class"] + "_") and SHAPE_CLASSES[entry["label"]] == entry["class"]
        image = load_image(path)
        assert image.shape == (64, 64, 3) and image.dtype == np.uint8
        # The entry regenerates the image and its mask; the box is the mask's bounding box.
        regenerated, labels, generated_boxes, masks = make_shapes_dataset(entry["index"] + 1, entry["seed"])
        assert np.abs(regenerated[-1] * 255 - image).max() <= 1.0
        assert labels[-1] == entry["label"] and list(generated_boxes[-1]) == entry["box"]
        x = prepare_input(image, model.input_shape, "unit")
        assert int(np.argmax(model(x).numpy())) == entry["label"]
