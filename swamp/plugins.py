"""Building the plugin manager and the model registry: factories, never import-time work."""

from __future__ import annotations

import importlib
import os

import pluggy

from swamp import hooks
from swamp.errors import SwampError, UnknownModel
from swamp.models.framework import ModelType


def plugin_manager(*, load_entry_points: bool = True) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hooks.PROJECT)
    pm.add_hookspecs(hooks)
    from swamp.models import builtin, fleet_probe

    pm.register(builtin, name="swamp.builtin")
    pm.register(fleet_probe, name="swamp.fleet_probe")
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
