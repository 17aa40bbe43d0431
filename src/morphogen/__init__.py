"""morphogen: neural networks that grow while they train.

A host network carries slots; a controller germinates seeds into them, trains each seed behind the
host, blends it in, and keeps it or prunes it.

The public names below are imported on first use (PEP 562), so that `import morphogen` and the
`morphogen` command load torch only when something needs it (`morphogen --help` does not).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from morphogen.commands.run import RunConfig, RunResult, load_config
    from morphogen.config import ConfigError
    from morphogen.control.controller import NoGrowthController
    from morphogen.core.blueprints import blueprint_names, build_seed, register_blueprint
    from morphogen.core.hosts import CNNHost, Conv1dHost, SegmentedHost, TransformerHost, UnknownSlotError
    from morphogen.core.lifecycle import GateConfig, GateMode, Stage
    from morphogen.core.model import MorphogeneticModel
    from morphogen.core.module_host import HostBuildError, ModuleHost, host_from_module, slot_points
    from morphogen.core.plain import ExportError, GrownNetwork, grown_network
    from morphogen.core.slot import SeedSlot, SlotConfig
    from morphogen.data import DataError, Task
    from morphogen.data.user import task_from_data
    from morphogen.env.governor import DivergenceError
    from morphogen.export import export_model, load_grown_model
    from morphogen.grower import EpochReport, Grower
    from morphogen.growing import grow
    from morphogen.over_seeds import SeedsResult, grow_over_seeds

__version__ = "0.1.0"

_HOMES = {
    "RunConfig": "morphogen.commands.run", "RunResult": "morphogen.commands.run", "ConfigError": "morphogen.config",
    "load_config": "morphogen.commands.run",
    "blueprint_names": "morphogen.core.blueprints", "build_seed": "morphogen.core.blueprints",
    "register_blueprint": "morphogen.core.blueprints",
    "CNNHost": "morphogen.core.hosts", "Conv1dHost": "morphogen.core.hosts", "SegmentedHost": "morphogen.core.hosts",
    "TransformerHost": "morphogen.core.hosts", "UnknownSlotError": "morphogen.core.hosts",
    "GateConfig": "morphogen.core.lifecycle", "GateMode": "morphogen.core.lifecycle",
    "Stage": "morphogen.core.lifecycle",
    "NoGrowthController": "morphogen.control.controller", "DivergenceError": "morphogen.env.governor",
    "MorphogeneticModel": "morphogen.core.model",
    "HostBuildError": "morphogen.core.module_host", "ModuleHost": "morphogen.core.module_host",
    "host_from_module": "morphogen.core.module_host", "slot_points": "morphogen.core.module_host",
    "SeedSlot": "morphogen.core.slot", "SlotConfig": "morphogen.core.slot",
    "DataError": "morphogen.data", "Task": "morphogen.data",
    "task_from_data": "morphogen.data.user",
    "ExportError": "morphogen.core.plain", "GrownNetwork": "morphogen.core.plain",
    "grown_network": "morphogen.core.plain",
    "export_model": "morphogen.export", "load_grown_model": "morphogen.export",
    "grow": "morphogen.growing", "SeedsResult": "morphogen.over_seeds", "grow_over_seeds": "morphogen.over_seeds",
    "EpochReport": "morphogen.grower", "Grower": "morphogen.grower",
}
"""Where each public name lives."""

__all__ = ["CNNHost", "ConfigError", "Conv1dHost", "DataError", "DivergenceError", "EpochReport", "ExportError",
    "GateConfig", "GateMode", "Grower", "GrownNetwork", "HostBuildError", "ModuleHost", "MorphogeneticModel",
    "NoGrowthController", "RunConfig", "RunResult", "SeedSlot", "SeedsResult", "SegmentedHost", "SlotConfig",
    "Stage", "Task", "TransformerHost", "UnknownSlotError", "blueprint_names", "build_seed", "export_model", "grow",
    "grow_over_seeds", "grown_network", "host_from_module", "load_config", "load_grown_model", "register_blueprint",
    "slot_points", "task_from_data"]


def __getattr__(name: str) -> Any:
    """Import a public name from its home on first use."""
    if name not in _HOMES:
        raise AttributeError(f"module 'morphogen' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


def _register_gymnasium_env() -> None:
    """Register "morphogen/Morphogenesis-v0" by entry point: `gymnasium.make` finds it after `import
    morphogen`, and the env module (and its task loading) is imported only when an env is made."""
    import gymnasium

    if "morphogen/Morphogenesis-v0" not in gymnasium.registry:
        gymnasium.register(id="morphogen/Morphogenesis-v0", entry_point="morphogen.env.gym:MorphogenesisEnv")


_register_gymnasium_env()
