"""Opening model files: ``.keras`` (Keras 3) and legacy ``.h5``, with every failure turned into a typed error;
checkpoint folders (Hugging Face, keras_hub) through ``io.checkpoints``.

Keras reports most problems as a ``ValueError``/``TypeError`` whose text is written for Keras developers (a
"File not found" for a file that exists but is not a zip, a full config dump for a missing custom class). The
checks here run first where they are cheap (extension, file signature, zip directory, ``config.json``) and the
rest of Keras's errors are translated afterwards, keeping the original exception as ``__cause__``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import re
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gradscope.core.errors import CustomObjectError, GradscopeError, ModelLoadError, UnsafeModelError
from gradscope.core.resources import bundled
from gradscope.io._keras import import_keras
from gradscope.io.archives import WEIGHTS, read_member, weights_store
from gradscope.io.checkpoints import (
    check_dtype,
    checkpoint_kind,
    load_checkpoint_folder,
    load_checkpoint_folder_in_steps,
    refuse_remote,
)

SUPPORTED_EXTENSIONS = (".keras", ".h5", ".hdf5")

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08")
_IMAGE_SIGNATURES = {
    b"\x89PNG\r\n\x1a\n": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF87a": "a GIF image",
    b"GIF89a": "a GIF image",
    b"BM": "a BMP image",
    b"II*\x00": "a TIFF image",
    b"MM\x00*": "a TIFF image",
}

_HOW_TO_SUPPLY = (
    "Supply the code that defines it: a Python file in which the class/function is decorated with "
    "`@keras.saving.register_keras_serializable(package=...)` (the package/name must match the name saved in "
    "the model), passed with `--custom-objects FILE` on the command line, or "
    "`custom_objects=load_custom_objects_file(FILE)` in the API."
)


# ------------------------------------------------------------------------------------------------- public API
def load_model(
    path: str | Path,
    *,
    safe_mode: bool = True,
    custom_objects: dict[str, Any] | None = None,
    compile: bool = False,
    dtype: str = "auto",
    progress: Callable[[int, int], None] | None = None,
) -> Any:
    """Open a ``.keras`` or legacy ``.h5``/``.hdf5`` model file and return the ``keras.Model``.

    ``safe_mode=True`` (the default) refuses files that would execute Python bytecode stored in them (Lambda
    layers, serialized lambdas); pass ``safe_mode=False`` only for files you trust. ``custom_objects`` maps
    names to the custom classes/functions the model uses (see ``load_custom_objects_file``).

    Raises ``ModelLoadError`` (missing, not a model, corrupt, unsupported), ``CustomObjectError`` (a custom
    class or function is not available) or ``UnsafeModelError`` (the file needs ``safe_mode=False``).
    ``progress(bytes read, bytes in all)``: called while a checkpoint folder's weights are read.
    """
    path = bundled(path)
    folder = _checkpoint_folder(path, dtype)
    if folder is not None:
        return load_checkpoint_folder(folder, dtype, progress)
    if not compile:  # the steps are faster: no initializers run, the weights read in place
        model, load_weights = load_model_in_steps(path, safe_mode=safe_mode, custom_objects=custom_objects)
        load_weights()
        return model
    p, config, objects = _prepare(path, custom_objects, safe_mode)
    keras = import_keras()
    with _translated(p, config, objects, safe_mode):
        model = keras.saving.load_model(p, custom_objects=objects, compile=compile, safe_mode=safe_mode)
    return _checked_model(keras, model, p)


def load_model_in_steps(
    path: str | Path, *, safe_mode: bool = True, custom_objects: dict[str, Any] | None = None, dtype: str = "auto"
) -> tuple[Any, Callable[..., None]]:
    """``load_model`` in the two steps Keras takes, with a pause between them: returns the model built from
    its config (every layer and connection; its variables not yet given values: no initializer runs, and
    reading one in between gives its initializer's values) and a function that loads the saved weights into
    it. The GUI draws the graph in between. A BERT-base-shaped encoder (434 MB): 0.15 s, then ~1.3 s (Keras's
    ``load_model``: 1.7 s + 2.7 s).

    Same checks, errors and result as ``load_model``; files the steps do not cover (``.h5``, archives with
    assets or ``.npz`` weights, a Keras without these internals) load whole in the first step, and the second
    does nothing. A Hugging Face folder's second step takes ``progress(bytes read, bytes in all)`` (it may raise
    ``Cancelled`` to stop; the model is then unusable).
    """
    folder = _checkpoint_folder(path, dtype)
    if folder is not None:  # keras_hub builds it, then its tensors are read into it
        return load_checkpoint_folder_in_steps(folder, dtype)
    p, config, objects = _prepare(path, custom_objects, safe_mode)
    keras = import_keras()
    from gradscope.backend import build_without_initializers, loaded_in_place

    saving_lib = _keras_steps() if p.suffix.lower() == ".keras" and _plain_archive(p) else None
    if saving_lib is None:
        with _translated(p, config, objects, safe_mode):
            model = keras.saving.load_model(p, custom_objects=objects, compile=False, safe_mode=safe_mode)
        return _checked_model(keras, model, p), lambda progress=None: None
    with zipfile.ZipFile(p) as zf:
        config_json = read_member(zf, "config.json", p)
    with _translated(p, config, objects, safe_mode):
        # No initializers: the saved weights replace every value (BERT-base: 1.7 s -> 0.15 s to build).
        model, pending = build_without_initializers(
            lambda: saving_lib._model_from_config(config_json, objects, False, safe_mode)
        )
    model = _checked_model(keras, model, p)

    def load_weights(progress: Callable[[int, int], None] | None = None) -> None:  # noqa: ARG001 - a file: seconds
        with _translated(p, config, objects, safe_mode), weights_store(saving_lib, p, model) as store:
            failed: set = set()
            errors: dict = {}
            with loaded_in_place(model, pending):
                saving_lib._load_state(
                    model,
                    weights_store=store,
                    assets_store=None,
                    inner_path="",
                    visited_saveables=set(),
                    failed_saveables=failed,
                    error_msgs=errors,
                )
            if failed:
                saving_lib._raise_loading_failure(errors)

    return model, load_weights


def load_custom_objects_file(path: str | Path) -> dict[str, object]:
    """Import a user's Python file and return the custom objects it defines (for ``load_model``).

    The file typically decorates its classes/functions with ``@keras.saving.register_keras_serializable``;
    importing it registers them. The returned dict maps each public class/function defined in the file to
    its Python name and, for registered objects, also to the registered name (``"package>Name"``) under which
    Keras saves and looks them up.

    Raises ``CustomObjectError`` naming the file if it is missing, is not Python, fails to import or defines
    nothing usable.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise CustomObjectError(f"Custom objects file not found: {p}")
    if not p.is_file():
        raise CustomObjectError(f"Custom objects file {p} is a folder; give the path of a Python (.py) file.")
    if p.suffix.lower() != ".py":
        raise CustomObjectError(f"Custom objects file {p} is not a Python file; give the path of a .py file.")

    keras = import_keras()
    registry = keras.saving.get_custom_objects()
    registered_before = dict(registry)
    digest = hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:10]
    module_name = f"gradscope_user_objects_{re.sub(r'[^0-9A-Za-z_]', '_', p.stem)}_{digest}"
    try:
        spec = importlib.util.spec_from_file_location(module_name, p)
        if spec is None or spec.loader is None:
            raise ImportError("Python cannot import this file")
        module = importlib.util.module_from_spec(spec)
        # Registered in sys.modules while executing so dataclasses, pickling and relative lookups work.
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(module_name, None)
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise CustomObjectError(f"Custom objects file {p.name} has a syntax error{where}: {exc.msg}") from exc
    except (Exception, SystemExit) as exc:
        sys.modules.pop(module_name, None)
        raise CustomObjectError(f"Custom objects file {p.name} failed to import: {type(exc).__name__}: {exc}") from exc

    objects: dict[str, object] = {}
    for name, obj in vars(module).items():
        if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if getattr(obj, "__module__", None) != module_name:
            continue  # imported from elsewhere (keras.layers.Layer, numpy functions, ...)
        objects[name] = obj
    # Objects the file registered, including ones not bound to a public name (made by a factory, say).
    for registered_name, obj in registry.items():
        if registered_before.get(registered_name) is not obj:
            objects[registered_name] = obj
    for obj in list(objects.values()):
        registered_name = _registered_name(keras, obj)
        if registered_name:
            objects.setdefault(registered_name, obj)
    if not objects:
        raise CustomObjectError(
            f"Custom objects file {p.name} defines no public classes or functions. Define the custom "
            "layers/functions there and decorate them with `@keras.saving.register_keras_serializable()`."
        )
    return objects


# ------------------------------------------------------------------------------------------------- steps
_PLAIN_ARCHIVE = {"config.json", "metadata.json", WEIGHTS}


def _prepare(
    path: str | Path, custom_objects: dict[str, Any] | None, safe_mode: bool
) -> tuple[Path, Any, dict[str, Any] | None]:
    """The checks every load starts with: the file, its config, the custom objects it names; and, in safe mode,
    no legacy ``.h5`` Lambda holding bytecode (Keras before 3.11 runs those whatever ``safe_mode`` says)."""
    p = Path(path).expanduser()
    kind = _check_file(p)
    config = _read_config(p, kind)
    if safe_mode and kind == "h5":
        lambdas = [layer for obj, layer in _walk_objects(config) if _holds_bytecode(obj) and layer]
        if lambdas:
            raise _unsafe_error(p, list(dict.fromkeys(lambdas)))
    return p, config, _augment_custom_objects(custom_objects, config)


def _checkpoint_folder(path: str | Path, dtype: str = "auto") -> Path | None:
    """The folder, when ``path`` is a Hugging Face or keras_hub checkpoint folder (a download handle is refused);
    a ``dtype`` other than "auto" is for folders only (a model file opens in the dtype it was saved in)."""
    refuse_remote(path)
    p = Path(path).expanduser()
    if p.is_dir() and checkpoint_kind(p) is not None:
        return p
    if check_dtype(dtype) != "auto":
        raise ModelLoadError(f"dtype {dtype!r} is for checkpoint folders; {p.name} opens in the dtype it was saved in.")
    return None


def _holds_bytecode(obj: dict) -> bool:
    """A legacy Lambda whose function is stored as marshalled bytecode (not a named, registered function)."""
    inner = obj.get("config")
    return obj["class_name"] == "Lambda" and isinstance(inner, dict) and inner.get("function_type") != "function"


@contextlib.contextmanager
def _translated(p: Path, config: Any, objects: dict[str, Any] | None, safe_mode: bool) -> Iterator[None]:
    """Keras's errors as typed gradscope errors (the original kept as ``__cause__``)."""
    try:
        yield
    except GradscopeError:
        raise
    except Exception as exc:
        raise _translate_error(exc, p, config, objects, safe_mode) from exc


def _checked_model(keras: Any, model: Any, p: Path) -> Any:
    if not isinstance(model, keras.Model):
        raise ModelLoadError(
            f"{p} holds a {type(model).__name__}, not a Keras model; gradscope needs a keras.Model "
            "(functional, Sequential or subclassed)."
        )
    return model


def _keras_steps() -> Any:
    from gradscope.backend import keras_saving_steps

    return keras_saving_steps()


def _plain_archive(p: Path) -> bool:
    """A config and one ``.h5`` of weights, nothing else (assets are loaded by Keras's one-step path)."""
    try:
        with zipfile.ZipFile(p) as zf:
            names = set(zf.namelist())
    except (zipfile.BadZipFile, OSError):
        return False
    return WEIGHTS in names and names <= _PLAIN_ARCHIVE


# ------------------------------------------------------------------------------------------------- checks
def _check_file(p: Path) -> str:
    """Fail early and clearly on anything that is certainly not a loadable model; return its kind."""
    if not p.exists():
        raise ModelLoadError(f"Model file not found: {p}")
    if p.is_dir():
        if (p / "saved_model.pb").exists() or (p / "saved_model.pbtxt").exists():
            raise ModelLoadError(_savedmodel_message(p))
        raise ModelLoadError(
            f"{p} is a folder, but not a checkpoint folder (no config.json of a Hugging Face or keras_hub "
            "checkpoint). Open a .keras or .h5 model file, or a checkpoint folder."
        )
    if not p.is_file():  # a FIFO or a device would block the read forever
        raise ModelLoadError(f"{p} is not a regular file.")
    suffix = p.suffix.lower()
    try:
        with p.open("rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise ModelLoadError(f"Cannot read model file {p}: {exc.strerror or exc}") from exc

    if suffix not in SUPPORTED_EXTENSIONS:
        if p.name in ("saved_model.pb", "saved_model.pbtxt"):
            raise ModelLoadError(_savedmodel_message(p.parent))
        hint = ""
        if head.startswith(_ZIP_SIGNATURES) and _zip_has_config(p):
            hint = " It looks like a Keras 3 model archive: rename it to end in .keras."
        elif head.startswith(_HDF5_SIGNATURE):
            hint = " It is an HDF5 file: if it is a Keras model, rename it to end in .h5."
        elif _image_kind(head):
            hint = f" It is {_image_kind(head)}, not a model (pass images as the input image instead)."
        raise ModelLoadError(
            f"Unsupported model file type {suffix or '(no extension)'!r}: {p}. gradscope opens Keras 3 "
            f".keras files and legacy .h5/.hdf5 files.{hint}"
        )

    if not head:
        raise ModelLoadError(f"Model file {p} is empty (0 bytes); re-save or re-download it.")
    if suffix == ".keras":
        return _check_keras_archive(p, head)
    return _check_h5(p, head)


def _check_keras_archive(p: Path, head: bytes) -> str:
    if not zipfile.is_zipfile(p):
        if head.startswith(_ZIP_SIGNATURES):
            raise ModelLoadError(
                f"Model file {p} is damaged or incomplete: it starts like a .keras (zip) archive but the "
                "archive is truncated or corrupt. Re-save or re-download it."
            )
        if head.startswith(_HDF5_SIGNATURE):
            raise ModelLoadError(
                f"{p} is a legacy HDF5 model with a .keras extension; rename it to end in .h5 and open that."
            )
        what = _image_kind(head) or ("a text file" if _looks_like_text(head) else "some other kind of file")
        raise ModelLoadError(
            f"{p} is not a Keras model file: it is {what}. A .keras model is a zip archive written by "
            "`model.save('name.keras')`."
        )
    try:
        with zipfile.ZipFile(p) as zf:
            names = set(zf.namelist())
            if "config.json" not in names:
                raise ModelLoadError(
                    f"{p} is a zip archive but not a Keras model (it has no config.json). A .keras model is "
                    "written by `model.save('name.keras')`."
                )
            json.loads(read_member(zf, "config.json", p))
    except ModelLoadError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(
            f"Model file {p} is damaged: its model description (config.json) cannot be read ({exc}). "
            "Re-save or re-download it."
        ) from exc
    return "keras"


def _check_h5(p: Path, head: bytes) -> str:
    if head.startswith(_HDF5_SIGNATURE):
        return "h5"
    if head.startswith(_ZIP_SIGNATURES) and _zip_has_config(p):
        raise ModelLoadError(f"{p} is a Keras 3 (.keras) archive with an .h5 extension; rename it to end in .keras.")
    # HDF5 allows a user block before the signature: let h5py decide before calling it something else.
    try:
        import h5py

        if h5py.is_hdf5(p):
            return "h5"
    except Exception:  # noqa: BLE001 - a missing or failing h5py just means we cannot tell
        pass
    what = _image_kind(head) or ("a text file" if _looks_like_text(head) else "not an HDF5 file")
    raise ModelLoadError(
        f"{p} is not a Keras .h5 model file: it is {what}. A legacy .h5 model is written by `model.save('name.h5')`."
    )


def _savedmodel_message(folder: Path) -> str:
    return (
        f"{folder} is a TensorFlow SavedModel, which Keras 3 `load_model` (and so gradscope) cannot open: a "
        "SavedModel holds a traced graph, not the Keras layers gradscope needs. Re-save the model from the "
        "code that built it with `model.save('model.keras')` (or, if you only have the SavedModel, rebuild "
        "the architecture in Keras and load the weights), then open the .keras file."
    )


def _zip_has_config(p: Path) -> bool:
    try:
        with zipfile.ZipFile(p) as zf:
            return "config.json" in zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def _image_kind(head: bytes) -> str | None:
    for signature, kind in _IMAGE_SIGNATURES.items():
        if head.startswith(signature):
            return kind
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    return None


def _looks_like_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c >= 32 or c in (9, 10, 13) for c in head)


# ---------------------------------------------------------------------------------------------- config scan
def _read_config(p: Path, kind: str) -> Any:
    """The model's saved config (nested dicts) or None: only used to explain and avoid errors."""
    try:
        if kind == "keras":
            with zipfile.ZipFile(p) as zf:
                return json.loads(read_member(zf, "config.json", p))
        import h5py

        with h5py.File(p, "r") as f:
            raw = f.attrs.get("model_config")
            if raw is None:
                if "layer_names" in f.attrs or "model_weights" not in f:
                    raise ModelLoadError(
                        f"{p} contains only weights, no model architecture (it was written by "
                        "`save_weights`). Open the full model saved with `model.save('model.keras')`, or "
                        "rebuild the model in code and load these weights into it."
                    )
                return None
            if isinstance(raw, bytes):
                raw = raw.decode("utf-8")
            return json.loads(raw)
    except ModelLoadError:
        raise
    except Exception as exc:
        if kind == "h5":
            raise ModelLoadError(
                f"Model file {p} is damaged or not a Keras model: the HDF5 file cannot be read ({exc}). "
                "Re-save or re-download it."
            ) from exc
        return None


def _walk_objects(config: Any, layer: str | None = None) -> Iterator[tuple[dict, str | None]]:
    """Every serialized object in a config, with the name of the layer it belongs to."""
    if isinstance(config, dict):
        if isinstance(config.get("class_name"), str):
            if _is_layer_like(config):
                inner = config.get("config")
                name = config.get("name") or (inner.get("name") if isinstance(inner, dict) else None)
                if isinstance(name, str):
                    layer = name
            yield config, layer
        for value in config.values():
            yield from _walk_objects(value, layer)
    elif isinstance(config, list):
        for value in config:
            yield from _walk_objects(value, layer)


def _is_layer_like(obj: dict) -> bool:
    module = obj.get("module") or ""
    return "inbound_nodes" in obj or "build_config" in obj or module.startswith("keras.layers")


def _object_name(obj: dict) -> tuple[str, str, str] | None:
    """(kind, name Keras reports, registered name) of a serialized class/function, or None for plain data."""
    class_name = obj["class_name"]
    if class_name.startswith("__"):  # __keras_tensor__, __numpy__, __lambda__, ...
        return None
    if class_name == "function":
        name = obj.get("config")
        return ("function", name, name) if isinstance(name, str) else None
    registered = obj.get("registered_name") or class_name
    return "class", class_name, registered


def _unresolved_objects(config: Any, custom_objects: dict[str, Any] | None) -> list[tuple[str, str, str | None]]:
    """Custom (non-Keras) objects in a config, neither registered nor supplied: (kind, name, layer)."""
    if config is None:
        return []
    keras = import_keras()
    supplied = custom_objects or {}
    found: dict[str, tuple[str, str, str | None]] = {}
    for obj, layer in _walk_objects(config):
        named = _object_name(obj)
        if named is None:
            continue
        kind, name, registered = named
        module = obj.get("module")
        if kind == "function":
            if ">" not in registered:
                continue  # a Keras built-in referred to by its plain name ("relu")
        elif ">" not in registered and (
            (module and (module == "keras" or module.startswith("keras."))) or (not module and _is_builtin(name))
        ):
            continue
        library = (module or "").split(".")[0]
        if library in _KERAS_LIBRARIES:  # Keras imports these by their module (when installed)
            if importlib.util.find_spec(library) is None:
                found.setdefault(registered, (f"library:{library}", registered, layer))
            continue
        if keras.saving.get_registered_object(registered, custom_objects=supplied) is not None:
            continue
        if name in supplied or registered.split(">")[-1] in supplied:
            continue
        found.setdefault(registered, (kind, registered, layer))
    return list(found.values())


#: Libraries whose classes Keras finds by the module a config names (``serialization_lib``).
_KERAS_LIBRARIES = ("keras_hub", "keras_cv", "keras_nlp")

_BUILTIN_NAMESPACES = (
    "layers",
    "models",
    "initializers",
    "regularizers",
    "constraints",
    "activations",
    "losses",
    "metrics",
    "optimizers",
    "dtype_policies",
    "ops",
)


def _is_builtin(name: str) -> bool:
    """Whether a plain class name (legacy .h5 configs carry no module) is one of Keras's own."""
    keras = import_keras()
    if name in ("Functional", "Sequential", "Model"):
        return True
    return any(hasattr(getattr(keras, ns, None), name) for ns in _BUILTIN_NAMESPACES)


def _lambda_layers(config: Any) -> list[str]:
    names = []
    for obj, layer in _walk_objects(config):
        if obj["class_name"] in ("Lambda", "__lambda__") and layer and layer not in names:
            names.append(layer)
    return names


def _registered_name(keras: Any, obj: Any) -> str | None:
    try:
        name = keras.saving.get_registered_name(obj)
    except Exception:  # noqa: BLE001 - objects Keras cannot name simply have no registered name
        return None
    return name if isinstance(name, str) and ">" in name else None


def _augment_custom_objects(custom_objects: dict[str, Any] | None, config: Any) -> dict[str, Any] | None:
    """Let users key custom objects by plain class name: also file them under the saved registered name.

    Keras looks classes up by their registered name (``"package>Name"``) only, so ``{"MyLayer": MyLayer}``
    silently fails for a layer saved as ``"mypkg>MyLayer"``.
    """
    if not custom_objects:
        return custom_objects
    objects = dict(custom_objects)
    keras = import_keras()
    for value in custom_objects.values():
        registered = _registered_name(keras, value)
        if registered:
            objects.setdefault(registered, value)
    if config is not None:
        for obj, _ in _walk_objects(config):
            named = _object_name(obj)
            if named is None:
                continue
            _, name, registered = named
            short = registered.split(">")[-1]
            if registered not in objects:
                if name in objects:
                    objects[registered] = objects[name]
                elif short in objects:
                    objects[registered] = objects[short]
    return objects


# ---------------------------------------------------------------------------------------------- translation
_MISSING_PATTERNS = (
    re.compile(r"Could not locate (class|function) '([^']+)'"),
    re.compile(r"Could not deserialize (class|function) '([^']+)' because its parent module"),
    re.compile(r"Unknown ([A-Za-z_ ]+?): '([^']+)'"),
)


def _unsafe_error(p: Path, lambdas: list[str]) -> UnsafeModelError:
    if lambdas:
        plural = len(lambdas) > 1
        what = (
            f"Its Lambda layer{'s' if plural else ''} {', '.join(repr(n) for n in lambdas)} "
            f"store{'' if plural else 's'} Python code rather than a configuration"
        )
    else:
        what = "It stores Python code (a Lambda layer or a serialized lambda) rather than a configuration"
    return UnsafeModelError(
        f"{p.name} contains Python bytecode that would be executed when the model is loaded. {what}, "
        "and safe mode refuses to run it. Only if you trust where this file came from, open it with "
        "`--unsafe` on the command line or `safe_mode=False` in the API."
    )


def _saved_by_newer_keras(p: Path) -> tuple[str, str] | None:
    """(saved, running) Keras versions when the archive says a newer Keras wrote it, else None."""
    try:
        with zipfile.ZipFile(p) as zf:
            saved = json.loads(read_member(zf, "metadata.json", p)).get("keras_version")
    except (zipfile.BadZipFile, OSError, KeyError, ValueError, GradscopeError):
        return None
    from gradscope.backend import version_tuple  # loaded already: this runs after Keras failed to load the file

    running = str(import_keras().__version__)
    if not isinstance(saved, str) or version_tuple(saved) <= version_tuple(running):
        return None
    return saved, running


def _translate_error(
    exc: Exception, p: Path, config: Any, custom_objects: dict[str, Any] | None, safe_mode: bool
) -> GradscopeError:
    text = str(exc)
    if safe_mode and ("safe_mode=False" in text or "arbitrary code execution" in text):
        return _unsafe_error(p, _lambda_layers(config))

    newer = _saved_by_newer_keras(p)
    if newer is not None and ("keyword argument" in text or "Unrecognized keyword" in text):
        saved, running = newer
        return ModelLoadError(
            f"{p.name} was saved by Keras {saved}, and this is Keras {running}: the file has settings this older "
            f"Keras does not know ({text.strip().splitlines()[-1][:160]}). Upgrade Keras (`pip install -U "
            f"'keras>={saved}'`), or save the model again with the oldest Keras that should read it."
        )

    match = None
    for pattern in _MISSING_PATTERNS:
        match = pattern.search(text)
        if match:
            break
    unresolved = _unresolved_objects(config, custom_objects)
    if match or (unresolved and isinstance(exc, (TypeError, ValueError))):
        if match:
            kind = "function" if "function" in match.group(1) else "class"
            name = match.group(2)
            # Keras names a class by its plain name; the registered name in the file is what must match.
            for u_kind, registered, layer in unresolved:
                if registered == name or registered.split(">")[-1] == name:
                    kind, name, found_layer = u_kind, registered, layer
                    break
            else:
                found_layer = None
        else:
            kind, name, found_layer = unresolved[0]
        if kind.startswith("library:"):
            library = kind.split(":", 1)[1]
            return ModelLoadError(
                f"{p.name} is built from {library}'s {name!r}"
                + (f" (layer {found_layer!r})" if found_layer else "")
                + f", and {library} is not installed here: `{_install_command(library)}`."
            )
        noun = "custom layer/class" if kind == "class" else "custom function"
        where = f" (used by layer {found_layer!r})" if found_layer else ""
        others = [u[1] for u in unresolved if u[1] != name]
        more = f" It also uses other unregistered objects: {', '.join(others)}." if others else ""
        return CustomObjectError(
            f"{p.name} uses the {noun} {name!r}{where}, which is not available in this Python session.{more} "
            f"{_HOW_TO_SUPPLY}",
            object_name=name,
        )

    first_line = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if len(first_line) > 300:
        first_line = first_line[:300] + "..."
    return ModelLoadError(
        f"Could not load the model in {p.name}: {type(exc).__name__}: {first_line}. The file may be damaged, "
        "written by an incompatible Keras version, or use custom code that does not rebuild from its config."
    )


def _install_command(library: str) -> str:
    """What installs ``library``: keras_hub through gradscope's extra (its tokenizers' modules come with it)."""
    if library == "keras_hub":
        from gradscope.io._keras import HF_INSTALL

        return HF_INSTALL
    return f"pip install {library.replace('_', '-')}"
