"""Model loading: real files written by the tests, every failure a typed error with a helpful message."""

from __future__ import annotations

import textwrap
import uuid

import numpy as np
import pytest

from gradscope.core.errors import CustomObjectError, ModelLoadError, UnsafeModelError
from gradscope.io.models import load_custom_objects_file, load_model

keras = pytest.importorskip("keras")


def small_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inp)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    out = keras.layers.Dense(3, name="logits")(x)
    return keras.Model(inp, out, name="small")


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "small.keras"
    small_model().save(path)
    return path


def custom_layer_source(package: str) -> str:
    return textwrap.dedent(
        f"""
        import keras

        @keras.saving.register_keras_serializable(package={package!r})
        class TimesThree(keras.layers.Layer):
            def call(self, x):
                return x * 3.0

        @keras.saving.register_keras_serializable(package={package!r})
        def halve(x):
            return x * 0.5

        def _private_helper():
            return None
        """
    )


@pytest.fixture
def custom_file(tmp_path):
    """A user module registering a layer and a function under a fresh package; unregistered afterwards."""
    package = f"gs_test_{uuid.uuid4().hex[:8]}"
    path = tmp_path / "my_objects.py"
    path.write_text(custom_layer_source(package))
    yield path, package
    registry = keras.saving.get_custom_objects()
    for name in [n for n in registry if n.startswith(package + ">")]:
        del registry[name]


def unregister(package: str) -> None:
    registry = keras.saving.get_custom_objects()
    for name in [n for n in registry if n.startswith(package + ">")]:
        del registry[name]


# --- success
def test_keras_round_trip(keras_file):
    model = load_model(keras_file)
    reference = small_model()
    x = np.random.default_rng(0).random((2, 8, 8, 3), dtype=np.float32)
    np.testing.assert_allclose(model(x).numpy(), reference(x).numpy(), rtol=1e-5, atol=1e-6)
    assert [layer.name for layer in model.layers] == ["image", "conv", "gap", "logits"]


def test_h5_round_trip(tmp_path):
    path = tmp_path / "small.h5"
    reference = small_model()
    reference.save(path)
    model = load_model(str(path))
    x = np.random.default_rng(1).random((2, 8, 8, 3), dtype=np.float32)
    np.testing.assert_allclose(model(x).numpy(), reference(x).numpy(), rtol=1e-5, atol=1e-6)


# --- bad files
def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nowhere" / "model.keras"
    with pytest.raises(ModelLoadError, match="not found") as info:
        load_model(path)
    assert str(path) in str(info.value)


def test_text_file_named_keras(tmp_path):
    path = tmp_path / "x.keras"
    path.write_text("this is not a model\n")
    with pytest.raises(ModelLoadError, match="not a Keras model file: it is a text file"):
        load_model(path)


def test_png_named_keras(tmp_path):
    from PIL import Image

    path = tmp_path / "picture.keras"
    Image.new("RGB", (4, 4)).save(path, format="PNG")
    with pytest.raises(ModelLoadError, match="PNG image"):
        load_model(path)


def test_truncated_keras_archive(tmp_path, keras_file):
    data = keras_file.read_bytes()
    path = tmp_path / "half.keras"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="damaged or incomplete") as info:
        load_model(path)
    assert "Traceback" not in str(info.value)


def test_zip_without_config(tmp_path):
    import zipfile

    path = tmp_path / "other.keras"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.keras"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty"):
        load_model(path)


def test_folder_and_savedmodel(tmp_path):
    with pytest.raises(ModelLoadError, match="is a folder"):
        load_model(tmp_path)
    saved = tmp_path / "exported"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"\x08\x01")
    with pytest.raises(ModelLoadError, match="SavedModel") as info:
        load_model(saved)
    assert "model.keras" in str(info.value)


def test_unknown_extension_lists_supported(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07")
    with pytest.raises(ModelLoadError, match=r"\.keras.*\.h5") as info:
        load_model(path)
    assert "'.onnx'" in str(info.value)


def test_keras_archive_with_wrong_extension(tmp_path, keras_file):
    path = tmp_path / "model.zip"
    path.write_bytes(keras_file.read_bytes())
    with pytest.raises(ModelLoadError, match="rename it to end in .keras"):
        load_model(path)


def test_text_file_named_h5(tmp_path):
    path = tmp_path / "x.h5"
    path.write_text("hello")
    with pytest.raises(ModelLoadError, match="not a Keras .h5 model file"):
        load_model(path)


def test_weights_only_h5(tmp_path):
    path = tmp_path / "small.weights.h5"
    small_model().save_weights(path)
    with pytest.raises(ModelLoadError, match="only weights"):
        load_model(path)


# --- custom objects
@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_unregistered_custom_layer(tmp_path, custom_file, suffix):
    path, package = custom_file
    objects = load_custom_objects_file(path)
    assert {"TimesThree", "halve", f"{package}>TimesThree", f"{package}>halve"} <= set(objects)
    assert "_private_helper" not in objects and "keras" not in objects

    inp = keras.Input((4,))
    out = objects["TimesThree"](name="times_three")(keras.layers.Dense(2, name="dense")(inp))
    model_path = tmp_path / f"custom{suffix}"
    keras.Model(inp, out).save(model_path)

    unregister(package)  # a fresh session: the class is not known to Keras
    with pytest.raises(CustomObjectError) as info:
        load_model(model_path)
    message = str(info.value)
    assert info.value.object_name == f"{package}>TimesThree"
    assert "TimesThree" in message and "times_three" in message
    assert "--custom-objects" in message and "register_keras_serializable" in message
    assert info.value.__cause__ is not None

    model = load_model(model_path, custom_objects=load_custom_objects_file(path))
    assert model.get_layer("times_three").__class__.__name__ == "TimesThree"


def test_custom_object_by_plain_class_name(tmp_path, custom_file):
    path, package = custom_file
    objects = load_custom_objects_file(path)
    inp = keras.Input((4,))
    out = objects["TimesThree"]()(inp)
    model_path = tmp_path / "custom.keras"
    keras.Model(inp, out).save(model_path)
    unregister(package)
    # Keras alone would only find it under "package>TimesThree"; the plain class name is enough here.
    model = load_model(model_path, custom_objects={"TimesThree": objects["TimesThree"]})
    np.testing.assert_allclose(model(np.ones((1, 4), np.float32)).numpy(), 3.0)


def test_unregistered_custom_function(tmp_path, custom_file):
    path, package = custom_file
    objects = load_custom_objects_file(path)
    inp = keras.Input((4,))
    out = keras.layers.Dense(2, activation=objects["halve"], name="dense_halve")(inp)
    model_path = tmp_path / "fn.keras"
    keras.Model(inp, out).save(model_path)
    unregister(package)
    with pytest.raises(CustomObjectError, match="custom function") as info:
        load_model(model_path)
    assert info.value.object_name == f"{package}>halve"
    assert "dense_halve" in str(info.value)


def test_custom_objects_file_errors(tmp_path):
    with pytest.raises(CustomObjectError, match="not found"):
        load_custom_objects_file(tmp_path / "missing.py")
    bad = tmp_path / "broken.py"
    bad.write_text("def f(:\n    pass\n")
    with pytest.raises(CustomObjectError, match=r"broken\.py has a syntax error \(line 1\)"):
        load_custom_objects_file(bad)
    failing = tmp_path / "failing.py"
    failing.write_text("raise RuntimeError('needs a GPU')\n")
    with pytest.raises(CustomObjectError, match=r"failing\.py failed to import: RuntimeError: needs a GPU") as info:
        load_custom_objects_file(failing)
    assert isinstance(info.value.__cause__, RuntimeError)
    empty = tmp_path / "empty.py"
    empty.write_text("import keras\nVALUE = 3\n")
    with pytest.raises(CustomObjectError, match="defines no public classes or functions"):
        load_custom_objects_file(empty)


# --- safe mode
@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_lambda_layer_needs_unsafe(tmp_path, suffix):
    inp = keras.Input((4,))
    out = keras.layers.Lambda(lambda t: t * 2.0, name="doubler")(inp)
    path = tmp_path / f"lambda{suffix}"
    keras.Model(inp, out).save(path)
    with pytest.raises(UnsafeModelError) as info:
        load_model(path)
    message = str(info.value)
    assert "Python bytecode" in message and "'doubler'" in message
    assert "safe_mode=False" in message and "--unsafe" in message and "trust" in message
    model = load_model(path, safe_mode=False)
    np.testing.assert_allclose(model(np.ones((1, 4), np.float32)).numpy(), 2.0)


def test_a_file_from_a_newer_keras_says_so(tmp_path, keras_file):
    """Keras keeps every config key of the version that wrote a file, and an older Keras refuses unknown keys:
    the user is told which Keras wrote it and what to do (simulated: a key no Keras knows, a future version)."""
    import json
    import zipfile

    path = tmp_path / "future.keras"
    with zipfile.ZipFile(keras_file) as src, zipfile.ZipFile(path, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "config.json":
                config = json.loads(data)
                dense = next(layer for layer in config["config"]["layers"] if layer["class_name"] == "Dense")
                dense["config"]["future_option"] = None
                data = json.dumps(config).encode()
            elif name == "metadata.json":
                meta = json.loads(data)
                meta["keras_version"] = "99.1.0"
                data = json.dumps(meta).encode()
            dst.writestr(name, data)
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    message = str(info.value)
    assert "saved by Keras 99.1.0" in message and "Upgrade Keras" in message and "future_option" in message
