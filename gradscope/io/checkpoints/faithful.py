"""A Hugging Face config carried into keras_hub's backbone as transformers runs it, or refused in one line.

keras_hub 0.32's converters read a fixed set of fields and build the rest from their own defaults: Llama 3 and
Gemma's ``rms_norm_eps`` were never read (every real Llama 3.x sets 1e-5; keras_hub built 1e-6: 6e-2 of the largest
logit on a 1 B shape), GPT-2's ``layer_norm_epsilon`` neither, Gemma 2 and 3 replace a ``query_pre_attn_scalar``
that is neither ``head_dim`` nor ``hidden_size / heads`` by one of those, and Mistral's converter rounds a float32
checkpoint to float16. Here, at the seam (the backbone's arguments, and attributes set after it is built), every
field that changes the arithmetic is carried over where keras_hub's layers can take it; where they cannot, the
folder is refused with the field, its value and what keras_hub builds. ``tests/io/test_faithful_conversion.py``
holds each against transformers' logits.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gradscope.core.errors import ModelLoadError
from gradscope.core.files import shorten

_ONE_AT_A_TIME = threading.Lock()
#: The Hugging Face families whose conversion is held to transformers' logits (``tests/io/test_faithful_conversion.py``;
#: every field of their configs accounted for in ``tests/io/test_config_fields.py``). keras_hub converts more (GPT-OSS,
#: Gemma 3's multimodal folders, Gemma 3n / 4, Qwen 3.5, encoders), unchecked: a folder of another ``model_type`` is
#: refused rather than explained as a model it may not be.
CHECKED_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "gpt2", "smollm3",
)  # fmt: skip
_SILU = ("silu", "swish")
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")
_SWIGLU_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "smollm3")
#: Families whose converter never reads ``rope_scaling``: any scaling but the default changes positions silently.
_ROPE_SCALING_IGNORED = (
    "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "smollm3",
)  # fmt: skip
#: Families keras_hub builds with their own output layer whatever ``tie_word_embeddings`` says.
_UNTIED = ("mistral", "mixtral")


class Conversion:
    """What keras_hub's converter leaves out for one config: backbone arguments to add, layer attributes to set
    once the backbone is built, and the first field it cannot build (``refused``)."""

    def __init__(self, model_type: str, config: dict) -> None:
        self.model_type = model_type
        self.config = config
        self.arguments: dict[str, Any] = {}
        self.norm_epsilon: float | None = None  # every norm layer's, set after the build
        self.query_by_head_dim: bool | None = None  # Gemma 2 / 3: each attention layer's, set after the build
        self.tied: bool | None = None  # tie_word_embeddings, checked against the built head in finish()
        #: fields keras_hub's converter requires where config.json leaves them out (or, for Llama 3's rotary scaling,
        #: says them in ``rope_parameters``): what transformers runs
        self.filled: dict[str, Any] = {}
        self.refused: str | None = None
        self._read()

    def _refuse(self, field: str, value: Any, builds: str) -> None:
        if self.refused is None:  # the config's values are the user's file: shortened, control characters escaped
            kind = shorten(self.model_type, 40)
            self.refused = (
                f"{field} = {shorten(repr(value), 120)}, and keras_hub's {kind} builds {shorten(builds, 160)}"
            )

    def _read(self) -> None:
        c, kind = self.config, self.model_type
        if kind not in CHECKED_TYPES:  # refused by check() as a family, not a field
            return
        self.tied = c.get("tie_word_embeddings")
        if kind != "gpt2":  # every norm of the model: Qwen 3's query/key norms were built with 1e-5 whatever it says
            self.norm_epsilon = c.get("rms_norm_eps", 1e-6)
        if kind in _SWIGLU_FAMILIES and c.get("hidden_act", "silu") not in _SILU:
            self._refuse("hidden_act", c["hidden_act"], "a SiLU-gated MLP")
        scaling = self._rope_scaling(kind, c)
        if kind in _ROPE_SCALING_IGNORED and scaling and scaling.get("rope_type", scaling.get("type")) != "default":
            self._refuse("rope_scaling", scaling, "unscaled rotary positions")
        if kind in ("qwen3", "qwen3_moe", "mistral", "mixtral") and c.get("attention_bias"):
            self._refuse("attention_bias", c["attention_bias"], "its attention projections without biases")
        if kind in ("qwen2", "qwen2_moe", "qwen3"):
            self._all_or_no_sliding(c)
        if kind in ("qwen2_moe", "qwen3_moe"):
            self._experts(kind, c)
        if kind == "qwen3_moe" and "head_dim" not in c:  # transformers 4.53: hidden_size / heads
            self.filled["head_dim"] = c.get("hidden_size", 0) // max(c.get("num_attention_heads") or 1, 1)
        if kind == "smollm3" and "mlp_bias" not in c:  # transformers 4.53's SmolLM3 MLP has no biases
            self.filled["mlp_bias"] = False
        if kind in _UNTIED and c.get("tie_word_embeddings"):
            self._refuse("tie_word_embeddings", True, "a separate output layer (lm_head)")
        window, slides = c.get("sliding_window"), c.get("use_sliding_window")
        if kind == "smollm3" and slides and window is not None and "sliding_attention" in (c.get("layer_types") or []):
            self._refuse("use_sliding_window", True, "full attention in every layer")
        if kind in ("llama", "mixtral"):  # Mistral's converter reads head_dim; these two build hidden / heads
            heads = c.get("num_attention_heads") or 1
            if c.get("head_dim") not in (None, c.get("hidden_size", 0) // heads):
                self._refuse("head_dim", c["head_dim"], "heads of hidden_size / num_attention_heads")
        if kind == "llama":
            self.arguments["layer_norm_epsilon"] = self.norm_epsilon
            if scaling and scaling.get("rope_type", scaling.get("type")) != "llama3":
                self._refuse("rope_scaling", scaling, "llama3 rotary scaling only")
            for field in ("attention_bias", "mlp_bias"):
                if c.get(field):
                    self._refuse(field, c[field], "its projections without biases")
        elif kind in ("gemma", "gemma2"):
            self.arguments["layer_norm_epsilon"] = self.norm_epsilon
            self._gemma_common(c, rope=10_000.0)
            if kind == "gemma2":
                self._query_scalar(c)
                self._layer_types(c, lambda i: i % 2 == 0)
        elif kind == "gemma3_text":
            self._gemma_common(c, rope=1_000_000.0)
            if c.get("rope_local_base_freq", 10_000.0) != 10_000.0:
                self._refuse("rope_local_base_freq", c["rope_local_base_freq"], "local rotary wavelengths of 10000")
            if scaling and scaling.get("rope_type", scaling.get("type")) not in ("default", "linear"):
                self._refuse("rope_scaling", scaling, "linear rotary scaling only")
            self._query_scalar(c)
            self._layer_types(c, lambda i: i % 6 < 5)
        elif kind == "gpt2":
            self.norm_epsilon = c.get("layer_norm_epsilon", 1e-5)
            if c.get("activation_function", "gelu_new") not in _TANH_GELU:
                self._refuse("activation_function", c["activation_function"], "the tanh approximation of GELU")
            if c.get("n_inner") not in (None, 4 * c.get("n_embd", 0)):
                self._refuse("n_inner", c["n_inner"], "an MLP of 4 x n_embd")
            if c.get("scale_attn_weights", True) is not True or c.get("scale_attn_by_inverse_layer_idx"):
                self._refuse("scale_attn_weights", c.get("scale_attn_weights"), "attention scaled by 1/sqrt(head)")

    def _rope_scaling(self, kind: str, c: dict) -> dict | None:
        """The config's rotary scaling: ``rope_scaling`` (transformers 4.x), else a ``rope_parameters`` that scales
        (what newer transformers write: keras_hub's converters read the wavelength in it, never its scaling). A Llama
        3 scaling there is carried into the field keras_hub reads; Gemma 3's per-attention parameters are checked."""
        scaling, parameters = c.get("rope_scaling"), c.get("rope_parameters")
        if scaling or not isinstance(parameters, dict):
            return scaling
        if kind == "gemma3_text":
            for attention, theta in (("full_attention", 1_000_000.0), ("sliding_attention", 10_000.0)):
                part = parameters.get(attention) if isinstance(parameters.get(attention), dict) else {}
                if part.get("rope_theta", theta) != theta:
                    self._refuse(f"rope_parameters.{attention}", part, f"rotary wavelengths of {theta:g}")
                if part.get("rope_type", "default") not in ("default", "linear"):
                    self._refuse(f"rope_parameters.{attention}", part, "linear rotary scaling only")
            return None
        if parameters.get("rope_type", parameters.get("type", "default")) == "default":
            return None
        if kind == "llama":
            self.filled["rope_scaling"] = parameters
        return parameters

    def _experts(self, kind: str, c: dict) -> None:
        """Qwen's mixtures of experts: keras_hub never reads ``mlp_only_layers`` (dense MLPs in the listed layers);
        Qwen 3 MoE slides every layer's window when ``sliding_window`` is set (as transformers 4.53 does); Qwen 2
        MoE's output layer is untied unless the backbone is told, and its attention always has biases."""
        if c.get("mlp_only_layers"):
            self._refuse("mlp_only_layers", c["mlp_only_layers"], "experts in every decoder_sparse_step-th layer")
        if kind == "qwen2_moe":
            self.arguments["tie_word_embeddings"] = bool(c.get("tie_word_embeddings", False))
            if c.get("qkv_bias", True) is not True:
                self._refuse("qkv_bias", c["qkv_bias"], "query, key and value projections with biases")
        else:
            self._layer_types(c, lambda i: True)

    def _gemma_common(self, c: dict, rope: float) -> None:
        field = "hidden_act" if self.model_type == "gemma" else "hidden_activation"  # what transformers 4.53 runs
        if c.get(field, "gelu_pytorch_tanh") not in _TANH_GELU:
            self._refuse(
                field,
                c[field],
                "the tanh approximation of GELU (a checkpoint trained with it opens once config.json says "
                f'"{field}": "gelu_pytorch_tanh")',
            )
        parameters = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
        theta = c.get("rope_theta", parameters.get("rope_theta", rope))  # Gemma 3's per attention: _rope_scaling
        if theta != rope:
            self._refuse("rope_theta", theta, f"rotary wavelengths of {rope:g}")
        if c.get("attention_bias"):
            self._refuse("attention_bias", c["attention_bias"], "its projections without biases")
        if c.get("tie_word_embeddings", True) is False:
            self._refuse("tie_word_embeddings", False, "a head tied to the token embedding")

    def _query_scalar(self, c: dict) -> None:
        head_dim = c.get("head_dim", 256)
        scalar = c.get("query_pre_attn_scalar", 256)
        per_head = c.get("hidden_size", 0) // max(c.get("num_attention_heads") or 1, 1)
        self.query_by_head_dim = scalar == head_dim
        if scalar not in (head_dim, per_head):
            self._refuse(
                "query_pre_attn_scalar",
                scalar,
                f"queries scaled by head_dim ({head_dim}) or hidden_size / num_attention_heads ({per_head}) only",
            )

    def _all_or_no_sliding(self, c: dict) -> None:
        """keras_hub's Qwen backbones slide every layer's window when ``use_sliding_window`` says so, else none;
        transformers slides the layers from ``max_window_layers`` on (its ``layer_types``)."""
        layers, window = int(c.get("num_hidden_layers") or 0), c.get("sliding_window")
        slides = bool(c.get("use_sliding_window")) and window is not None
        types = c.get("layer_types") or [
            "sliding_attention" if slides and i >= c.get("max_window_layers", 28) else "full_attention"
            for i in range(layers)
        ]
        built = ["sliding_attention" if c.get("use_sliding_window") else "full_attention"] * layers
        if list(types) != built:
            self._refuse(
                "max_window_layers", c.get("max_window_layers"), f"sliding windows in every layer or none ({built})"
            )

    def _layer_types(self, c: dict, sliding: Any) -> None:
        types = c.get("layer_types")
        if not types or not c.get("sliding_window"):
            return
        built = ["sliding_attention" if sliding(i) else "full_attention" for i in range(len(types))]
        if list(types) != built:
            self._refuse("layer_types", types, f"the pattern {built}")

    def check(self, where: str) -> None:
        if self.model_type not in CHECKED_TYPES:
            raise ModelLoadError(
                f"{where}: its model_type is {shorten(repr(self.model_type), 40)}, which keras_hub converts but "
                "gradscope has not held to transformers' logits, so it does not open it. Hugging Face folders that "
                f"open: {', '.join(CHECKED_TYPES)}."
            )
        if self.refused:
            raise ModelLoadError(
                f"{where}: its config sets {self.refused}; opening it would explain another model than the one "
                "transformers runs, so gradscope does not."
            )

    def finish(self, backbone: Any, where: str) -> None:
        """What the backbone's arguments cannot carry, set on its built layers (before any call traces them): the norm
        epsilon (GPT-2's backbone takes none; Gemma's passes its own to the final norm only, never to the blocks;
        Qwen 3's query and key norms keep 1e-5),
        and Gemma's query scaling, which keras_hub 0.32's decoder blocks pass to their attention as
        ``query_head_dim_normalize=True`` whatever the backbone was given (Gemma 2 27B scales by hidden / heads).
        A checkpoint with its own output layer (``tie_word_embeddings: false``) built with the head tied to the
        embedding (keras_hub's GPT-2 and SmolLM3 always tie) would lose its ``lm_head``: refused."""
        embedding = getattr(backbone, "token_embedding", None)
        if self.tied is False and getattr(embedding, "tie_weights", False):
            raise ModelLoadError(
                f"{where}: this {shorten(self.model_type, 40)} checkpoint has its own output layer "
                f"(tie_word_embeddings: false), but keras_hub's {type(backbone).__name__} reads its output from the "
                "token embedding, so the converted model would drop it and give wrong logits. keras_hub opens this "
                "family with tied embeddings only."
            )
        for layer in backbone._flatten_layers(include_self=False, recursive=True):
            if self.norm_epsilon is not None and "Norm" in type(layer).__name__ and hasattr(layer, "epsilon"):
                layer.epsilon = float(self.norm_epsilon)
            if self.query_by_head_dim is not None and hasattr(layer, "query_head_dim_normalize"):
                layer.query_head_dim_normalize = self.query_by_head_dim


class _KeptPrecision(np.ndarray):
    """A checkpoint tensor whose ``astype(float16)`` is the tensor itself: Mistral's converter rounds every weight
    to float16 before it is assigned, so a float32 or bfloat16 checkpoint lost precision it had. The variable
    still gets its own dtype: ``assign`` converts to it (a float16 model rounds there, once)."""

    def astype(self, dtype: Any, *args: Any, **kwargs: Any) -> Any:
        if np.dtype(dtype) == np.float16:
            return self
        return np.ndarray.astype(self, dtype, *args, **kwargs)


def _convert_weights(loader: Any, backbone: Any) -> None:
    """What keras_hub's ``TransformersPresetLoader.load_backbone`` does after building when it loads weights."""
    from keras_hub.src.utils.transformers import safetensor_utils

    with safetensor_utils.SafetensorLoader(loader.preset) as tensors:
        loader.converter.convert_weights(backbone, tensors, loader.config)


@contextlib.contextmanager
def faithful_conversion(where: str, deferred: list[Callable[[], None]] | None = None) -> Iterator[None]:
    """Inside: keras_hub's Hugging Face loader builds each backbone with :class:`Conversion`'s additions (or
    raises its refusal naming ``where``), and never rounds a float32 or bfloat16 tensor to float16. With
    ``deferred``, a backbone is only built: reading its weights is appended there, to run later inside this
    context again (the window draws the graph in between)."""
    try:
        from keras_hub.src.utils.transformers import preset_loader, safetensor_utils
    except ImportError:
        yield
        return
    loader_cls, tensors = preset_loader.TransformersPresetLoader, safetensor_utils.SafetensorLoader
    load_backbone, get_tensor = loader_cls.load_backbone, tensors.get_tensor

    def faithful_backbone(self: Any, cls: Any, load_weights: bool, **kwargs: Any) -> Any:
        conversion = Conversion(str(self.config.get("model_type")), self.config)
        conversion.check(where)
        for field, value in conversion.filled.items():
            if self.config.get(field) is None:
                self.config[field] = value
        later = deferred is not None and load_weights
        backbone = load_backbone(self, cls, load_weights and not later, **{**kwargs, **conversion.arguments})
        conversion.finish(backbone, where)
        if later:
            deferred.append(functools.partial(_convert_weights, self, backbone))  # type: ignore[union-attr]
        return backbone

    def kept_tensor(self: Any, hf_weight_key: str) -> np.ndarray:
        return np.asarray(get_tensor(self, hf_weight_key)).view(_KeptPrecision)

    with _ONE_AT_A_TIME:
        loader_cls.load_backbone, tensors.get_tensor = faithful_backbone, kept_tensor
        try:
            yield
        finally:
            loader_cls.load_backbone, tensors.get_tensor = load_backbone, get_tensor
