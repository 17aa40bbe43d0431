"""Optional `torch.compile` of the host forward and of the policy (`--compile`; docs/architecture.md#compiled-code).

What is compiled: `MorphogeneticModel.forward_with_shadow` (the training forward, as two graphs: the host with
its slots, and the shadow pass of TRAINING seeds, which the trainer backpropagates separately; autograd builds
each backward through its compiled graph) and
`FactoredLSTMPolicy.forward` (trunk, LSTM, norm). Validation (`counterfactual_forward`, whose alpha
table is read on the host) and the policy's action heads (sampling draws from a `torch.Generator`,
which dynamo cannot trace) stay eager. Debug layer statistics are `torch.compiler.disable`d.

Rules:
- Compiled code reads no lifecycle state. The model hands the compiled function an *execution plan*,
  one `SlotPlan` per slot (`SeedSlot.plan`: an enum member, strings and bools); dynamo guards on that
  argument's value. A plan seen before reuses its graph; a new plan compiles once. Stages that run the same
  code (BLENDING, HOLDING, FOSSILIZED) share one plan, and a GERMINATED seed does not run, so a germination
  costs one compile of each graph, when the seed enters TRAINING, and entering BLENDING one more of the host
  forward. Why not guard on the stage itself: with torch 2.13,
  dynamo was seen to drop the identity guard on `slot.lifecycle.stage` when it equalled a global it
  also read (`Stage.TRAINING`), and reused a TRAINING graph for a BLENDING seed (wrong outputs).
- Graphs are cached per function, not per model: every env's model with the same plan (and shapes)
  reuses one graph, whatever its weights (parameters are graph inputs). Dynamo's default of 8 entries
  per function is too few for many envs in different growth states, so compiled calls run with the
  limit raised to `RECOMPILE_LIMIT`; past it dynamo runs that function eagerly (correct, slower).
- Mode "auto" is "reduce-overhead" on CUDA (CUDA graphs: launch overhead is what tiny hosts pay) and
  "default" elsewhere (CUDA graphs do not exist on CPU). Modes apply to the inductor backend only;
  "aot_eager" and "eager" exist to tell a compiler problem from a model problem.
- Under CUDA graphs a graph's outputs live in its static memory and its next replay overwrites them, so a
  compiled function returns copies: the policy keeps its LSTM state from one step to the next (on an H100,
  PPO training compiled on CUDA, `benchmarks/vector_throughput.py --device cuda --compile`, failed reading
  it: "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run"). The copies
  cost one small device copy per output and call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["COMPILE_BACKENDS", "COMPILE_MODES", "CUDA_GRAPH_MODES", "RECOMPILE_LIMIT", "CompileSettings", "compiled"]

COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""Accepted `compile_mode` values; "auto" picks by device (module docstring)."""
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
"""The modes in which inductor replays CUDA graphs on a CUDA device."""
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
"""Accepted `compile_backend` values (torch.compile backends)."""
# This module imports torch only where it compiles, so that the command line can offer these choices
# without loading torch.
RECOMPILE_LIMIT = 64
"""Compiled entries dynamo keeps per function while morphogen's compiled calls run (its default is 8)."""


@dataclass(frozen=True)
class CompileSettings:
    """How `--compile` compiles: the torch.compile mode and backend."""

    #: auto, default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs (inductor only).
    mode: str = "auto"
    #: inductor (generates kernels), aot_eager or eager (trace only; for debugging compile problems).
    backend: str = "inductor"

    def __post_init__(self) -> None:
        if self.mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {self.mode!r}")
        if self.backend not in COMPILE_BACKENDS:
            raise ValueError(f"compile_backend must be one of {', '.join(COMPILE_BACKENDS)}, got {self.backend!r}")

    def resolved_mode(self, device: torch.device | str) -> str | None:
        """The torch.compile mode for `device`; None for backends other than inductor (they take no mode)."""
        if self.backend != "inductor":
            return None
        if self.mode != "auto":
            return self.mode
        kind = device.type if not isinstance(device, str) else device.split(":")[0]
        return "reduce-overhead" if kind == "cuda" else "default"


class _CompiledFunction:
    """`torch.compile(function)` called with dynamo's recompile limit raised and RNN tracing allowed."""

    def __init__(self, function: Callable[..., Any], settings: CompileSettings, device: torch.device) -> None:
        import torch

        self.settings, self.device = settings, device
        mode = settings.resolved_mode(device)
        self.function = torch.compile(function, backend=settings.backend, mode=mode)
        #: Whether calls replay CUDA graphs, whose outputs the next replay overwrites (module docstring).
        self.cuda_graphs = torch.device(device).type == "cuda" and mode in CUDA_GRAPH_MODES

    def __call__(self, *args: Any) -> Any:
        import torch
        from torch.utils import _pytree

        # allow_rnn: trace nn.LSTM as one op instead of breaking the graph around it.
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, allow_rnn=True):
            outputs = self.function(*args)
        if self.cuda_graphs:
            outputs = _pytree.tree_map_only(torch.Tensor, torch.clone, outputs)
        return outputs


_CACHE: dict[tuple[Callable[..., Any], CompileSettings, torch.device], _CompiledFunction] = {}


def compiled(function: Callable[..., Any], settings: CompileSettings, device: torch.device) -> Callable[..., Any]:
    """The one compiled wrapper of the plain (unbound) `function` per settings and device, shared by every
    instance that calls it, so that they share dynamo's cache of graphs too."""
    key = (function, settings, device)
    if key not in _CACHE:
        _CACHE[key] = _CompiledFunction(function, settings, device)
    return _CACHE[key]
