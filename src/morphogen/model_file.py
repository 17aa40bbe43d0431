"""RUN_DIR/model.pt: the grown model a `run` ended with, kept so that it can be exported later.

The file holds the `MorphogeneticModel`'s `state_dict` (host weights, and for every slot its blueprint,
options, stage and alpha as the slot's extra state, plus the seed's weights), with the model's topology
and slot ids, and a SHA-256 checksum of all of it (`control/integrity.py`). It is written with
`write_atomic` (whole, never through a link) and read with `torch.load(weights_only=True)`: tensors and
plain values only, so a planted file cannot run code.

A file from elsewhere is not trusted. Before its state is loaded into a model rebuilt from the run's
`config.json`, every seed it describes is built on the meta device (no memory) and its size compared
with the tensors the file holds, so that a forged blueprint option cannot make loading allocate more than
the file itself carries. Whatever is wrong is one `ModelFileError` line naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from morphogen.control.integrity import checksum_matches, read_torch_file, write_checksummed
from morphogen.core.lifecycle import SEED_STAGES, Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import SeedSlot

FORMAT_VERSION = 1
#: What the file says it is, so that a checkpoint or another torch file is not taken for a model.
KIND = "morphogen grown model"


class ModelFileError(ValueError):
    """A model file that cannot be used: missing, damaged, refused, or not of this run's model."""


def save_model_file(model: MorphogeneticModel, path: str | Path) -> None:
    """Write `model` (its state on the CPU, with its topology, slot ids and a checksum) to `path` atomically."""
    state = {key: value.detach().cpu() if isinstance(value, Tensor) else value
             for key, value in model.state_dict().items()}
    payload: dict[str, Any] = {"format_version": FORMAT_VERSION, "kind": KIND, "topology": model.topology,
                               "slot_ids": list(model.slot_ids), "model": state}
    write_checksummed(payload, path)


def read_model_file(path: str | Path) -> dict[str, Any]:
    """The payload of a model file, its checksum verified; `ModelFileError` for anything else."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"no saved model at {path}: a run directory of `morphogen run` (or morphogen.grow) "
                             "holds one once its run has finished")
    payload = read_torch_file(path, what="model file", error=ModelFileError)
    if not isinstance(payload, dict) or payload.get("kind") != KIND or payload.get("format_version") != FORMAT_VERSION:
        raise ModelFileError(f"{path} is not a morphogen model file of format {FORMAT_VERSION}")
    if not checksum_matches(payload):
        raise ModelFileError(f"model file {path} is damaged: its contents do not match the checksum saved with them "
                             "(a disk or copy error?); use an intact copy of the run")
    state = payload.get("model")
    if not isinstance(state, dict) or not all(isinstance(key, str) for key in state):
        raise ModelFileError(f"model file {path} holds no model state")
    return payload


def load_model_state(model: MorphogeneticModel, payload: dict[str, Any], source: str | Path) -> None:
    """Load a model file's state into `model`, rebuilt for the same run; `ModelFileError` if it does not fit."""
    if payload.get("topology") != model.topology or list(payload.get("slot_ids") or []) != list(model.slot_ids):
        raise ModelFileError(f"model file {source} was saved from a {payload.get('topology')} model with slots "
                             f"{payload.get('slot_ids')}, but the run's config builds a {model.topology} model with "
                             f"slots {list(model.slot_ids)}")
    state: dict[str, Any] = payload["model"]
    _check_host_shapes(state, model, source)  # before the seeds, which a host of other widths would also misfit
    for slot in model.slots():
        _check_seed_size(state, slot, source)
    try:
        model.load_state_dict(state)
    except Exception as error:  # shapes, missing keys, bad extra state: the file does not fit this model
        lines = str(error).strip().splitlines()
        detail = " ".join(line.strip() for line in lines[:2])[:300] if lines else type(error).__name__
        raise ModelFileError(f"model file {source} does not fit the model its run's config builds: {detail}") from None


def _check_host_shapes(state: dict[str, Any], model: MorphogeneticModel, source: str | Path) -> None:
    """Refuse a host whose weights are not of the shapes the file holds (a network of other widths than the run's),
    naming the first that differs."""
    for name, value in model.host.state_dict(prefix="host.").items():
        saved = state.get(name)
        if isinstance(saved, Tensor) and saved.shape != value.shape:
            raise ModelFileError(f"model file {source} holds {name[len('host.'):]} of shape {tuple(saved.shape)}, "
                                 f"the host built here of shape {tuple(value.shape)}: build the host as the run grew "
                                 "it (the same network, sizes and slots)")


def _check_seed_size(state: dict[str, Any], slot: SeedSlot, source: str | Path) -> None:
    """Refuse a slot whose saved seed description would build more (or other) tensors than the file holds."""
    slot_id = slot.slot_id
    extra = state.get(f"seed_slots.{slot_id}._extra_state")
    if not isinstance(extra, dict):
        raise ModelFileError(f"model file {source} lacks the state of slot {slot_id}")
    lifecycle, options = extra.get("lifecycle"), extra.get("blueprint_options")
    stage = lifecycle.get("stage") if isinstance(lifecycle, dict) else None
    if stage not in {s.value for s in Stage}:
        raise ModelFileError(f"model file {source}: slot {slot_id} has no valid stage")
    if Stage(stage) not in SEED_STAGES:
        return
    blueprint = extra.get("blueprint")
    if not isinstance(blueprint, str) or not isinstance(options, dict):
        raise ModelFileError(f"model file {source}: slot {slot_id} holds a seed without a blueprint")
    try:
        described = slot.seed_module(blueprint, device="meta", **options).state_dict()
    except Exception as error:  # an unknown blueprint or option: the file was not written for this model
        raise ModelFileError(f"model file {source}: slot {slot_id}'s seed {blueprint!r} cannot be built here: "
                             f"{type(error).__name__}: {str(error)[:200]}") from None
    prefix = f"seed_slots.{slot_id}.seed."
    held = {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
    shapes = {key: tuple(value.shape) for key, value in held.items() if isinstance(value, Tensor)}
    if shapes != {key: tuple(value.shape) for key, value in described.items()}:
        raise ModelFileError(f"model file {source}: slot {slot_id}'s seed {blueprint!r} does not match the weights "
                             "saved for it")
