"""Run TRL's, verl's and OpenRLHF's OWN advantage and loss code, from their source files.

Nothing here re-implements a framework. Each loader reads the framework's source (the installed
package, an unpacked tree, a single file, or a ``.whl``), takes the functions (or, for TRL, the
block of ``GRPOTrainer._generate_and_score_completions`` that turns rewards into advantages) out
of it with :mod:`ast`, and executes them with the heavy imports (ray, omegaconf, deepspeed,
accelerate, transformers) replaced by small stubs. The stubs only stand in for configuration
objects and logging; every arithmetic line that touches rewards, advantages or losses is the
framework's own.

Every adapter speaks one layout: ``rewards [P, R]`` (NaN allowed where the framework accepts it),
``lengths [P, R]`` completion token counts, and returns per-sequence values ``[P, R]``: the
advantage on the completion's tokens (NaN for an empty completion, which has none), or the
per-sequence gradient weight ``w_i`` of a loss at the on-policy point (ratio 1), read off
``d loss / d logp_it = -w_i A_i`` by autograd.

Versions read: TRL 1.16.0 (``trl/trainer/grpo_trainer.py``, ``rloo_trainer.py``, ``utils.py``),
verl 0.9.1 (``verl/trainer/ppo/core_algos.py``, ``verl/utils/torch_functional.py``), OpenRLHF
0.11.2 (``openrlhf/trainer/ppo_utils/experience_maker.py``, ``openrlhf/models/loss.py``,
``openrlhf/models/utils.py``). Other versions load if the same names exist; the anchors are
checked and a clear error names what is missing.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import math
import sys
import textwrap
import types
import zipfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FRAMEWORKS",
    "FrameworkCode",
    "SourceTree",
    "find_source",
    "load_framework",
    "FrameworkCodeError",
]

FRAMEWORKS = ("trl", "verl", "openrlhf")

_FILES = {
    "trl": ("trl/trainer/grpo_trainer.py", "trl/trainer/rloo_trainer.py", "trl/trainer/utils.py"),
    "verl": ("verl/trainer/ppo/core_algos.py", "verl/utils/torch_functional.py"),
    "openrlhf": (
        "openrlhf/trainer/ppo_utils/experience_maker.py",
        "openrlhf/models/loss.py",
        "openrlhf/models/utils.py",
    ),
}
_DIST = {"trl": "trl", "verl": "verl", "openrlhf": "openrlhf"}


class FrameworkCodeError(RuntimeError):
    """The framework's source could not be found or does not have the expected functions."""


# --- finding and reading source -----------------------------------------------------------------
@dataclass
class SourceTree:
    """The framework files we need, read as text, and where they came from."""

    framework: str
    files: dict[str, str]
    origin: str
    version: str
    commit: str | None = None

    def text(self, rel: str) -> str:
        try:
            return self.files[rel]
        except KeyError:
            raise FrameworkCodeError(
                f"{self.framework}: {rel} not found in {self.origin}"
            ) from None


def _from_wheel(framework: str, path: Path) -> SourceTree:
    files: dict[str, str] = {}
    version = "unknown"
    commit = None
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        for rel in _FILES[framework]:
            hits = [n for n in names if n == rel or n.endswith("/" + rel)]
            if hits:
                files[rel] = zf.read(hits[0]).decode("utf-8")
        for n in names:
            if n.endswith(".dist-info/METADATA"):
                for line in zf.read(n).decode("utf-8", "replace").splitlines():
                    if line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
                        break
            if n.endswith("git_version") or n.endswith("/git_commit"):
                commit = zf.read(n).decode("utf-8", "replace").strip() or None
    return SourceTree(framework, files, str(path), version, commit)


def _from_dir(framework: str, root: Path, version: str | None = None) -> SourceTree:
    files = {}
    for rel in _FILES[framework]:
        p = root / rel
        if p.is_file():
            files[rel] = p.read_text(encoding="utf-8")
    if version is None:
        version = "unknown"
        for meta in root.glob(f"{_DIST[framework]}-*.dist-info/METADATA"):
            for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
                    break
        vf = root / framework / "version" / "version"
        if version == "unknown" and vf.is_file():
            version = vf.read_text().strip()
    return SourceTree(framework, files, str(root), version)


def find_source(framework: str, source: str | Path | None = None) -> SourceTree:
    """Locate and read a framework's files.

    Args:
        framework: ``"trl"``, ``"verl"`` or ``"openrlhf"``.
        source: ``None`` (the installed package, found without importing it), a ``.whl`` file, a
            directory holding the package (an unpacked wheel or a checkout), or one of the
            framework's files (its package root is derived from the file's path).

    Raises:
        FrameworkCodeError: not installed / not found, naming what was looked for.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    if source is None:
        spec = importlib.util.find_spec(framework)
        if spec is None or not spec.submodule_search_locations:
            raise FrameworkCodeError(
                f"{framework} is not importable here; pass --source (a wheel, a directory or "
                f"{_FILES[framework][0]})"
            )
        root = Path(next(iter(spec.submodule_search_locations))).parent
        try:
            version = importlib.metadata.version(_DIST[framework])
        except importlib.metadata.PackageNotFoundError:
            version = None
        return _from_dir(framework, root, version)
    path = Path(source)
    if not path.exists():
        raise FrameworkCodeError(f"{framework}: source {path} does not exist")
    if path.suffix == ".whl":
        tree = _from_wheel(framework, path)
    elif path.is_dir():
        tree = _from_dir(framework, path)
        if not tree.files and (path / "purelib").is_dir():
            tree = _from_dir(framework, path / "purelib")
    else:
        rel = next((r for r in _FILES[framework] if str(path).endswith(r)), None)
        if rel is None:
            raise FrameworkCodeError(
                f"{framework}: {path} is not one of {_FILES[framework]}, a directory or a wheel"
            )
        tree = _from_dir(framework, Path(str(path)[: -len(rel)] or "."))
    if _FILES[framework][0] not in tree.files:
        raise FrameworkCodeError(f"{framework}: {_FILES[framework][0]} not found in {path}")
    return tree


# --- executing pieces of source -------------------------------------------------------------------
def _defs(source: str, names: list[str], *, cls: str | None = None) -> dict[str, ast.AST]:
    tree = ast.parse(source)
    body = tree.body
    if cls is not None:
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None:
            raise FrameworkCodeError(f"class {cls} not found")
        body = node.body
    found = {n.name: n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    missing = [n for n in names if n not in found]
    if missing:
        where = f"class {cls}" if cls else "module"
        raise FrameworkCodeError(f"{missing} not found in the {where}")
    return {n: found[n] for n in names}


def _exec_defs(
    source: str, names: list[str], namespace: dict[str, Any], *, cls: str | None = None
) -> dict[str, Callable[..., Any]]:
    """Execute the named functions (their own source, decorators applied) in ``namespace``."""
    out = {}
    for name, node in _defs(source, names, cls=cls).items():
        seg = ast.get_source_segment(source, node)
        assert seg is not None
        code = textwrap.dedent(seg) if cls is None else textwrap.dedent("    " + seg)
        exec(compile(code, f"<{name}>", "exec"), namespace)  # noqa: S102
        fn = namespace[name]
        for dec in reversed(node.decorator_list):
            text = ast.get_source_segment(source, dec) or ""
            if text in ("staticmethod", "classmethod") or text.startswith("register_"):
                continue
            try:
                fn = eval(text, namespace)(fn)  # noqa: S307
            except NameError as exc:
                raise FrameworkCodeError(
                    f"{name}: decorator @{text} is not available ({exc})"
                ) from exc
        namespace[name] = fn
        out[name] = fn
    return out


def _block(source: str, start: str, end: str) -> str:
    i = source.find(start)
    j = source.find(end, i)
    if i < 0 or j < 0:
        raise FrameworkCodeError(f"anchor {start!r} ... {end!r} not found")
    line0 = source.rfind("\n", 0, i) + 1
    return textwrap.dedent(source[line0 : j + len(end)])


@contextmanager
def _stub_modules(mods: dict[str, types.ModuleType]) -> Iterator[None]:
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


class _Cfg(dict):
    """Attribute- and ``.get``-access config stub (omegaconf/dataclass configs)."""

    def __getattr__(self, k: str) -> Any:
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k) from None


def _ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


# --- the common adapter ---------------------------------------------------------------------------
@dataclass
class FrameworkCode:
    """A framework's advantage settings and loss modes, each runnable on our layout."""

    framework: str
    version: str
    origin: str
    commit: str | None
    dtype: str
    advantages: dict[str, Callable[..., np.ndarray]] = field(default_factory=dict)
    losses: dict[str, Callable[..., np.ndarray]] = field(default_factory=dict)
    extras: dict[str, Callable[..., Any]] = field(default_factory=dict)
    """Framework functions with inputs beyond rewards (verl: ``remax(rewards, lengths, greedy)``,
    ``optimal_token_baseline`` and ``grpo_outcome`` as verl defines them)."""


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[name]


def _masks(lengths: np.ndarray, width: int | None = None) -> Any:
    import torch

    L = np.asarray(lengths, dtype=np.int64).reshape(-1)
    T = max(int(L.max()) if L.size else 0, 1) if width is None else width
    return (torch.arange(T)[None, :] < torch.as_tensor(L)[:, None]).float()


def _per_seq(adv_tokens: Any, lengths: np.ndarray) -> np.ndarray:
    """First-token advantage of each completion (NaN when it has no token)."""
    a = adv_tokens.detach().double().cpu().numpy()
    L = np.asarray(lengths).reshape(-1)
    out = np.where(L > 0, a[:, 0], np.nan)
    return out.reshape(np.asarray(lengths).shape)


def _loss_weights(
    loss_fn: Callable[[Any, Any, Any], Any], lengths: np.ndarray, advantages: np.ndarray, width: int
) -> np.ndarray:
    """``w_i`` from autograd: ``d loss / d logp_it = -w_i A_i`` (checked equal over tokens)."""
    import torch

    P, R = lengths.shape
    mask = _masks(lengths, width).double()
    A = torch.as_tensor(advantages.reshape(-1), dtype=torch.float64)
    logp = torch.full(mask.shape, -1.0, dtype=torch.float64, requires_grad=True)
    loss = loss_fn(logp, mask, A)
    (g,) = torch.autograd.grad(loss, logp, allow_unused=True)
    g = torch.zeros_like(logp) if g is None else g
    g = g.detach().numpy()
    L = lengths.reshape(-1)
    w = np.zeros(P * R)
    for i in range(P * R):
        if L[i] > 0:
            col = -g[i, : L[i]] / float(A[i])
            if not np.allclose(col, col[0], rtol=1e-9, atol=1e-15):
                raise FrameworkCodeError("the loss gradient is not uniform along a completion")
            w[i] = col[0]
    return w.reshape(P, R)


# --- TRL ------------------------------------------------------------------------------------------
def _load_trl(tree: SourceTree, dtype: str) -> FrameworkCode:
    import torch

    g_src = tree.text("trl/trainer/grpo_trainer.py")
    r_src = tree.text("trl/trainer/rloo_trainer.py")
    u_src = tree.text("trl/trainer/utils.py")
    ns: dict[str, Any] = {"torch": torch, "math": math}
    _exec_defs(u_src, ["nanstd", "nanmin", "nanmax"], ns)
    start = "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)"
    end = "advantages = torch.nan_to_num(advantages, nan=0.0)"
    grpo_block = compile(_block(g_src, start, end), "<trl grpo advantages>", "exec")
    rloo_block = compile(_block(r_src, start, end), "<trl rloo advantages>", "exec")
    td = _torch_dtype(dtype)

    def grpo_adv(
        rewards: np.ndarray,
        lengths: np.ndarray,
        *,
        scale_rewards: str = "group",
        multi_objective_aggregation: str = "sum_then_normalize",
    ) -> np.ndarray:
        r = np.asarray(rewards, dtype=np.float64)
        per_func = r[..., None] if r.ndim == 2 else r
        P, R, K = per_func.shape
        self = _ns(
            multi_objective_aggregation=multi_objective_aggregation,
            scale_rewards=scale_rewards,
            reward_weights=torch.ones(K, dtype=torch.float32),
            reward_funcs=[None] * K,
        )
        env = dict(ns, self=self, num_generations=R, device="cpu")
        env["rewards_per_func"] = torch.as_tensor(per_func.reshape(P * R, K), dtype=td)
        exec(grpo_block, env)  # noqa: S102
        return env["advantages"].double().numpy().reshape(P, R)

    def rloo_adv(
        rewards: np.ndarray, lengths: np.ndarray, *, normalize_advantages: bool = False
    ) -> np.ndarray:
        r = np.asarray(rewards, dtype=np.float64)
        P, R = r.shape
        self = _ns(
            reward_weights=torch.ones(1, dtype=torch.float32),
            reward_clip_range=None,
            beta=0.0,
            normalize_advantages=normalize_advantages,
        )
        env = dict(ns, self=self, num_generations=R, device="cpu")
        env["rewards_per_func"] = torch.as_tensor(r.reshape(P * R, 1), dtype=td)
        exec(rloo_block, env)  # noqa: S102
        return env["advantages"].double().numpy().reshape(P, R)

    # losses: GRPOTrainer._compute_loss and RLOOTrainer._compute_loss on a stub trainer
    gl = _exec_defs(
        g_src,
        ["_compute_loss", "get_gamma_weights", "get_high_entropy_mask", "get_off_policy_mask"],
        dict(ns),
        cls="GRPOTrainer",
    )
    rl = _exec_defs(r_src, ["_compute_loss"], dict(ns), cls="RLOOTrainer")

    class _Acc:
        num_processes = 1
        sync_gradients = True

        def gather(self, x: Any) -> Any:
            return x

        gather_for_metrics = gather

        def reduce(self, x: Any, reduction: str = "sum") -> Any:
            return x

    def _stub(logp: Any, **attrs: Any) -> Any:
        s = types.SimpleNamespace()
        s.__dict__.update(
            top_entropy_quantile=1.0,
            off_policy_mask_threshold=None,
            importance_sampling_level="token",
            beta=0.0,
            epsilon_low=0.2,
            epsilon_high=0.2,
            use_vllm=False,
            vllm_importance_sampling_correction=False,
            model=_ns(training=True),
            current_gradient_accumulation_steps=1,
            accelerator=_Acc(),
            _entropy_bonus_enabled=False,
            aux_loss_enabled=False,
            _metrics=defaultdict(lambda: defaultdict(list)),
            max_completion_length=logp.shape[1],
            get_gamma_weights=gl["get_gamma_weights"],
            args=_ns(
                delta=None,
                sapo_temperature_pos=1.0,
                sapo_temperature_neg=1.05,
                vespo_k_pos=2.0,
                vespo_lambda_pos=3.0,
                vespo_k_neg=3.0,
                vespo_lambda_neg=2.0,
                use_bias_correction_kl=False,
                steps_per_generation=1,
            ),
        )
        s.__dict__.update(attrs)
        s._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
        s.get_high_entropy_mask = types.MethodType(gl["get_high_entropy_mask"], s)
        s.get_off_policy_mask = gl["get_off_policy_mask"]
        return s

    def _loss_inputs(logp: Any, mask: Any, A: Any, **extra: Any) -> dict[str, Any]:
        """The batch dict TRL's ``_compute_loss`` reads: dummy one-token prompts, the completion
        mask and advantages, plus ``extra`` entries."""
        B, T = logp.shape
        return {
            "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
            "prompt_mask": torch.ones(B, 1, dtype=torch.long),
            "completion_ids": torch.zeros(B, T, dtype=torch.long),
            "completion_mask": mask,
            "advantages": A,
            **extra,
        }

    def grpo_loss(
        lengths: np.ndarray,
        advantages: np.ndarray,
        *,
        loss_type: str = "dapo",
        importance_sampling_level: str = "token",
        epsilon_high: float | None = None,
        max_completion_length: int | None = None,
    ) -> np.ndarray:
        width = max(int(lengths.max()), 1)
        if max_completion_length is not None:
            width = max(width, max_completion_length)

        def f(logp: Any, mask: Any, A: Any) -> Any:
            eh = 0.2 if epsilon_high is None else epsilon_high
            s = _stub(
                logp,
                loss_type=loss_type,
                importance_sampling_level=importance_sampling_level,
                epsilon_high=eh,
                max_completion_length=max_completion_length or logp.shape[1],
            )
            inputs = _loss_inputs(logp, mask, A, num_items_in_batch=mask.sum())
            return gl["_compute_loss"](s, None, inputs)

        return _loss_weights(f, lengths, advantages, width)

    def rloo_loss(lengths: np.ndarray, advantages: np.ndarray) -> np.ndarray:
        width = max(int(lengths.max()), 1)

        def f(logp: Any, mask: Any, A: Any) -> Any:
            s = _stub(logp)
            inputs = _loss_inputs(logp, mask, A, old_logps=(logp.detach() * mask).sum(1))
            return rl["_compute_loss"](s, None, inputs)

        return _loss_weights(f, lengths, advantages, width)

    fc = FrameworkCode("trl", tree.version, tree.origin, tree.commit, dtype)
    for sr in ("group", "batch", "none"):
        fc.advantages[f'GRPOConfig(scale_rewards="{sr}")'] = lambda r, L, sr=sr: grpo_adv(
            r, L, scale_rewards=sr
        )
    fc.advantages['GRPOConfig(multi_objective_aggregation="normalize_then_sum")'] = lambda r, L: (
        grpo_adv(r, L, multi_objective_aggregation="normalize_then_sum")
    )
    fc.advantages["RLOOConfig()"] = lambda r, L: rloo_adv(r, L)
    fc.advantages["RLOOConfig(normalize_advantages=True)"] = lambda r, L: rloo_adv(
        r, L, normalize_advantages=True
    )
    for lt in ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo"):
        fc.losses[f'GRPOConfig(loss_type="{lt}")'] = lambda L, A, lt=lt, **kw: grpo_loss(
            L, A, loss_type=lt, **kw
        )
    fc.losses['GRPOConfig(loss_type="cispo", epsilon_high=5.0)'] = lambda L, A, **kw: grpo_loss(
        L, A, loss_type="cispo", epsilon_high=5.0, **kw
    )
    fc.losses['GRPOConfig(loss_type="luspo", importance_sampling_level="sequence")'] = (
        lambda L, A, **kw: grpo_loss(
            L, A, loss_type="luspo", importance_sampling_level="sequence", **kw
        )
    )
    fc.losses['GRPOConfig(loss_type="grpo", importance_sampling_level="sequence") (GSPO)'] = (
        lambda L, A, **kw: grpo_loss(
            L, A, loss_type="grpo", importance_sampling_level="sequence", **kw
        )
    )
    fc.losses["RLOOTrainer loss"] = lambda L, A, **kw: rloo_loss(L, A)
    return fc


# --- verl -----------------------------------------------------------------------------------------
def _load_verl(tree: SourceTree, dtype: str) -> FrameworkCode:
    import torch

    core = tree.text("verl/trainer/ppo/core_algos.py")
    tf_src = tree.text("verl/utils/torch_functional.py")
    tf = types.ModuleType("verl.utils.torch_functional")
    tf.__dict__["torch"] = torch
    _exec_defs(tf_src, ["masked_sum", "masked_mean", "masked_var", "masked_whiten"], tf.__dict__)

    def _absent(*a: Any, **k: Any) -> Any:
        raise FrameworkCodeError("stubbed verl helper called (vectorized estimators not run)")

    mods = {
        "omegaconf": types.ModuleType("omegaconf"),
        "verl": types.ModuleType("verl"),
        "verl.utils": types.ModuleType("verl.utils"),
        "verl.utils.torch_functional": tf,
        "verl.utils.import_utils": types.ModuleType("verl.utils.import_utils"),
        "verl.trainer": types.ModuleType("verl.trainer"),
        "verl.trainer.config": types.ModuleType("verl.trainer.config"),
        "verl.workers": types.ModuleType("verl.workers"),
        "verl.workers.config": types.ModuleType("verl.workers.config"),
    }
    mods["omegaconf"].DictConfig = _Cfg  # type: ignore[attr-defined]
    mods["verl"].utils = mods["verl.utils"]  # type: ignore[attr-defined]
    mods["verl.utils"].torch_functional = tf  # type: ignore[attr-defined]
    mods["verl.utils"].as_torch_index = _absent  # type: ignore[attr-defined]
    mods["verl.utils"].group_mean_std = _absent  # type: ignore[attr-defined]
    mods["verl.utils.import_utils"].deprecated = (  # type: ignore[attr-defined]
        lambda *a, **k: lambda f: f
    )

    class AlgoConfig(_Cfg):
        pass

    class ActorConfig(_Cfg):
        pass

    mods["verl.trainer.config"].AlgoConfig = AlgoConfig  # type: ignore[attr-defined]
    mods["verl.workers.config"].ActorConfig = ActorConfig  # type: ignore[attr-defined]
    mod = types.ModuleType("verl_core_algos_from_source")
    mod.__file__ = tree.origin
    with _stub_modules(mods):
        exec(compile(core, "verl/trainer/ppo/core_algos.py", "exec"), mod.__dict__)  # noqa: S102
    C = mod.__dict__
    td = _torch_dtype(dtype)

    def _layout(rewards: np.ndarray, lengths: np.ndarray) -> tuple[Any, Any, np.ndarray]:
        r = np.asarray(rewards, dtype=np.float64)
        P, R = r.shape
        L = np.asarray(lengths).reshape(-1)
        T = max(int(L.max()), 1)
        mask = _masks(L, T).to(td)
        tok = torch.zeros(P * R, T, dtype=td)
        # verl's reward managers write the score at index valid_response_length - 1
        # (so an empty completion's score lands on the last, masked, position)
        for i, li in enumerate(L):
            tok[i, int(li) - 1] = float(r.reshape(-1)[i])
        return tok, mask, np.repeat(np.arange(P), R)

    def adv(fn: str, **kw: Any) -> Callable[..., np.ndarray]:
        def run(rewards: np.ndarray, lengths: np.ndarray) -> np.ndarray:
            tok, mask, index = _layout(rewards, lengths)
            out = C[fn](token_level_rewards=tok, response_mask=mask, index=index, **kw)
            return _per_seq(out[0], lengths)

        return run

    def remax(rewards: np.ndarray, lengths: np.ndarray, greedy: np.ndarray) -> np.ndarray:
        tok, mask, _ = _layout(rewards, lengths)
        b = torch.as_tensor(np.asarray(greedy, dtype=np.float64).reshape(-1), dtype=td)
        out = C["compute_remax_outcome_advantage"](
            token_level_rewards=tok, reward_baselines=b, response_mask=mask
        )
        return _per_seq(out[0], lengths)

    fc = FrameworkCode("verl", tree.version, tree.origin, tree.commit, dtype)
    A = fc.advantages
    A["algorithm.adv_estimator=grpo"] = adv("compute_grpo_outcome_advantage")
    A["algorithm.adv_estimator=grpo, norm_adv_by_std_in_grpo=False"] = adv(
        "compute_grpo_outcome_advantage", norm_adv_by_std_in_grpo=False
    )
    A["algorithm.adv_estimator=rloo"] = adv("compute_rloo_outcome_advantage")
    A["algorithm.adv_estimator=reinforce_plus_plus"] = adv(
        "compute_reinforce_plus_plus_outcome_advantage", config=AlgoConfig(gamma=1.0)
    )
    A["algorithm.adv_estimator=reinforce_plus_plus_baseline"] = adv(
        "compute_reinforce_plus_plus_baseline_outcome_advantage", config=AlgoConfig()
    )
    A["algorithm.adv_estimator=opo"] = adv("compute_opo_outcome_advantage")
    A["algorithm.adv_estimator=gpg"] = adv("compute_gpg_outcome_advantage")
    A["algorithm.adv_estimator=grpo_passk"] = adv(
        "compute_grpo_passk_outcome_advantage", config=AlgoConfig(norm_adv_by_std_in_grpo=True)
    )
    A["algorithm.adv_estimator=gdpo (one reward key)"] = adv("compute_gdpo_outcome_advantage")
    fc.extras["remax"] = remax
    fc.extras["optimal_token_baseline"] = C["compute_optimal_token_baseline_advantage"]
    fc.extras["grpo_outcome"] = C["compute_grpo_outcome_advantage"]
    fc.extras["agg_loss"] = C["agg_loss"]

    def loss(mode: str, policy: str = "vanilla", **cfg: Any) -> Callable[..., np.ndarray]:
        def run(
            lengths: np.ndarray, advantages: np.ndarray, *, width: int | None = None
        ) -> np.ndarray:
            T = width or max(int(lengths.max()), 1)

            def f(logp: Any, mask: Any, Aseq: Any) -> Any:
                conf = ActorConfig(
                    clip_ratio=0.2,
                    clip_ratio_low=None,
                    clip_ratio_high=None,
                    clip_ratio_c=3.0,
                    tau_pos=1.0,
                    tau_neg=1.05,
                    global_batch_info={},
                    **cfg,
                )
                adv_tok = Aseq[:, None] * mask
                fn = C["get_policy_loss_fn"](policy)
                out = fn(
                    old_log_prob=logp.detach(),
                    log_prob=logp,
                    advantages=adv_tok,
                    response_mask=mask,
                    loss_agg_mode=mode,
                    config=conf,
                )
                return out[0]

            return _loss_weights(f, lengths, advantages, T)

        return run

    for m in ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum"):
        fc.losses[f"actor.loss_agg_mode={m}"] = loss(m)
    fc.losses["actor.loss_agg_mode=seq-mean-token-sum-norm"] = loss("seq-mean-token-sum-norm")
    fc.losses["policy_loss=gspo, token-mean"] = loss("token-mean", "gspo")
    fc.losses["policy_loss=gspo, seq-mean-token-mean"] = loss("seq-mean-token-mean", "gspo")
    fc.losses["policy_loss=sapo (any loss_agg_mode)"] = loss("token-mean", "sapo")
    fc.losses["policy_loss=cispo, token-mean"] = loss("token-mean", "cispo")
    return fc


# --- OpenRLHF -------------------------------------------------------------------------------------
def _load_openrlhf(tree: SourceTree, dtype: str) -> FrameworkCode:
    import itertools

    import torch

    em = tree.text("openrlhf/trainer/ppo_utils/experience_maker.py")
    ls = tree.text("openrlhf/models/loss.py")
    us = tree.text("openrlhf/models/utils.py")
    ns: dict[str, Any] = {"torch": torch, "itertools": itertools, "List": list, "Tuple": tuple}
    ns["Optional"], ns["Union"] = Any, Any
    _exec_defs(us, ["compute_reward", "masked_mean"], ns)
    ns["apply_length_penalties"] = lambda experiences, args: None  # length penalties off
    ns["logger"] = _ns(warning=lambda *a, **k: None, info=lambda *a, **k: None)
    meth = _exec_defs(
        em,
        ["compute_advantages_and_returns", "get_cumulative_returns"],
        ns,
        cls="RemoteExperienceMaker",
    )
    lmod = types.ModuleType("openrlhf.models.loss")
    lmod.__dict__["__package__"] = "openrlhf.models"
    umod = types.ModuleType("openrlhf.models.utils")
    umod.masked_mean = ns["masked_mean"]  # type: ignore[attr-defined]
    pkg = types.ModuleType("openrlhf")
    pkg.__path__ = []  # type: ignore[attr-defined]
    sub = types.ModuleType("openrlhf.models")
    sub.__path__ = []  # type: ignore[attr-defined]
    with _stub_modules({"openrlhf": pkg, "openrlhf.models": sub, "openrlhf.models.utils": umod}):
        exec(compile(ls, "openrlhf/models/loss.py", "exec"), lmod.__dict__)  # noqa: S102
    td = _torch_dtype(dtype)

    def adv(estimator: str) -> Callable[..., np.ndarray]:
        def run(rewards: np.ndarray, lengths: np.ndarray) -> np.ndarray:
            r = np.asarray(rewards, dtype=np.float64)
            P, R = r.shape
            L = np.asarray(lengths).reshape(-1)
            T = max(int(L.max()), 1)
            mask = _masks(L, T).bool()
            args = _ns(
                algo=_ns(
                    advantage=_ns(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False)
                ),
                rollout=_ns(n_samples_per_prompt=R),
                reward=_ns(clip_range=None),
            )
            self = _ns(
                strategy=_ns(args=args), advantage_estimator=estimator, kl_ctl=_ns(value=0.0)
            )
            self.get_cumulative_returns = types.MethodType(meth["get_cumulative_returns"], self)
            exp = _ns(
                rewards=torch.as_tensor(r.reshape(-1), dtype=td),
                index=list(range(P * R)),
                action_mask=mask,
                kl=torch.zeros(P * R, T, dtype=td),
                info={},
                values=None,
            )
            out = meth["compute_advantages_and_returns"](self, [exp])
            return _per_seq(out[0].advantages, lengths)

        return run

    fc = FrameworkCode("openrlhf", tree.version, tree.origin, tree.commit, dtype)
    for est in ("group_norm", "dr_grpo", "rloo", "reinforce_baseline", "flash_reinforce"):
        fc.advantages[f"--algo.advantage.estimator {est}"] = adv(est)
    PolicyLoss = lmod.PolicyLoss

    def loss(**kw: Any) -> Callable[..., np.ndarray]:
        def run(lengths: np.ndarray, advantages: np.ndarray, **_: Any) -> np.ndarray:
            pl = PolicyLoss(**kw)

            def f(logp: Any, mask: Any, A: Any) -> Any:
                return pl(logp, logp.detach(), A[:, None] * mask, action_mask=mask)[0]

            return _loss_weights(f, lengths, advantages, max(int(lengths.max()), 1))

        return run

    fc.losses["token_level_loss=True (PolicyLoss default)"] = loss()
    fc.losses["token_level_loss=False"] = loss(token_level_loss=False)
    fc.losses['policy_loss_type="gspo"'] = loss(policy_loss_type="gspo")
    return fc


def load_framework(
    framework: str, source: str | Path | None = None, *, dtype: str = "float32"
) -> FrameworkCode:
    """Load ``framework``'s advantage and loss code (see the module docstring).

    Args:
        framework: ``"trl"``, ``"verl"`` or ``"openrlhf"``.
        source: see :func:`find_source`.
        dtype: dtype the rewards are given to the framework in; default ``"float32"`` (what all
            three use in training: TRL's reward tensor, verl's ``token_level_rewards``, OpenRLHF's
            ``promote_types(rewards, float32)``).

    Raises:
        FrameworkCodeError: not found, or the code does not have the expected functions.
    """
    tree = find_source(framework, source)
    try:
        return {"trl": _load_trl, "verl": _load_verl, "openrlhf": _load_openrlhf}[framework](
            tree, dtype
        )
    except (
        FrameworkCodeError,
        ImportError,
        SyntaxError,
        NameError,
        AttributeError,
        KeyError,
    ) as exc:  # a release whose code does not have the expected shape
        raise FrameworkCodeError(
            f"{framework} {tree.version} ({tree.origin}): cannot load its code: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
