"""Finding and reading a framework's source files: the installed package, a tree, a file, a wheel.

Nothing is imported: the files the checks need (:data:`FILES`) are read as text, with the
version (and the git commit where the wheel records one) of where they came from. This module
is cheap to import (the command line reads :data:`FRAMEWORKS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpo_io.jsonio import decode_utf8

__all__ = ["FRAMEWORKS", "FILES", "FrameworkCodeError", "SourceTree", "find_source"]

FRAMEWORKS = ("trl", "verl", "openrlhf")

#: The files each framework's checks read (the first is the anchor a source must have): the
#: advantage and loss code, then where the KL options live (:mod:`framework_checks.kl_audit`).
FILES: dict[str, tuple[str, ...]] = {
    "trl": ("trl/trainer/grpo_trainer.py", "trl/trainer/rloo_trainer.py", "trl/trainer/utils.py",
            "trl/trainer/grpo_config.py"),
    "verl": ("verl/trainer/ppo/core_algos.py", "verl/utils/torch_functional.py",
             "verl/trainer/ppo/metric_utils.py", "verl/workers/utils/losses.py",
             "verl/trainer/ppo/ray_trainer.py", "verl/workers/config/actor.py",
             "verl/trainer/config/algorithm.py"),
    "openrlhf": (
        "openrlhf/trainer/ppo_utils/experience_maker.py",
        "openrlhf/models/loss.py",
        "openrlhf/models/utils.py",
        "openrlhf/trainer/ray/ppo_actor.py",
        "openrlhf/cli/train_ppo_ray.py",
    ),
}
#: The distribution name whose metadata gives each framework's version.
DISTRIBUTIONS = {"trl": "trl", "verl": "verl", "openrlhf": "openrlhf"}


class FrameworkCodeError(RuntimeError):
    """The framework's source could not be found or does not have the expected functions."""


@dataclass
class SourceTree:
    """The framework files we need, read as text, and where they came from."""

    framework: str
    files: dict[str, str]
    origin: str
    version: str
    commit: str | None = None

    def text(self, rel: str) -> str:
        """The text of ``rel`` (one of :data:`FILES`), or an error naming where it was missing."""
        try:
            return self.files[rel]
        except KeyError:
            raise FrameworkCodeError(
                f"{self.framework}: {rel} not found in {self.origin}"
            ) from None


def _text(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text; other bytes are one error naming ``where`` and the line."""
    try:
        return decode_utf8(data, where=where)
    except ValueError as exc:
        raise FrameworkCodeError(
            f"{exc}; not a Python source file of the framework, or damaged"
        ) from None


def _from_wheel(framework: str, path: Path) -> SourceTree:
    import zipfile

    files: dict[str, str] = {}
    version = "unknown"
    commit = None
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            for rel in FILES[framework]:
                hits = [n for n in names if n == rel or n.endswith("/" + rel)]
                if hits:
                    files[rel] = _text(zf.read(hits[0]), f"{path}!{hits[0]}")
            for n in names:
                if n.endswith(".dist-info/METADATA"):
                    version = _metadata_version(zf.read(n).decode("utf-8", "replace")) or version
                if n.endswith("git_version") or n.endswith("/git_commit"):
                    commit = zf.read(n).decode("utf-8", "replace").strip() or None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise FrameworkCodeError(
            f"{framework}: {path} is not a readable wheel (a .whl is a zip archive: {exc}); "
            "download it again, e.g. pip download --no-deps <framework>==<version>"
        ) from None
    except OSError as exc:
        raise FrameworkCodeError(
            f"{framework}: cannot read {path} ({exc.strerror or exc})"
        ) from None
    return SourceTree(framework, files, str(path), version, commit)


def _metadata_version(metadata: str) -> str | None:
    """The ``Version:`` of a distribution's METADATA text."""
    for line in metadata.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return None


def _dir_version(framework: str, root: Path) -> str:
    """The version recorded in a tree: its ``*.dist-info/METADATA`` (the last one with a
    version), else ``<pkg>/version/version``, else ``"unknown"``."""
    version = "unknown"
    for meta in root.glob(f"{DISTRIBUTIONS[framework]}-*.dist-info/METADATA"):
        version = _metadata_version(meta.read_text(encoding="utf-8", errors="replace")) or version
    vf = root / framework / "version" / "version"
    if version == "unknown" and vf.is_file():
        version = vf.read_text(encoding="utf-8", errors="replace").strip()
    return version


def _from_dir(framework: str, root: Path, version: str | None = None) -> SourceTree:
    files = {}
    for rel in FILES[framework]:
        p = root / rel
        if p.is_file():
            try:
                data = p.read_bytes()
            except OSError as exc:
                raise FrameworkCodeError(
                    f"{framework}: cannot read {p} ({exc.strerror or exc})"
                ) from None
            files[rel] = _text(data, str(p))
    if version is None:
        version = _dir_version(framework, root)
    return SourceTree(framework, files, str(root), version)


def _installed(framework: str) -> SourceTree:
    """The installed package's files, found without importing it."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec(framework)
    if spec is None or not spec.submodule_search_locations:
        raise FrameworkCodeError(
            f"{framework} is not importable here; pass --source (a wheel, a directory or "
            f"{FILES[framework][0]})"
        )
    root = Path(next(iter(spec.submodule_search_locations))).parent
    try:
        version = importlib.metadata.version(DISTRIBUTIONS[framework])
    except importlib.metadata.PackageNotFoundError:
        version = None
    return _from_dir(framework, root, version)


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
        return _installed(framework)
    path = Path(source)
    if not path.exists():
        raise FrameworkCodeError(f"{framework}: source {path} does not exist")
    if path.suffix == ".whl" and path.is_dir():
        raise FrameworkCodeError(f"{framework}: source {path} is a folder, not a wheel file")
    if path.suffix == ".whl":
        tree = _from_wheel(framework, path)
    elif path.is_dir():
        tree = _from_dir(framework, path)
        if not tree.files and (path / "purelib").is_dir():
            tree = _from_dir(framework, path / "purelib")
    else:
        rel = next((r for r in FILES[framework] if str(path).endswith(r)), None)
        if rel is None:
            raise FrameworkCodeError(
                f"{framework}: {path} is not one of {FILES[framework]}, a directory or a wheel"
            )
        tree = _from_dir(framework, Path(str(path)[: -len(rel)] or "."))
    if FILES[framework][0] not in tree.files:
        raise FrameworkCodeError(f"{framework}: {FILES[framework][0]} not found in {path}")
    return tree
