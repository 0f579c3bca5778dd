"""verl 0.9.1 on CPU without Ray: a CPU platform through verl's own plugin API, and a small harness.

Part of the verl integration (:mod:`real_model.integrations.verl`); imports verl lazily, inside
the functions, so importing this module costs nothing and needs no verl.

**CPU platform.** With no GPU, verl's platform detection (``verl.plugin.platform``) falls back to
NVIDIA and ``init_device_mesh("cuda")`` fails. :func:`register_cpu_platform` registers
:class:`CPU platform <make_cpu_platform_class>` with ``PlatformRegistry.register("cpu")`` and
selects it with ``set_platform`` -- only when this process has no accelerator (no CUDA device, no
``nvidia-smi``, no ROCm/NPU); with one it does nothing and returns ``False``. The platform's
device is ``"cpu"``, its backend ``"gloo"``, and its device module is ``torch.cpu`` plus the
``torch.cuda``-style calls verl makes (``empty_cache``, memory statistics: no-ops / zeros), without
patching ``torch.cpu``. It also registers verl's own FSDP engines (``FSDPEngineWithLMHead``,
``FSDPEngineWithValueHead``) for the device ``"cpu"`` in ``EngineRegistry`` (verl registers them for
``cuda``/``npu`` only). It must run before ``verl.workers.engine.fsdp.transformer_impl`` is imported
(that module caches the device name at import). No verl source is edited.

**Harness** (tests, ``examples/verl_geometry_cpu.py``, ``benchmarks/bench_verl_geometry.py``):
:func:`init_process_group` (gloo; ``torchrun`` or a single process), :func:`save_tiny_llama`,
:func:`make_engine` (``FSDPEngineWithLMHead`` with FSDP2, float32, SDPA attention, as verl's
``TrainingWorker`` builds it, without Ray) and :func:`make_loss_fn` (``functools.partial(ppo_loss,
config=actor_config)``, as verl's ``ActorRolloutRefWorker`` builds it), :func:`grpo_batch` (a padded
GRPO batch through verl's ``left_right_2_no_padding``, with the non-tensor keys verl's worker adds)
and :func:`rank_slice` (a data-parallel rank's contiguous slice, as verl's dispatch splits a batch).
"""

from __future__ import annotations

import os
import shutil
import types
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "has_accelerator",
    "make_cpu_platform_class",
    "register_cpu_platform",
    "init_process_group",
    "save_tiny_llama",
    "make_engine",
    "make_loss_fn",
    "grpo_batch",
    "rank_slice",
    "full_grads",
    "set_old_log_probs",
]

CPU_PLATFORM_NAME = "cpu"


def has_accelerator() -> bool:
    """True when this process sees an accelerator verl supports (CUDA, ROCm, NPU) or ``nvidia-smi``.

    ``nvidia-smi`` counts as a GPU (verl's own CUDA detection does the same, so that CPU-only Ray
    actors on a GPU cluster keep the NVIDIA platform).
    """
    import torch

    if torch.cuda.is_available() or shutil.which("nvidia-smi") is not None:
        return True
    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


def _cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda``-style calls verl makes on its device module."""
    import torch

    mod = types.ModuleType("grpo_audit_verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(mod, name, getattr(torch.cpu, name))

    def zero(*args: Any, **kwargs: Any) -> int:
        return 0

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    for name in ("max_memory_allocated", "max_memory_reserved", "memory_allocated",
                 "memory_reserved", "mem_get_info"):
        if not hasattr(mod, name):
            setattr(mod, name, zero if name != "mem_get_info" else (lambda *a, **k: (0, 0)))
    for name in ("empty_cache", "reset_peak_memory_stats", "manual_seed", "manual_seed_all",
                 "set_device", "synchronize", "ipc_collect"):
        if not hasattr(mod, name):
            setattr(mod, name, nothing)
    mod.memory_stats = lambda *a, **k: {}
    return mod


def make_cpu_platform_class() -> type:
    """The CPU ``PlatformBase`` subclass (built lazily: importing verl only when called)."""
    import torch
    from verl.plugin.platform import PlatformBase

    device_module = _cpu_device_module()

    class CPUPlatform(PlatformBase):
        """verl platform for CPU processes: device ``cpu``, collectives over ``gloo``."""

        device_name = "cpu"
        vendor_name = "cpu"

        @property
        def device_module(self) -> types.ModuleType:  # type: ignore[override]
            return device_module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return not has_accelerator()

        def current_device(self) -> Any:  # verl passes it to .to() and tensor factories
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            return None

        def manual_seed_all(self, seed: int) -> None:
            return None

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str) -> Any:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

    return CPUPlatform


def register_cpu_platform() -> bool:
    """Register and select the CPU platform and the CPU FSDP engines, only when no accelerator.

    Idempotent. Returns ``True`` when the CPU platform is (now) verl's platform, ``False`` when
    this process has an accelerator (nothing is registered: verl keeps its own platform).

    Raises:
        RuntimeError: verl already resolved another platform, or cached the device name in its
            FSDP engine module (call this before anything builds a verl engine).
    """
    if has_accelerator():
        return False
    import sys

    from verl.plugin.platform import PlatformRegistry, platform_manager, set_platform

    current = platform_manager._current_platform
    if current is not None and current.device_name == "cpu":
        _register_cpu_engines()
        return True
    impl = sys.modules.get("verl.workers.engine.fsdp.transformer_impl")
    if current is not None or impl is not None:
        raise RuntimeError(
            "register_cpu_platform() must run before verl resolves its platform or imports "
            "verl.workers.engine.fsdp.transformer_impl (that module caches the device name)"
        )
    cls = PlatformRegistry.register(platform=CPU_PLATFORM_NAME)(make_cpu_platform_class())
    set_platform(cls())
    _register_cpu_engines()
    return True


def _register_cpu_engines() -> None:
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import (
        FSDPEngineWithLMHead,
        FSDPEngineWithValueHead,
    )

    for model_type, cls in (("language_model", FSDPEngineWithLMHead),
                            ("value_model", FSDPEngineWithValueHead)):
        for backend in ("fsdp", "fsdp2"):
            if "cpu" not in EngineRegistry._engines.get(model_type, {}).get(backend, {}):
                EngineRegistry.register(model_type=model_type, backend=backend, device="cpu")(cls)


def init_process_group() -> tuple[int, int]:
    """Initialise the default process group (``torchrun`` env or one process).

    ``gloo`` without CUDA; with CUDA, ``cpu:gloo,cuda:nccl`` on the device ``LOCAL_RANK`` (as
    verl's workers do on GPUs). Returns ``(rank, world_size)``; idempotent.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            dist.init_process_group("cpu:gloo,cuda:nccl")
        else:
            dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def save_tiny_llama(path: str | Path, *, seed: int = 0, hidden: int = 64, layers: int = 2,
                    vocab: int = 256, tie_word_embeddings: bool = False) -> Path:
    """Save a tiny random Llama (``save_pretrained``) for verl's engine to load; returns the path.

    Written once per path (a second call with the same path keeps the files).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    if (path / "config.json").exists():
        return path
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    return _save_once(LlamaForCausalLM(cfg), path)


def save_lora_adapter(model_path: str | Path, path: str | Path, *, rank: int = 4,
                      alpha: int = 16, b_std: float = 0.02, seed: int = 0) -> Path:
    """Save a PEFT LoRA adapter on every Linear of the model at ``model_path`` (verl's
    ``target_modules="all-linear"``) for verl's ``model.lora_adapter_path``: PEFT's ``A``, and
    ``B`` drawn ``N(0, b_std^2)`` (seeded) instead of PEFT's zeros, so that, unlike a fresh adapter
    (``B = 0``: every ``A`` has a zero gradient), every adapter weight has a gradient from the
    first step. Returns the path; written once per path."""
    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if (path / "adapter_config.json").exists():
        return path
    base = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    torch.manual_seed(seed)
    model = get_peft_model(base, LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank,
                                            lora_alpha=alpha, target_modules="all-linear",
                                            bias="none"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, b_std)
    return _save_once(model, path)


def _save_once(model: Any, path: Path) -> Path:
    """``model.save_pretrained`` into a temporary sibling renamed to ``path`` (another process
    that wrote it first wins; its files are kept). The rename is atomic, so a process that
    loses the race between checking and renaming (the rename raises) drops its own copy."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    try:
        tmp.rename(path)
    except OSError:
        if not path.exists():
            raise
        shutil.rmtree(tmp)
    return path


MIXED_PRECISION = {  # verl's FSDP mixed-precision settings per compute dtype
    "fp32": {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
    "bf16": {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
}


def make_engine(model_path: str | Path, *, micro_batch_size: int, lr: float = 1e-3,
                engine_cls: Any = None, geometry: Any = None, use_remove_padding: bool = True,
                gradient_checkpointing: bool = False, compute_dtype: str = "fp32",
                attn_implementation: str = "sdpa", lora_rank: int = 0,
                lora_alpha: int = 16, lora_adapter_path: str | Path | None = None) -> Any:
    """verl's ``FSDPEngineWithLMHead`` (FSDP2, SDPA) on this process group, initialised.

    Args:
        model_path: a directory written by :func:`save_tiny_llama` (or any HF causal LM).
        micro_batch_size: ``micro_batch_size_per_gpu``.
        engine_cls: engine class (default verl's ``FSDPEngineWithLMHead``; the geometry engine of
            :mod:`real_model.integrations.verl.engine` for measured runs).
        geometry: a ``GeometryConfig`` for ``engine_cls`` (passed as its ``geometry`` option).
        use_remove_padding: verl's ``use_remove_padding`` (packed micro-batches; default True).
        gradient_checkpointing: verl's ``enable_gradient_checkpointing`` (default False).
        compute_dtype: ``"fp32"`` (default: float32 throughout) or ``"bf16"`` (verl's GPU
            default: float32 master weights, bf16 compute, float32 gradient reduction).
        attn_implementation: the model's attention (default ``"sdpa"``; ``"flash_attention_2"``
            where the ``flash_attn`` package is installed).
        lora_rank, lora_alpha: verl's ``model.lora_rank`` and ``model.lora_alpha`` (default 0:
            full fine-tuning; ``> 0``: verl wraps the model with PEFT LoRA adapters on every
            Linear, ``target_modules="all-linear"``, and trains only the adapters).
        lora_adapter_path: verl's ``model.lora_adapter_path``: start from this saved adapter
            (e.g. :func:`save_lora_adapter`; needs ``lora_rank > 0``) instead of a fresh one.
    """
    if lora_adapter_path is not None and lora_rank <= 0:
        raise ValueError("lora_adapter_path needs lora_rank > 0 (verl loads an adapter only "
                         f"for a LoRA model), got lora_rank={lora_rank}")
    if compute_dtype not in MIXED_PRECISION:
        raise ValueError(f"compute_dtype must be one of {sorted(MIXED_PRECISION)}, "
                         f"got {compute_dtype!r}")
    register_cpu_platform()
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig

    if engine_cls is None:
        from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead as engine_cls
    model_config = HFModelConfig(
        path=str(model_path), load_tokenizer=False,
        enable_gradient_checkpointing=gradient_checkpointing,
        use_remove_padding=use_remove_padding,
        override_config={"attn_implementation": attn_implementation},
        lora_rank=lora_rank, lora_alpha=lora_alpha,
        lora_adapter_path=None if lora_adapter_path is None else str(lora_adapter_path),
    )
    engine_config = FSDPEngineConfig(
        strategy="fsdp2", use_torch_compile=False, model_dtype="fp32",
        mixed_precision=dict(MIXED_PRECISION[compute_dtype]),
        use_dynamic_bsz=False, micro_batch_size_per_gpu=micro_batch_size,
        use_remove_padding=use_remove_padding,
    )
    optim = FSDPOptimizerConfig(lr=lr, clip_grad=1e9, weight_decay=0.0)
    kwargs = {} if geometry is None else {"geometry": geometry}
    engine = engine_cls(model_config=model_config, engine_config=engine_config,
                        optimizer_config=optim, checkpoint_config=CheckpointConfig(), **kwargs)
    engine.initialize()
    return engine


def make_loss_fn(*, rollout_n: int, loss_agg_mode: str = "token-mean",
                 loss_mode: str = "vanilla", micro_batch_size: int = 2,
                 policy: dict[str, Any] | None = None, **actor: Any) -> Any:
    """``functools.partial(ppo_loss, config=actor_config)`` as verl's actor worker builds it.

    ``policy``: further ``PolicyLossConfig`` fields (``dro_beta``, ``clip_cov_ratio``, ...);
    ``actor``: further ``FSDPActorConfig`` fields (``clip_ratio_high``, ``entropy_coeff``,
    ``use_kl_loss``, ...).
    """
    import functools

    from verl.workers.config import FSDPActorConfig, PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss

    cfg = FSDPActorConfig(
        strategy="fsdp2", rollout_n=rollout_n, ppo_mini_batch_size=rollout_n,
        ppo_micro_batch_size_per_gpu=micro_batch_size, use_dynamic_bsz=False,
        loss_agg_mode=loss_agg_mode,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, **(policy or {})),
        use_torch_compile=False, **actor,
    )
    return functools.partial(ppo_loss, config=cfg)


def grpo_batch(rewards: Any, *, seed: int = 0, prompt_len: int = 5, max_response: int = 7,
               vocab: int = 256, min_response: int = 2, min_prompt: int = 2,
               model_path: str | Path | None = None,
               logp_noise: float = 0.0, uids: Sequence[str] | None = None) -> Any:
    """A GRPO batch as verl's trainer hands it to the actor (after ``left_right_2_no_padding``).

    ``rewards`` ``[P, R]``: prompt ``p`` is shared by its ``R`` rollouts (rows ``p R .. p R + R-1``,
    as verl's ``repeat(interleave=True)`` lays them out); prompts are left-padded to
    ``prompt_len`` (lengths in ``[min_prompt, prompt_len]``), responses right-padded to
    ``max_response`` (lengths in ``[min_response, max_response]``; both minima at their maxima:
    rows of one length, no padding). ``advantages``: verl's GRPO advantages (group
    mean and std, ``epsilon = 1e-6``) on the response tokens; ``token_level_scores``: the reward on
    the last response token (as verl's reward managers write it); ``old_log_probs``: the log-probs
    of the model saved at ``model_path`` (as verl's ``compute_log_prob`` gives them; zeros without
    a path) plus ``logp_noise`` times a standard normal, so that the ratios differ from 1 and the
    losses' clipping is exercised. Non-tensor keys: ``uid`` (group id per row), ``temperature``
    1.0, ``global_batch_size`` and the keys verl's worker injects.
    """
    import numpy as np
    import torch
    from tensordict import NonTensorData, NonTensorStack
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    r = np.asarray(rewards, dtype=np.float64)
    P, R = r.shape
    n = P * R
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(min_prompt, prompt_len + 1, (P,), generator=g).repeat_interleave(R)
    rlen = torch.randint(min_response, max_response + 1, (n,), generator=g)
    prompt_ids = torch.randint(1, vocab, (P, prompt_len), generator=g).repeat_interleave(R, 0)
    resp_ids = torch.randint(1, vocab, (n, max_response), generator=g)
    prompt_mask = (torch.arange(prompt_len)[None, :] >= prompt_len - plen[:, None]).long()
    resp_mask = (torch.arange(max_response)[None, :] < rlen[:, None]).long()
    attention_mask = torch.cat([prompt_mask, resp_mask], dim=1)
    input_ids = torch.cat([prompt_ids * prompt_mask, resp_ids * resp_mask], dim=1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    adv = _grpo_advantages(r).reshape(n, 1).float() * resp_mask
    old = torch.zeros(n, max_response)
    if model_path is not None:
        old = _response_logprobs(model_path, input_ids, attention_mask, position_ids, max_response)
    old = (old + logp_noise * torch.randn(n, max_response, generator=g)) * resp_mask
    scores = torch.zeros(n, max_response)
    scores[torch.arange(n), rlen - 1] = torch.as_tensor(r.reshape(-1), dtype=torch.float32)
    td = tu.get_tensordict({
        "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
        "prompts": prompt_ids * prompt_mask, "responses": resp_ids * resp_mask,
        "response_mask": resp_mask, "old_log_probs": old.float(), "advantages": adv,
        "token_level_scores": scores,
    })
    ids = list(uids) if uids is not None else [f"group{p}" for p in range(P) for _ in range(R)]
    td["uid"] = NonTensorStack.from_list([NonTensorData(u) for u in ids])
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, temperature=1.0, global_batch_size=n, use_dynamic_bsz=False,
                         use_fused_kernels=False)
    return td


def _response_logprobs(model_path: str | Path, ids: Any, am: Any, pos: Any, width: int) -> Any:
    """``log pi(response token | prefix)`` ``[n, width]`` of the saved model (float32, SDPA)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), attn_implementation="sdpa",
                                                 dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    return lp[:, -width:]


def _grpo_advantages(r: Any) -> Any:
    """verl's GRPO outcome advantage per row: ``(r - mean) / (std + 1e-6)`` (``std`` ddof 1)."""
    import torch

    t = torch.as_tensor(r, dtype=torch.float32)
    return (t - t.mean(1, keepdim=True)) / (t.std(1, keepdim=True) + 1e-6)


def rank_slice(td: Any, rank: int, world: int, *, micro_batch_size: int,
               use_remove_padding: bool = True) -> Any:
    """Rank ``rank``'s contiguous ``1/world`` slice of ``td`` with the worker's non-tensor keys."""
    from verl.utils import tensordict_utils as tu

    n = td.batch_size[0]
    if n % world:
        raise ValueError(f"batch of {n} rows does not split over {world} ranks")
    k = n // world
    part = tu.index_select_tensor_dict(td, list(range(rank * k, (rank + 1) * k)))
    tu.assign_non_tensor(part, micro_batch_size_per_gpu=micro_batch_size,
                         use_remove_padding=use_remove_padding)
    return part


def full_grads(engine: Any) -> dict[str, Any]:
    """``{name: full float64 gradient}`` of the engine's module (``DTensor.full_tensor()``)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in engine.module.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        out[name] = g.detach().double().cpu().clone()
    return out


def set_old_log_probs(engine: Any, data: Any) -> None:
    """``data["old_log_probs"]`` from verl's engine at its current weights (``infer_batch``, as
    verl's ``compute_log_prob`` does before the actor update): the first update is on-policy."""
    import torch
    from verl.workers.utils.padding import no_padding_2_padding

    with engine.eval_mode(), torch.no_grad():
        out = engine.infer_batch(data)
    lp = no_padding_2_padding(out["model_output"]["log_probs"], data)
    mask = data["response_mask"]
    data["old_log_probs"] = (lp.float().to(mask.device) * mask).detach()
