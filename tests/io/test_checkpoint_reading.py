"""How a checkpoint folder's tensors reach the model (issue 60): safetensors read tensor by tensor (safetensors' own
reader is the reference), variables created once from the checkpoint instead of initialised and overwritten, and
transposed tensors laid out by TensorFlow."""

from __future__ import annotations

import json
import struct
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from gradscope.backend import keras, laid_out, tf, weights_written_once
from gradscope.core.errors import Cancelled, ModelLoadError
from gradscope.io.checkpoints.safetensors_file import SafetensorsFile, safe_open

safetensors_numpy = pytest.importorskip("safetensors.numpy")
safetensors = pytest.importorskip("safetensors")


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((4,)).astype(np.float16),
        "bf16": rng.standard_normal((2, 3, 4)).astype(ml_dtypes.bfloat16),
        "f64": rng.standard_normal((2, 2)),
        "i64": rng.integers(-9, 9, (6,)),
        "i32": rng.integers(-9, 9, (2, 1)).astype(np.int32),
        "u8": rng.integers(0, 255, (7,)).astype(np.uint8),
        "bool": rng.random((3,)) > 0.5,
        "scalar": np.array(1.5, np.float32),
        "empty": np.zeros((0, 4), np.float32),
    }


def test_every_tensor_reads_as_safetensors_reads_it(tmp_path):
    path = tmp_path / "model.safetensors"
    arrays = _arrays()
    safetensors_numpy.save_file(arrays, str(path), metadata={"format": "pt"})
    with safetensors.safe_open(str(path), framework="np") as reference, safe_open(path, framework="np") as ours:
        assert sorted(ours.keys()) == sorted(reference.keys()) == sorted(arrays)
        for name in arrays:
            got, want = ours.get_tensor(name), reference.get_tensor(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert got.tobytes() == want.tobytes(), name
            assert got.flags.writeable and got.flags.c_contiguous  # its own memory, not a view of a mapped file


def _file(tmp_path, header: object, data: bytes = b"", length: int | None = None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "length", "why"),
    [
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, 1 << 40, "header says"),
        (b"{not json", b"", None, "not JSON"),
        ([1, 2], b"", None, "not a JSON object"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None, "outside the file"),
        ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None, "has 8 bytes"),
        ({"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "no dtype"),
        ({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "outside the file"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\0" * 8, None, "outside the file"),
    ],
)
def test_a_malformed_file_is_refused_in_one_line_before_any_tensor_is_read(tmp_path, header, data, length, why):
    with pytest.raises(ModelLoadError, match=why) as err:
        SafetensorsFile(_file(tmp_path, header, data, length))
    assert "\n" not in str(err.value) and "bad.safetensors" in str(err.value)


def test_a_file_that_shrinks_while_it_is_read_is_refused(tmp_path):
    path = _file(tmp_path, {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)
    opened = SafetensorsFile(path)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ModelLoadError, match="ends early"):
        opened.get_tensor("w")
    opened.close()


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_a_transposed_tensor_is_laid_out_as_numpy_lays_it_out(dtype):
    base = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5).astype(dtype)
    for view in (base.transpose(1, 0, 2, 3), base.transpose(3, 1, 0, 2), base[:, 1:], base.T, base[..., ::2]):
        np.testing.assert_array_equal(np.asarray(laid_out(view)), np.ascontiguousarray(view))
    np.testing.assert_array_equal(np.asarray(laid_out(base)), base)
    unaligned = np.empty(base.size + 1, dtype)[1:].reshape(base.shape)  # 2 or 4 bytes past an aligned start
    unaligned[...] = base
    got = laid_out(unaligned)
    assert got.dtype == tf.as_dtype(dtype)
    np.testing.assert_array_equal(np.asarray(got), base)
    flags = np.array([True, False])
    np.testing.assert_array_equal(np.asarray(laid_out(flags)), flags)  # what DLPack does not carry: converted
    assert laid_out(7) == 7


def test_variables_are_created_once_from_what_the_converter_assigns():
    """Inside the block a variable's initializer waits for its first assign, which creates it from the assigned
    value; a variable nobody assigns gets its initializer at the end: the same model as without the block."""
    kernel = np.arange(12, dtype=np.float32).reshape(3, 4)
    with weights_written_once():
        layer = keras.layers.Dense(4, bias_initializer="ones")
        layer.build((None, 3))
        assert layer.kernel._value is None  # no memory taken, no random numbers drawn
        layer.kernel.assign(kernel)
        with pytest.raises(ValueError):  # Keras' own message for a tensor of another shape
            layer.bias.assign(np.zeros(7, np.float32))
        made_elsewhere = []
        thread = threading.Thread(target=lambda: made_elsewhere.append(keras.Variable(np.ones(2), name="other")))
        thread.start()
        thread.join()
        assert made_elsewhere[0]._value is not None  # another thread's variables are created as usual
    np.testing.assert_array_equal(layer.kernel.numpy(), kernel)
    np.testing.assert_array_equal(layer.bias.numpy(), np.ones(4, np.float32))
    x = np.ones((1, 3), np.float32)
    np.testing.assert_allclose(np.asarray(layer(x)), x @ kernel + 1)
    layer.kernel.assign(np.zeros((3, 4), np.float32))  # after the block: a plain variable again
    assert float(tf.reduce_sum(layer.kernel)) == 0.0


HF = Path(__file__).resolve().parents[1] / "data" / "hf"


def test_a_folder_opens_in_two_steps_with_its_graph_first_and_progress_in_bytes():
    """The window draws the graph of a folder's model before its weights arrive, shows how much is read, and a
    Cancel stops between two tensors; the model then opens again from the start."""
    from gradscope.engine.backward.runner import Engine
    from gradscope.io.checkpoints import load_checkpoint_folder_in_steps

    folder = HF / "llama"
    model, load_weights = load_checkpoint_folder_in_steps(folder)
    assert all(v._value is None for v in model.weights)  # built from the config: no memory, no random numbers
    graph = Engine(model).graph  # walked (and drawn) before any weight is read
    assert graph.token_input is not None
    seen: list[tuple[int, int]] = []
    load_weights(lambda done, total: seen.append((done, total)))
    total = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    assert seen[-1] == (total, total) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert 0.9 * total < seen[-2][0] < total  # every tensor's bytes (the headers are the rest)
    ref = np.load(HF / "llama.npz")
    ids = ref["ids"]
    logits = np.asarray(model({"token_ids": ids[None], "padding_mask": np.ones((1, len(ids)), "int32")}))[0]
    np.testing.assert_allclose(logits, ref["logits"], atol=1e-6 * np.abs(ref["logits"]).max(), rtol=0)

    def cancel(done: int, total: int) -> None:
        raise Cancelled()

    model, load_weights = load_checkpoint_folder_in_steps(folder)
    with pytest.raises(Cancelled):
        load_weights(cancel)
    again, load_weights = load_checkpoint_folder_in_steps(folder)  # nothing of the cancelled open is held
    load_weights()
    assert all(v._value is not None for v in again.weights)
