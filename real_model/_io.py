"""Output helpers shared by the real-model experiments: JSON(L) writing, resume, environment."""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["jsonable", "write_json", "append_jsonl", "read_jsonl", "environment", "check_config"]


def jsonable(x: Any) -> Any:
    """Recursively convert numpy/torch scalars and arrays to JSON types; NaN/inf -> ``None``."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        v = float(x)
        return v if math.isfinite(v) else None
    return x


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented strict JSON (atomically: temp file then rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(jsonable(obj), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    """Append one record as a JSON line and flush it to disk (streamed results)."""
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(jsonable(record), allow_nan=False) + "\n")
        fh.flush()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a truncated last line (interrupted write) is dropped."""
    if not path.is_file():
        return []
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {n + 1} is not valid JSON") from None
    return out


def rewrite_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Rewrite ``path`` with ``records`` (used to drop a truncated tail before resuming)."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(jsonable(r), allow_nan=False) + "\n")
    tmp.replace(path)


def environment(device: str | None = None) -> dict[str, Any]:
    """Library versions, platform and device description (recorded with every experiment)."""
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        env["transformers"] = None
    try:
        from grpo_theory import __version__

        env["grpo_audit"] = __version__
    except ImportError:  # pragma: no cover
        pass
    if device is not None:
        env["device"] = device
        if device.startswith("cuda") and torch.cuda.is_available():
            env["device_name"] = torch.cuda.get_device_name(torch.device(device))
        else:
            env["device_name"] = platform.processor() or platform.machine()
    return env


def check_config(path: Path, config: Mapping[str, Any]) -> None:
    """Write ``config`` to ``path``, or check that it equals the one already there (resume)."""
    cfg = jsonable(config)
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"{path} is not valid JSON ({exc}); delete it or pass --overwrite"
            ) from None
        if not isinstance(old, dict):
            raise ValueError(f"{path} must hold a JSON object; delete it or pass --overwrite")
        if old != cfg:
            diff = sorted(k for k in set(old) | set(cfg) if old.get(k) != cfg.get(k))
            raise ValueError(
                f"{path.parent} holds a run with a different configuration (differs in {diff}); "
                "use a new --out directory or pass --overwrite"
            )
        return
    write_json(path, cfg)
