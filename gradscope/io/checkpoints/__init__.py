"""Checkpoint folders as users have them: a Hugging Face folder (what ``save_pretrained`` writes and every hub
download is: ``config.json`` with a ``model_type``, ``*.safetensors``, tokenizer files) or a keras_hub preset
folder (``save_to_preset``: ``config.json`` with a ``registered_name``, ``metadata.json``, ``model.weights.h5``).

Both open through keras_hub's own loaders (``CausalLM.from_preset(folder)``: its converters map each family's
weights and tokenizer), a causal language model with its head, anything else as its backbone. Nothing is ever
downloaded: only a folder that exists is handed to keras_hub (a preset *name* would be fetched from Kaggle), and
``hf://``, ``kaggle://`` and URLs are refused. Nothing in a folder runs: a Hugging Face config that names its own
Python code (``auto_map``, what ``trust_remote_code`` would import) is refused; a keras_hub config is read in Keras's
safe mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gradscope.core.errors import Cancelled, ModelLoadError
from gradscope.io.checkpoints.faithful import CHECKED_TYPES, faithful_conversion
from gradscope.io.checkpoints.files import INDEX, check_folder_files, read_config, weight_files
from gradscope.io.checkpoints.safetensors_file import read_by_tensor
from gradscope.io.checkpoints.size import check_buildable
from gradscope.io.memory import return_freed_memory

#: Handles that name a place to download from; gradscope opens files and folders on this machine only.
REMOTE_PREFIXES = ("hf://", "kaggle://", "gs://", "s3://", "http://", "https://")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "assets")
#: What ``dtype=`` takes: "auto" is the checkpoint's own (a Hugging Face ``torch_dtype``; keras_hub's saved policy).
DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}.")
    return dtype


def refuse_remote(path: str | Path) -> None:
    """A download handle or URL is one line, before anything tries to read it."""
    text = str(path)
    if text.lower().startswith(REMOTE_PREFIXES):
        raise ModelLoadError(
            f"{text}: gradscope never downloads models. Download the checkpoint yourself (e.g. `huggingface-cli "
            "download NAME --local-dir FOLDER`) and open the folder."
        )


def checkpoint_kind(folder: Path) -> str | None:
    """ "transformers" (a Hugging Face folder), "keras_hub" (a keras_hub preset folder), or None."""
    return _kind(_config(folder))


def _kind(config: dict | None) -> str | None:
    if config is None:
        return None
    if "registered_name" in config:
        return "keras_hub"
    if "model_type" in config:
        return "transformers"
    return None


#: ``progress(bytes read, bytes in all)`` while a folder's weights are read, after each tensor; raising stops it.
Progress = Callable[[int, int], None]


def load_checkpoint_folder(folder: Path, dtype: str = "auto", progress: Progress | None = None) -> Any:
    """The keras.Model in a checkpoint folder: a causal LM with its head (the family's keras_hub ``CausalLM``),
    else its backbone, in ``dtype`` ("auto": as the checkpoint is stored, so a bfloat16 model takes half the
    memory of a float32 copy; keras_hub alone would widen it to float32). ``ModelLoadError`` naming what is
    missing or not convertible."""
    model, load_weights = load_checkpoint_folder_in_steps(folder, dtype)
    load_weights(progress)
    return model


def load_checkpoint_folder_in_steps(folder: Path, dtype: str = "auto") -> tuple[Any, Callable[..., None]]:
    """``load_checkpoint_folder`` in two steps, as the window opens a large folder: the model built from the
    config (its variables wait for their tensors: nothing is drawn at random, no memory is taken; its graph can be
    walked and drawn), then ``load_weights(progress=None)``, which reads each tensor into the variable made from it.
    A keras_hub preset folder loads whole in the first step."""
    config = _config(folder) or {}
    kind = _kind(config)
    wanted = _stored_dtype(config) if check_dtype(dtype) == "auto" else dtype
    options = {"dtype": wanted} if wanted else {}
    check_folder_files(folder)
    if kind == "transformers":
        _check_transformers_folder(folder, config)
        weights = weight_files(folder)
    else:
        weights = [p for p in (folder / "model.weights.h5",) if p.is_file()]
    check_buildable(folder, config, weights, wanted)
    from gradscope.io._keras import import_keras_hub, missing_hf

    try:
        keras_hub = import_keras_hub()
    except ImportError as exc:
        kind_name = "Hugging Face" if kind == "transformers" else "keras_hub"
        raise ModelLoadError(missing_hf(f"{folder} is a {kind_name} checkpoint folder: opening it", exc)) from exc
    from gradscope.backend import weights_written_once

    @contextlib.contextmanager
    def converting(held: list | None = None, on_read: Callable[[int], None] | None = None) -> Iterator[list]:
        """keras_hub's loader as gradscope runs it: one-line errors, the asked dtype, the config carried over, each
        variable written once from its tensor, tensors read one by one. Building (no ``held`` yet) defers a Hugging
        Face folder's weights; reading them (``held``: the variables waiting) initialises what nothing wrote."""
        building = held is None
        with (
            _one_line_errors(folder, config, keras_hub),
            _default_dtype_policy(wanted),
            faithful_conversion(str(folder), deferred if building else None),
            weights_written_once(held, finish=not (building and deferred is not None)) as waiting,
            read_by_tensor(on_read),
        ):
            yield waiting

    preset = str(folder.resolve())  # a path that exists: never read as a preset name to download
    deferred: list[Callable[[], None]] | None = [] if kind == "transformers" else None
    with converting() as held:
        model = _from_preset(keras_hub, preset, options, deferred)
    if not deferred:
        return_freed_memory()
        return model, lambda progress=None: None
    total = sum(p.stat().st_size for p in weights)

    def load_weights(progress: Progress | None = None) -> None:
        read = [0]

        def on_read(nbytes: int) -> None:
            read[0] += nbytes
            if progress is not None:
                progress(min(read[0], total), total)

        with converting(held, on_read):
            for step in deferred:
                step()
        if progress is not None:
            progress(total, total)  # the files' headers are the bytes no tensor counted
        return_freed_memory()  # the converter's copies of each weight (1.2 B bfloat16 parameters: GBs) go back

    return model, load_weights


@contextlib.contextmanager
def _one_line_errors(folder: Path, config: dict, keras_hub: Any) -> Iterator[None]:
    """What keras_hub raises for a folder it cannot read, as one line naming the folder (the user's input)."""
    from gradscope.io._keras import HF_INSTALL

    try:
        yield
    except ImportError as exc:  # keras_hub reads safetensors through the package of that name
        raise ModelLoadError(f"Opening {folder} needs {exc.name or exc}: `{HF_INSTALL}` installs it.") from exc
    except (ModelLoadError, Cancelled):
        raise
    except Exception as exc:  # noqa: BLE001 - a folder keras_hub cannot read is the user's input: one line
        model_type = config.get("model_type")
        if model_type and "no converter" in str(exc).lower():
            raise ModelLoadError(
                f"{folder}: keras_hub {keras_hub.__version__} has no converter for Hugging Face model type "
                f"{model_type!r}. Hugging Face folders that open: {', '.join(CHECKED_TYPES)}."
            ) from exc
        raise ModelLoadError(f"Cannot open the checkpoint folder {folder}: {type(exc).__name__}: {exc}") from exc


def _from_preset(keras_hub: Any, preset: str, options: dict, deferred: list | None) -> Any:
    try:
        return keras_hub.models.CausalLM.from_preset(preset, preprocessor=None, **options)
    except ValueError as exc:
        if "no converter" in str(exc).lower():
            raise
        if deferred:
            deferred.clear()  # the weights of the causal LM that could not be built
        return keras_hub.models.Backbone.from_preset(preset, **options)  # not a causal LM: its backbone


@contextlib.contextmanager
def _default_dtype_policy(dtype: str | None) -> Iterator[None]:
    """Keras' default dtype policy set to ``dtype`` while a model is built: a family whose backbone does not pass
    its ``dtype`` on to its layers (keras_hub 0.32's SmolLM3) is built in it all the same, not in float32."""
    if dtype is None:
        yield
        return
    from gradscope.backend import keras

    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def has_tokenizer(folder: Path) -> bool:
    """Whether a checkpoint folder carries its tokenizer (then it is the model's vocabulary too)."""
    return checkpoint_kind(folder) is not None and any((folder / name).exists() for name in TOKENIZER_FILES)


def _check_transformers_folder(folder: Path, config: dict) -> None:
    if "auto_map" in config:  # transformers' trust_remote_code: Python files the folder ships
        raise ModelLoadError(
            f"{folder} names its own Python code (auto_map in config.json): gradscope never runs a checkpoint's "
            "code, and keras_hub converts only the families it knows."
        )
    if not any(folder.glob("*.safetensors")) and not (folder / INDEX).exists():
        weights = sorted(p.name for p in folder.glob("*.bin"))
        hint = (
            f" It holds PyTorch pickles ({', '.join(weights[:2])}), which are code to unpickle: re-save it with "
            "`save_pretrained(folder, safe_serialization=True)`."
            if weights
            else ""
        )
        raise ModelLoadError(f"{folder} has a config.json but no .safetensors weights.{hint}")


def _stored_dtype(config: dict) -> str | None:
    """A Hugging Face config's ``torch_dtype`` (``dtype`` in newer transformers) when it is one gradscope runs in;
    None: keras_hub's own choice (a keras_hub preset keeps the policy it was saved with)."""
    stored = config.get("torch_dtype") or config.get("dtype")
    return stored if stored in DTYPES[1:] else None


def _config(folder: Path) -> dict | None:
    return read_config(folder) if folder.is_dir() else None
