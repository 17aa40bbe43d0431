"""MorphogeneticModel: fused counterfactual forward against separate forwards, the shared host prefix,
state_dict round trips of seeds and lifecycle, slot ids, parameter counts."""

from __future__ import annotations

import io
import random
from collections.abc import Callable

import pytest
import torch
from slot_driver import EASY_CONFIG, drive_to, perturb_seed
from torch import Tensor

from morphogen.core.blend import BlendKind
from morphogen.core.blueprints import BlueprintKind, blueprint_names, get_blueprint, parameter_count
from morphogen.core.hosts import CNNHost, SegmentedHost, TransformerHost, UnknownSlotError
from morphogen.core.lifecycle import BLENDED_STAGES, Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import SeedSlot

SEED_STAGES_TO_PLACE = (Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED)


def _host(topology: str, *, many_points: bool = False, seed: int = 0,
          dtype: torch.dtype | None = None) -> SegmentedHost:
    """A small host in eval mode; `many_points` gives the CNN 6 points and the transformer 6 instead of 4."""
    torch.manual_seed(seed)
    if topology == "cnn":
        return CNNHost(5, 1, n_blocks=3, base_channels=8, pool_slots=many_points, dtype=dtype).eval()
    layers = 6 if many_points else 4
    return TransformerHost(vocab_size=11, d_model=16, n_heads=2, n_layers=layers, block_size=6, n_segments=layers,
                           dtype=dtype).eval()


def _batch(topology: str, batch: int = 3) -> Tensor:
    generator = torch.Generator().manual_seed(7)
    if topology == "cnn":
        return torch.randn(batch, 1, 8, 8, generator=generator)
    return torch.randint(0, 11, (batch, 6), generator=generator)


def _place_seed(model: MorphogeneticModel, slot_id: str, rng: random.Random, stage: Stage) -> SeedSlot:
    """Germinate a random blueprint with random (non-zero) weights in `slot_id` and drive it to `stage`."""
    deepening = [name for name in blueprint_names(model.topology)  # test_width.py has the widening ones
                 if get_blueprint(model.topology, name).kind is BlueprintKind.DEEPEN
                 and not model.slot(slot_id).site_problem(name)]  # a copy needs a layer of the host's own to copy
    slot = model.germinate(slot_id, rng.choice(deepening), blend=rng.choice(list(BlendKind)))
    perturb_seed(slot, torch.Generator().manual_seed(rng.randrange(2**31)))
    drive_to(slot, stage, alpha=rng.uniform(0.1, 1.0))
    return slot


def _seeded_positions(n_points: int, placement: str, rng: random.Random) -> list[int]:
    if placement == "first":
        return [0]
    if placement == "middle":
        return [n_points // 2]
    if placement == "last":
        return [n_points - 1]
    return sorted(rng.sample(range(n_points), rng.randint(2, n_points)))


def _random_alphas(rng: random.Random, k: int, n_slots: int) -> list[list[float]]:
    columns = []
    for _ in range(n_slots):
        if rng.random() < 0.3:
            columns.append([rng.choice([0.0, 0.5, 1.0])] * k)  # the same alpha in every config
        else:
            columns.append([rng.choice([0.0, 1.0, rng.random()]) for _ in range(k)])
    return [[column[row] for column in columns] for row in range(k)]


def _forward_with_alphas(model: MorphogeneticModel, row: list[float]) -> Tensor:
    """Reference for one config: a plain pass with every blended slot's alpha set to the row's value,
    and each TRAINING seed with a non-zero alpha blended in at that alpha (its shadow)."""
    for slot, alpha in zip(model.slots(), row, strict=True):
        if slot.stage in BLENDED_STAGES:
            slot.alpha.alpha = alpha
            slot._sync_alpha()
    shadows = {slot.slot_id: alpha for slot, alpha in zip(model.slots(), row, strict=True)
               if slot.stage is Stage.TRAINING and alpha != 0.0}
    x, host = _batch(model.topology), model.host
    for index, point in enumerate(host.slot_ids):
        x = host.run_segment(index, x)
        if point in shadows:
            x = model.slot(point).shadow(x, shadows[point])
        elif point in model.slot_ids:
            x = model.slot(point)(x)
    return host.run_segment(len(host.slot_ids), x)


@pytest.mark.parametrize("topology", ["cnn", "transformer"])
@pytest.mark.parametrize("placement", ["first", "middle", "last", "several"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_counterfactual_forward_equals_separate_forwards(topology: str, placement: str, k: int) -> None:
    rng = random.Random(f"{topology}-{placement}-{k}")
    for _ in range(2):
        model = MorphogeneticModel(_host(topology, many_points=rng.random() < 0.5), config=EASY_CONFIG)
        positions = _seeded_positions(len(model.slot_ids), placement, rng)
        for position in positions:
            stage = rng.choice((Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED, Stage.TRAINING))
            _place_seed(model, model.slot_ids[position], rng, stage)
        alphas = _random_alphas(rng, k, len(model.slot_ids))
        with torch.no_grad():
            bare = model.host(_batch(topology))
            fused = model.counterfactual_forward(_batch(topology), alphas)
            saved = [slot.alpha.alpha for slot in model.slots()]
            separate = torch.stack([_forward_with_alphas(model, row) for row in alphas])
            _forward_with_alphas(model, saved)
        assert fused.shape == (k, *bare.shape)
        torch.testing.assert_close(fused, separate, rtol=0, atol=1e-5)
        # The seeds are not identities: some config with a blended seed at alpha > 0 must differ from the host.
        blended = [j for j, slot in enumerate(model.slots()) if slot.stage in BLENDED_STAGES]
        for row, output in zip(alphas, separate, strict=True):
            if any(row[j] > 0.05 for j in blended):
                assert not torch.allclose(output, bare, atol=1e-3)


def test_counterfactual_forward_with_autograd_and_a_training_seed() -> None:
    rng = random.Random(3)
    model = MorphogeneticModel(_host("cnn"), config=EASY_CONFIG)
    _place_seed(model, "r0c0", rng, Stage.TRAINING)
    _place_seed(model, "r0c2", rng, Stage.HOLDING)
    alphas = torch.tensor([[0.0, 0.0, 1.0], [0.3, 0.0, 0.0]])
    fused = model.counterfactual_forward(_batch("cnn"), alphas)
    with torch.no_grad():
        separate = torch.stack([_forward_with_alphas(model, row) for row in alphas.tolist()])
    torch.testing.assert_close(fused.detach(), separate, rtol=0, atol=1e-5)
    fused.sum().backward()  # the fused pass is differentiable
    assert all(p.grad is not None for p in model.seed_parameters("r0c2"))


def _record_segment_batches(host: SegmentedHost) -> list[list[int]]:
    """Per host segment, the batch size of every call it gets from now on."""
    seen: list[list[int]] = [[] for _ in host.segments]

    def recorder(index: int) -> Callable[..., None]:
        return lambda module, inputs, output: seen[index].append(inputs[0].shape[0])

    for index, segment in enumerate(host.segments):
        segment.register_forward_hook(recorder(index))
    return seen


@pytest.mark.parametrize("topology", ["cnn", "transformer"])
def test_host_prefix_runs_once_before_the_first_differing_slot(topology: str) -> None:
    rng = random.Random(5)
    host = _host(topology)
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    n_points = len(model.slot_ids)
    for slot_id in model.slot_ids:
        _place_seed(model, slot_id, rng, Stage.HOLDING)
    seen = _record_segment_batches(host)
    batch, k = 3, 4
    for differing in range(n_points):
        for record in seen:
            record.clear()
        alphas = [[0.5] * n_points for _ in range(k)]
        for row in range(k):
            alphas[row][differing] = row / (k - 1)
        with torch.no_grad():
            model.counterfactual_forward(_batch(topology, batch), alphas)
        # Segment i leads up to point i: it runs on B samples up to the first differing point, K*B after.
        expected = [[batch] if index <= differing else [k * batch] for index in range(n_points + 1)]
        assert seen == expected, f"first differing slot {model.slot_ids[differing]}"
    for record in seen:
        record.clear()
    with torch.no_grad():
        output = model.counterfactual_forward(_batch(topology, batch), [[0.5] * n_points] * k)
    assert seen == [[batch]] * (n_points + 1)
    assert output.shape[0] == k


def test_counterfactual_forward_rejects_bad_alpha_tables() -> None:
    model = MorphogeneticModel(_host("cnn"))
    with pytest.raises(ValueError, match="r0c0"):
        model.counterfactual_forward(_batch("cnn"), [[1.0, 1.0]])
    with pytest.raises(ValueError, match="K >= 1"):
        model.counterfactual_forward(_batch("cnn"), [])


def _grown_model(topology: str, seed: int, dtype: torch.dtype | None = None) -> MorphogeneticModel:
    """A model with seeds in many stages, randomized weights and recorded signals."""
    host = _host(topology, many_points=True, seed=seed, dtype=dtype)
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    slot_ids = model.slot_ids
    rng = random.Random(11)
    placements = dict(zip(slot_ids, (*SEED_STAGES_TO_PLACE, Stage.EMBARGOED), strict=False))
    for index, (slot_id, stage) in enumerate(placements.items()):
        options = {"rank": 3} if topology == "transformer" and index == 0 else {}
        blend = list(BlendKind)[index % 3]
        fitting = [name for name in blueprint_names(topology)  # a widening seed needs a width site at its slot and
                   if (get_blueprint(topology, name).kind is not BlueprintKind.WIDEN  # adds its output; a copy a
                       or (model.slot(slot_id).width_site is not None and blend is BlendKind.ADD))  # layer to copy
                   and not model.slot(slot_id).site_problem(name)]
        blueprint = "lora" if options else rng.choice(fitting)
        slot = model.germinate(slot_id, blueprint, blend=blend,
                               blend_epochs=4 if stage is Stage.BLENDING else 0, **options)
        perturb_seed(slot, torch.Generator().manual_seed(index))
        slot.record_signals(accuracy=50.0 + index, gradient_health=0.9, gradient_ratio=0.2 + index,
                            contribution=1.5 * index)
        if stage is Stage.EMBARGOED:
            slot.prune(1)
            slot.step_epoch(2)
            slot.step_epoch(3)
        elif stage is Stage.BLENDING:
            drive_to(slot, Stage.TRAINING)
            slot.advance(1)  # a 4-epoch ramp up starts
            slot.step_epoch(2)
        elif stage is Stage.HOLDING and topology == "transformer":
            drive_to(slot, Stage.HOLDING)
            slot.set_alpha_target(0.25, 3, epoch=2)  # ramping down: frozen parameters
            slot.step_epoch(3)
        else:
            drive_to(slot, stage)
    return model


def _slot_state(slot: SeedSlot) -> dict[str, object]:
    return {
        "stage": slot.stage,
        "lifecycle": slot.lifecycle.state_dict(),
        "alpha": slot.alpha.state_dict(),
        "alpha_value": slot.alpha_value.item(),
        "blueprint": slot.blueprint,
        "options": slot.blueprint_options,
        "blend": (slot.blend_kind, slot.blend_epochs),
        "signals": slot.signals,
        "frozen": [p.requires_grad for p in slot.seed_parameters()],
        "has_seed": slot.seed is not None,
    }


@pytest.mark.parametrize("topology", ["cnn", "transformer"])
def test_state_dict_round_trips_seeds_and_lifecycle(topology: str) -> None:
    original = _grown_model(topology, seed=0)
    stages = {slot.stage for slot in original.slots()}
    assert {Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.FOSSILIZED, Stage.EMBARGOED} <= stages
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # extra state is plain Python values

    restored = MorphogeneticModel(_host(topology, many_points=True, seed=1), config=EASY_CONFIG)
    restored.load_state_dict(state)
    for before, after in zip(original.slots(), restored.slots(), strict=True):
        assert _slot_state(after) == _slot_state(before), before.slot_id
        for p, q in zip(before.seed_parameters(), after.seed_parameters(), strict=True):
            assert torch.equal(p, q)
    x = _batch(topology)
    with torch.no_grad():
        assert torch.equal(restored(x), original(x))
    # The clocks go on the same way.
    for epoch in range(4, 10):
        for before, after in zip(original.slots(), restored.slots(), strict=True):
            before.step_epoch(epoch)
            after.step_epoch(epoch)
            assert _slot_state(after) == _slot_state(before)


def test_state_dict_round_trip_keeps_the_seed_dtype() -> None:
    original = _grown_model("cnn", seed=0, dtype=torch.float64)
    restored = MorphogeneticModel(_host("cnn", many_points=True, seed=1, dtype=torch.float64), config=EASY_CONFIG)
    restored.load_state_dict(original.state_dict())
    assert {p.dtype for slot in restored.slots() for p in slot.seed_parameters()} == {torch.float64}
    x = _batch("cnn").double()
    with torch.no_grad():
        assert torch.equal(restored(x), original(x))


def test_loading_replaces_seeds_in_other_slots() -> None:
    source = MorphogeneticModel(_host("cnn"), config=EASY_CONFIG)
    source.germinate("r0c1", "conv_small")
    target = MorphogeneticModel(_host("cnn"), config=EASY_CONFIG)
    target.germinate("r0c0", "conv_heavy")
    target.load_state_dict(source.state_dict())
    assert target.stages() == {"r0c0": Stage.DORMANT, "r0c1": Stage.GERMINATED, "r0c2": Stage.DORMANT}
    assert target.slot("r0c0").seed is None and target.slot("r0c1").blueprint == "conv_small"


def test_seeds_germinated_or_loaded_in_an_evaluating_model_evaluate_too() -> None:
    """New modules start in training mode; a seed must not normalize or drop out as in training while the model
    around it evaluates (validation right after a germination)."""
    model = MorphogeneticModel(_host("cnn"), config=EASY_CONFIG).eval()
    slot = model.germinate("r0c1", "conv_heavy")
    assert slot.seed is not None and slot.blend is not None
    assert not any(module.training for module in (*slot.seed.modules(), *slot.blend.modules()))
    restored = MorphogeneticModel(_host("cnn"), config=EASY_CONFIG).eval()
    restored.load_state_dict(model.state_dict())
    assert not any(module.training for module in restored.modules())
    model.train()
    assert model.germinate("r0c0", "conv_small").seed.training  # type: ignore[union-attr]


def test_unknown_slot_ids_name_the_valid_ones() -> None:
    host = _host("cnn")
    with pytest.raises(UnknownSlotError, match="r0c0, r0c1, r0c2"):
        MorphogeneticModel(host, slots=["r0c0", "r5c5"])
    model = MorphogeneticModel(host, slots=["r0c2", "r0c0"])
    assert model.slot_ids == ("r0c0", "r0c2")  # execution order
    for call in (lambda: model.slot("r0c1"), lambda: model.germinate("r9", "conv_small"),
                 lambda: model.seed_parameters("nope")):
        with pytest.raises(UnknownSlotError, match="r0c0, r0c2"):
            call()
    with pytest.raises(ValueError, match="duplicates"):
        MorphogeneticModel(host, slots=["r0c0", "r0c0"])


def test_param_count_counts_active_seeds_or_all_seeds() -> None:
    model = MorphogeneticModel(_host("cnn"), config=EASY_CONFIG)
    host_count = sum(p.numel() for p in model.host.parameters())
    assert model.param_count() == model.param_count(active_only=False) == model.host_param_count() == host_count
    slot = model.germinate("r0c1", "conv_light")  # 16 channels, add blend: no gate parameters
    seed_count = parameter_count("cnn", "conv_light", 16)
    assert seed_count == 2 * 16 + 16 * 16 * 9 + 16
    assert model.param_count() == host_count
    assert model.param_count(active_only=False) == host_count + seed_count
    drive_to(slot, Stage.TRAINING)
    assert model.param_count() == host_count
    drive_to(slot, Stage.BLENDING, alpha=0.5)
    assert model.param_count() == model.param_count(active_only=False) == host_count + seed_count
    gated = model.germinate("r0c2", "conv_small", blend=BlendKind.GATE)
    gate_count = (32 * 8 + 8) + (8 + 1)  # Linear(32, 8) + Linear(8, 1)
    assert gated.seed_parameter_count() == parameter_count("cnn", "conv_small", 32) + gate_count
    assert model.param_count(active_only=False) == host_count + seed_count + gated.seed_parameter_count()
    slot.prune(0)
    assert model.param_count() == host_count
    assert model.seed_parameters("r0c1") == []


def test_model_without_seeds_is_the_host() -> None:
    for topology in ("cnn", "transformer"):
        model = MorphogeneticModel(_host(topology))
        with torch.no_grad():
            assert torch.equal(model(_batch(topology)), model.host(_batch(topology)))
        assert model.host_parameters() == list(model.host.parameters())


def test_germinate_uses_the_host_dtype() -> None:
    model = MorphogeneticModel(_host("transformer", dtype=torch.float64))
    slot = model.germinate("r0c1", "attention", blend=BlendKind.GATE)
    assert {p.dtype for p in slot.seed_parameters()} == {torch.float64}


def test_an_installed_seed_round_trips_as_a_fixed_attached_layer() -> None:
    model = MorphogeneticModel(_host("cnn"))
    model.install("r0c1", "conv_light")
    copy_ = MorphogeneticModel(_host("cnn"))
    copy_.load_state_dict(model.state_dict())
    slot = copy_.slot("r0c1")
    assert slot.stage is Stage.FOSSILIZED and slot.alpha.alpha == 1.0 and not slot.detach_input
    x = _batch("cnn")
    with torch.no_grad():
        assert torch.equal(copy_(x), model(x))
