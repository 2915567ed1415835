"""Building the plugin manager and the model registry: factories, never import-time work."""

from __future__ import annotations

import importlib
import logging
import os
import stat
import sys

import pluggy

from swamp import hooks
from swamp.domain.text import printable
from swamp.errors import SwampError, UnknownModel
from swamp.models.framework import ModelType

log = logging.getLogger(__name__)


def plugin_manager(*, load_entry_points: bool = True) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hooks.PROJECT)
    pm.add_hookspecs(hooks)
    from swamp.models import builtin, fleet_probe

    pm.register(builtin, name="swamp.builtin")
    pm.register(fleet_probe, name="swamp.fleet_probe")
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
    ``plugins`` directory beside the pyz (``pip install --target``), taken only when no other
    user could have put code in it."""
    dirs = [d for d in os.environ.get("SWAMP_PLUGIN_PATH", "").split(os.pathsep) if d]
    pyz = os.environ.get("SWAMP_PYZ")
    if pyz:
        beside = os.path.join(os.path.dirname(pyz), "plugins")
        if _private(beside):
            dirs.append(beside)
    return [os.path.abspath(d) for d in dirs]


def _private(directory: str) -> bool:
    """A directory owned by us or root that neither group nor others can write; one that
    exists but is not is skipped with a warning that says why."""
    try:
        info = os.stat(directory)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        return False
    if info.st_uid in (os.getuid(), 0) and not info.st_mode & 0o022:
        return True
    log.warning(
        "ignoring %s: another user could write to it (make it yours and chmod go-w, or name "
        "it in SWAMP_PLUGIN_PATH)",
        printable(directory),
    )
    return False


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
