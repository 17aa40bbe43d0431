"""morphogen: neural networks that grow while they train.

A host network carries slots; a controller germinates seeds into them, trains each seed behind the
host, blends it in, and keeps it or prunes it.
"""

from morphogen.core.blueprints import blueprint_names, build_seed
from morphogen.core.hosts import CNNHost, Conv1dHost, TransformerHost
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import SeedSlot, SlotConfig

__all__ = [
    "CNNHost",
    "Conv1dHost",
    "MorphogeneticModel",
    "SeedSlot",
    "SlotConfig",
    "Stage",
    "TransformerHost",
    "blueprint_names",
    "build_seed",
]
__version__ = "0.1.0"


def _register_gymnasium_env() -> None:
    """Register "morphogen/Morphogenesis-v0" by entry point: `gymnasium.make` finds it after `import
    morphogen`, and the env module (and its task loading) is imported only when an env is made."""
    import gymnasium

    if "morphogen/Morphogenesis-v0" not in gymnasium.registry:
        gymnasium.register(id="morphogen/Morphogenesis-v0", entry_point="morphogen.env.gym:MorphogenesisEnv")


_register_gymnasium_env()
