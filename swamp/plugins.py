"""Building the plugin manager and the model registry: factories, never import-time work."""

from __future__ import annotations

import importlib
import logging
import os
import stat
import sys

import pluggy

from swamp import hooks
from swamp.domain.file_trust import doubt, lineage
from swamp.domain.text import printable
from swamp.errors import SwampError, UnknownModel, UserError
from swamp.models.framework import ModelType

log = logging.getLogger(__name__)


def plugin_manager(*, load_entry_points: bool = True) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hooks.PROJECT)
    pm.add_hookspecs(hooks)
    from swamp.models import builtin, fleet_probe
    from swamp.worker import token_sources

    pm.register(builtin, name="swamp.builtin")
    pm.register(fleet_probe, name="swamp.fleet_probe")
    pm.register(token_sources, name="swamp.token_sources")
    for directory in plugin_dirs():
        if directory not in sys.path:  # after our own: a plugin cannot shadow swamp's modules
            sys.path.append(directory)
    if load_entry_points:
        pm.load_setuptools_entrypoints(hooks.PROJECT)
    for module_name in _extra_plugins():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise SwampError(
                f"cannot load plugin {module_name!r} named in SWAMP_PLUGINS: {exc}"
            ) from exc
        if not pm.is_registered(module):
            pm.register(module, name=module_name)
    return pm


def plugin_dirs() -> list[str]:
    """Where plugins live besides the interpreter's own path, for a pyz run as ``python3 -I``
    (which ignores ``PYTHONPATH``): the directories in ``SWAMP_PLUGIN_PATH``, then a
    ``plugins`` directory beside the pyz (``pip install --target``).

    Python runs what it finds there, so a directory is taken only when no other user could
    have put anything in it: every file and directory in it (links followed), and every
    directory above, ours or root's and not writable by group or others (:func:`untrusted`).
    A ``SWAMP_PLUGIN_PATH`` entry that fails is an error; the directory beside the pyz, which
    nobody named, is skipped with a warning. Directories that do not exist are left out, so
    none can appear on ``sys.path`` later."""
    dirs = []
    for directory in os.environ.get("SWAMP_PLUGIN_PATH", "").split(os.pathsep):
        if not directory or not os.path.isdir(directory):
            continue
        problem = untrusted(directory)
        if problem:
            raise UserError(
                f"SWAMP_PLUGIN_PATH names {printable(directory)}, but {printable(problem)}: "
                "another user could have put code there. Make it yours (or root's) and not "
                "writable by group or others (chmod -R go-w), or leave it out"
            )
        dirs.append(os.path.realpath(directory))
    pyz = os.environ.get("SWAMP_PYZ")
    if pyz:
        beside = os.path.join(os.path.dirname(pyz), "plugins")
        if os.path.isdir(beside):
            problem = untrusted(beside)
            if problem is None:
                dirs.append(os.path.realpath(beside))
            else:
                log.warning(
                    "ignoring the plugins in %s: %s, so another user could have put code there "
                    "(make it yours or root's and chmod -R go-w)",
                    printable(beside),
                    printable(problem),
                )
    return dirs


def untrusted(top: str) -> str | None:
    """Why code under ``top`` could be another user's (``"<path> is writable by …"``), or None.

    Checks ``top`` and every directory above it, then everything in it; a symbolic link is
    followed and its target checked the same way (with the directories above the target), so
    a link cannot lead out to a place another user controls. The rule is
    :func:`swamp.domain.file_trust.doubt`."""
    me = os.getuid()
    seen: set[tuple[int, int]] = set()
    starts = [os.path.realpath(top)]
    try:
        while starts:
            start = starts.pop()
            for path in lineage(start):
                info = os.lstat(path)
                why = doubt(info.st_uid, info.st_mode, me=me, above=path != start)
                if why:
                    return f"{path} {why}"
            folders = [start] if os.path.isdir(start) else []
            while folders:
                folder = folders.pop()
                info = os.stat(folder)
                if (info.st_dev, info.st_ino) in seen:
                    continue
                seen.add((info.st_dev, info.st_ino))
                with os.scandir(folder) as listing:
                    for entry in listing:
                        info = entry.stat(follow_symlinks=False)
                        if stat.S_ISLNK(info.st_mode):
                            target = os.path.realpath(entry.path)
                            if not os.path.exists(target):
                                return f"{entry.path} links to {target}, which does not exist"
                            starts.append(target)
                            continue
                        why = doubt(info.st_uid, info.st_mode, me=me)
                        if why:
                            return f"{entry.path} {why}"
                        if stat.S_ISDIR(info.st_mode):
                            folders.append(entry.path)
    except OSError as exc:
        return f"{exc.filename} cannot be read ({exc.strerror})"
    return None


def _extra_plugins() -> list[str]:
    """``SWAMP_PLUGINS=mod_a,mod_b``: plugin modules to load without installing a package."""
    return [m.strip() for m in os.environ.get("SWAMP_PLUGINS", "").split(",") if m.strip()]


class ModelRegistry:
    """Every model type known to this process, by type name."""

    def __init__(self, types: dict[str, ModelType]) -> None:
        self.types = types

    @classmethod
    def from_plugins(cls, pm: pluggy.PluginManager) -> ModelRegistry:
        types: dict[str, ModelType] = {}
        for contributed in pm.hook.swamp_model_types():
            for model_type in contributed or ():
                if model_type.type in types:
                    raise SwampError(f"model type {model_type.type!r} is registered twice")
                types[model_type.type] = model_type
        return cls(types)

    def get(self, type_name: str) -> ModelType:
        try:
            return self.types[type_name]
        except KeyError:
            known = ", ".join(sorted(t for t, m in self.types.items() if not m.internal))
            raise UnknownModel(f"unknown model type {type_name!r} (known: {known})") from None

    def runnable(self, type_name: str) -> ModelType:
        model_type = self.get(type_name)
        if model_type.internal:
            raise UnknownModel(
                f"model type {type_name!r} is the orchestrator's own bookkeeping and cannot be run"
            )
        return model_type


_manager: pluggy.PluginManager | None = None
_registry: ModelRegistry | None = None


def default_manager() -> pluggy.PluginManager:
    """The plugin manager of this process, built on first use (never at import time)."""
    global _manager
    if _manager is None:
        _manager = plugin_manager()
    return _manager


def default_registry() -> ModelRegistry:
    """The model registry of this process, built on first use."""
    global _registry
    if _registry is None:
        _registry = ModelRegistry.from_plugins(default_manager())
    return _registry


def default_seams() -> list:
    """Every fleet-probe seam of this process: the built-ins first, then plugins' by name."""
    from swamp.models.fleet_probe import ordered

    return ordered(
        [
            seam
            for contributed in default_manager().hook.swamp_probe_seams()
            for seam in contributed or ()
        ]
    )


def default_token_sources() -> dict:
    """Every token source of this process by scheme: the built-in ``file`` and ``env`` and
    each plugin's."""
    from swamp.worker.token_sources import collect

    return collect(default_manager().hook.swamp_token_sources())
