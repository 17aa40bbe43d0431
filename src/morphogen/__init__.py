"""morphogen: neural networks that grow while they train.

A host network carries slots; a controller germinates seeds into them, trains each seed behind the
host, blends it in, and keeps it or prunes it.
"""

from morphogen.commands.run import RunConfig, RunResult
from morphogen.core.blueprints import blueprint_names, build_seed, register_blueprint
from morphogen.core.hosts import CNNHost, Conv1dHost, SegmentedHost, TransformerHost
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.module_host import HostBuildError, ModuleHost, host_from_module
from morphogen.core.plain import ExportError, GrownNetwork, grown_network
from morphogen.core.slot import SeedSlot, SlotConfig
from morphogen.data import DataError, Task
from morphogen.data.user import task_from_data
from morphogen.export import export_model, load_grown_model
from morphogen.grow import grow
from morphogen.grower import EpochReport, Grower

__all__ = [
    "CNNHost",
    "Conv1dHost",
    "DataError",
    "EpochReport",
    "ExportError",
    "Grower",
    "GrownNetwork",
    "HostBuildError",
    "ModuleHost",
    "MorphogeneticModel",
    "RunConfig",
    "RunResult",
    "SeedSlot",
    "SegmentedHost",
    "SlotConfig",
    "Stage",
    "Task",
    "TransformerHost",
    "blueprint_names",
    "build_seed",
    "export_model",
    "grow",
    "grown_network",
    "host_from_module",
    "load_grown_model",
    "register_blueprint",
    "task_from_data",
]
__version__ = "0.1.0"


def _register_gymnasium_env() -> None:
    """Register "morphogen/Morphogenesis-v0" by entry point: `gymnasium.make` finds it after `import
    morphogen`, and the env module (and its task loading) is imported only when an env is made."""
    import gymnasium

    if "morphogen/Morphogenesis-v0" not in gymnasium.registry:
        gymnasium.register(id="morphogen/Morphogenesis-v0", entry_point="morphogen.env.gym:MorphogenesisEnv")


_register_gymnasium_env()
