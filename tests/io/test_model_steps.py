"""``load_model_in_steps``: the model from its config first (the GUI draws its graph), then its weights; the
result is the model ``load_model`` gives, and every file the steps do not cover still loads whole."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from gradscope.core.errors import ModelLoadError, UnsafeModelError
from gradscope.engine.backward.runner import Engine
from gradscope.io.models import load_model, load_model_in_steps
from tests.engine.model_kinds import KINDS, inputs_for

keras = pytest.importorskip("keras")


def functional() -> keras.Model:
    inp = keras.Input((8, 8, 3), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inp, keras.layers.Dense(3, name="logits")(x), name="small")


def sequential() -> keras.Model:
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(2)], name="seq"
    )


def nested() -> keras.Model:
    inner_in = keras.Input((6,))
    inner = keras.Model(inner_in, keras.layers.Dense(4, name="dense")(inner_in), name="inner")
    inp = keras.Input((6,))
    return keras.Model(inp, keras.layers.Dense(2, name="head")(inner(inp)), name="outer")


def saved(model: keras.Model, path) -> list[np.ndarray]:
    """Save ``model`` with weights no initializer produces (so a skipped second step cannot pass)."""
    weights = [np.arange(w.size, dtype=np.float32).reshape(w.shape) / w.size + 0.5 for w in model.get_weights()]
    model.set_weights(weights)
    model.save(path)
    return weights


def with_damaged_weights(good, bad):
    """A copy of the .keras file ``good`` whose config is intact and whose weights are not HDF5."""
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, b"not an HDF5 file" * 64 if name == "model.weights.h5" else data)
    return bad


@pytest.mark.parametrize("build", [functional, sequential, nested], ids=lambda f: f.__name__)
def test_the_steps_give_the_model_load_model_gives(tmp_path, build):
    path = tmp_path / "m.keras"
    weights = saved(build(), path)
    model, load_weights = load_model_in_steps(path)
    assert [w.shape for w in model.get_weights()] == [w.shape for w in weights]
    assert not all(np.array_equal(a, b) for a, b in zip(model.get_weights(), weights, strict=True))
    load_weights()
    reference = load_model(path)
    for got, want, ref in zip(model.get_weights(), weights, reference.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, ref)
    assert [layer.name for layer in model.layers] == [layer.name for layer in reference.layers]


def test_files_the_steps_do_not_cover_load_whole_in_the_first(tmp_path):
    h5 = tmp_path / "m.h5"
    weights = saved(functional(), h5)
    with_assets = tmp_path / "assets.keras"
    saved(functional(), with_assets)
    with zipfile.ZipFile(with_assets, "a") as zf:
        zf.writestr("assets/vocabulary.txt", "a\nb\n")
    for path in (h5, with_assets):
        model, load_weights = load_model_in_steps(path)
        for got, want in zip(model.get_weights(), weights, strict=True):
            np.testing.assert_array_equal(got, want)
        load_weights()  # nothing left to do


def test_damaged_weights_fail_in_the_second_step_with_a_typed_error(tmp_path):
    good = tmp_path / "good.keras"
    saved(functional(), good)
    bad = with_damaged_weights(good, tmp_path / "bad.keras")
    model, load_weights = load_model_in_steps(bad)  # the config is fine
    assert model.name == "small"
    with pytest.raises(ModelLoadError) as info:
        load_weights()
    assert "bad.keras" in str(info.value) and info.value.__cause__ is not None


def test_the_first_step_keeps_safe_mode(tmp_path):
    inp = keras.Input((4,))
    path = tmp_path / "lambda.keras"
    keras.Model(inp, keras.layers.Lambda(lambda t: t * 2.0, name="doubler")(inp)).save(path)
    with pytest.raises(UnsafeModelError, match="doubler"):
        load_model_in_steps(path)
    model, load_weights = load_model_in_steps(path, safe_mode=False)
    load_weights()
    np.testing.assert_allclose(model(np.ones((1, 4), np.float32)).numpy(), 2.0)


@pytest.mark.parametrize("name", list(KINDS))
def test_every_supported_model_kind_loads_in_steps_as_it_was_saved(tmp_path, name):
    model = KINDS[name]()
    path = tmp_path / "model.keras"
    model.save(path)
    loaded, load_weights = load_model_in_steps(path)
    load_weights()
    for got, want in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    xs = inputs_for(Engine(loaded))
    args = xs if len(xs) > 1 else xs[0]
    for got, want in zip(keras.tree.flatten(loaded(args)), keras.tree.flatten(model(args)), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def rewritten(src, dst, *, compression=zipfile.ZIP_STORED, extra=b""):
    """A copy of the archive ``src`` written with ``compression``, its weights member carrying ``extra`` (a zip
    extra field, as other zip tools write) in its headers."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=compression) as zout:
        for info in zin.infolist():
            out = zipfile.ZipInfo(info.filename, info.date_time)
            out.compress_type = compression
            out.extra = extra if info.filename == "model.weights.h5" else b""
            zout.writestr(out, zin.read(info.filename))
    return dst


@pytest.mark.parametrize(
    "compression, extra",
    [(zipfile.ZIP_DEFLATED, b""), (zipfile.ZIP_STORED, b"\xfe\xca\x06\x00gradsc")],
    ids=["deflated", "stored with an extra field"],
)
def test_archives_other_tools_wrote_load_their_weights(tmp_path, compression, extra):
    weights = saved(functional(), tmp_path / "m.keras")
    path = rewritten(tmp_path / "m.keras", tmp_path / "other.keras", compression=compression, extra=extra)
    model, load_weights = load_model_in_steps(path)
    load_weights()
    for got, want in zip(model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)


@keras.saving.register_keras_serializable(package="gradscope_tests")
class CountingInitializer(keras.initializers.Initializer):
    calls = 0

    def __call__(self, shape, dtype=None):
        CountingInitializer.calls += 1
        return keras.ops.ones(shape, dtype=dtype)


def test_no_initializer_runs_when_the_weights_are_loaded(tmp_path):
    from keras.src.backend.common import global_state

    inp = keras.Input((6,))
    out = keras.layers.Dense(3, kernel_initializer=CountingInitializer(), name="d")(inp)
    path = tmp_path / "m.keras"
    weights = saved(keras.Model(inp, out), path)
    CountingInitializer.calls = 0
    model = load_model(path)
    assert CountingInitializer.calls == 0
    for got, want in zip(model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)
    assert not global_state.get_global_attribute("uninitialized_variables", None)
    with keras.StatelessScope():  # Keras's own deferred initialisation finds nothing of ours left to do
        pass
    np.testing.assert_array_equal(model.get_weights()[0], weights[0])


@keras.saving.register_keras_serializable(package="gradscope_tests")
class ConstantState(keras.layers.Layer):
    """A layer whose variable is made from a value, not an initializer (Keras refuses that in a stateless
    scope): the model is built as Keras builds it."""

    def build(self, input_shape):
        self.state = keras.Variable(np.full((input_shape[-1],), 2.0, np.float32), name="state")

    def call(self, x):
        return x * self.state


def test_a_layer_that_needs_initialized_variables_is_built_as_keras_builds_it(tmp_path):
    inp = keras.Input((4,))
    path = tmp_path / "m.keras"
    model = keras.Model(inp, ConstantState(name="const")(keras.layers.Dense(4, name="d")(inp)))
    model.save(path)
    loaded = load_model(path)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-6)
    for got, want in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_weights_too_large_for_memory_are_read_from_the_archive(tmp_path, monkeypatch):
    from keras.src.saving import saving_lib

    weights = saved(functional(), tmp_path / "stored.keras")
    path = rewritten(tmp_path / "stored.keras", tmp_path / "m.keras", compression=zipfile.ZIP_DEFLATED)
    monkeypatch.setattr(saving_lib, "is_memory_sufficient", lambda model: False)
    model, load_weights = load_model_in_steps(path)
    load_weights()
    for got, want in zip(model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_member_claiming_gigabytes_it_does_not_store_is_refused(tmp_path):
    from gradscope.io.archives import refuse_zip_bomb

    info = zipfile.ZipInfo("config.json")
    info.file_size, info.compress_size = 5 << 30, 4 << 20  # 5 GiB from 4 MiB: more than 100x, over 4 GiB
    with pytest.raises(ModelLoadError, match="config.json claims"):
        refuse_zip_bomb(info, tmp_path / "bomb.keras")
    info.compress_size = 5 << 30  # stored as large as it claims: a big model, not a bomb
    refuse_zip_bomb(info, tmp_path / "big.keras")
