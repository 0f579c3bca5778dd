"""grpo_io: the one IO module of the project (bottom layer: stdlib only, numpy/torch recognised
without being imported).

* JSON with **one non-finite policy** (:data:`NONFINITE_POLICY`): strict JSON is written
  (``allow_nan=False``); a NaN float is written as ``null`` (undefined: read back as ``None``, which
  every reader treats as "n/a"); ``+inf`` and ``-inf`` are written as the strings ``"inf"`` and
  ``"-inf"`` (read back as the floats by :func:`read_json`, :func:`read_jsonl` and
  :func:`from_jsonable`), so that e.g. the ``z = inf`` of a failed deterministic check survives a
  round trip and stays distinct from an undefined value.
* :func:`write_json` and :func:`rewrite_jsonl` write atomically (temporary file, then rename;
  :func:`atomic_path` and :func:`save_figure` do the same for writers that take a file name,
  e.g. figures); :func:`append_jsonl` appends one flushed line (streamed results);
  :func:`read_jsonl` and :func:`iter_jsonl` drop a truncated last line (an interrupted append)
  and raise one line naming the file and line on any other bad line; both readers, and
  :func:`read_json`, check each record against a schema when given one (:mod:`grpo_io.records`).
* :func:`prepare_out_dir` and :func:`write_out_file` (:mod:`grpo_io.paths`): every command's
  output path, checked before any work; a problem is one :class:`OutPathError` line naming it.
  :func:`user_cache_dir`: the one rule for the user cache folder (``$GRPO_AUDIT_CACHE``, else
  ``${XDG_CACHE_HOME:-~/.cache}/grpo-audit``).
* :func:`lock_out_dir` (:mod:`grpo_io.locks`): one writer per output folder, an advisory
  ``flock`` on ``DIR/.lock`` held for the whole run; a second writer gets one
  :class:`FolderInUseError` line naming the folder and the holder (pid, host, start, command).
* :mod:`grpo_io.options`: a command's options from its config dataclass (:func:`option` fields:
  help, bounds, choices, path kinds), one check (:func:`validate`) for the command line and for
  Python configs, :func:`check_path` for every path a command reads or writes.
* :func:`environment`: Python, platform and library versions and the device, recorded with every
  run (the seed is the caller's to record).
"""

from .env import environment, package_version
from .jsonio import (
    NONFINITE_POLICY,
    append_jsonl,
    atomic_path,
    atomic_write_bytes,
    atomic_write_text,
    dumps,
    from_jsonable,
    iter_jsonl,
    read_json,
    read_jsonl,
    read_text_file,
    rewrite_jsonl,
    save_figure,
    to_jsonable,
    write_json,
)
from .locks import LOCK_NAME, FolderInUseError, lock_holder, lock_out_dir, locks_out_dir
from .options import OptionError, OptionTypeError, check_path, option, validate
from .paths import OutPathError, prepare_out_dir, user_cache_dir, write_out_file

__all__ = [
    "LOCK_NAME",
    "NONFINITE_POLICY",
    "FolderInUseError",
    "OptionError",
    "OptionTypeError",
    "OutPathError",
    "append_jsonl",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_path",
    "dumps",
    "environment",
    "from_jsonable",
    "iter_jsonl",
    "lock_holder",
    "lock_out_dir",
    "locks_out_dir",
    "option",
    "package_version",
    "prepare_out_dir",
    "read_json",
    "read_jsonl",
    "read_text_file",
    "rewrite_jsonl",
    "save_figure",
    "to_jsonable",
    "user_cache_dir",
    "validate",
    "write_json",
    "write_out_file",
]
