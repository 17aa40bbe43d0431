"""Gradient isolation of SeedSlot (docs/architecture.md#shadow-pass): a TRAINING seed is invisible to the
host, bit for bit; a blended seed with a detached input gives the host its skip-path gradient and nothing
through its internals."""

from __future__ import annotations

import copy

import pytest
import torch
from slot_driver import EASY_CONFIG, drive_to, perturb_seed
from torch import Tensor, nn

from morphogen.core.blend import BlendKind
from morphogen.core.blueprints import BlueprintKind, blueprint_names, get_blueprint
from morphogen.core.hosts import CNNHost, SegmentedHost, TransformerHost
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import DETACH_AFTER_TRAINING, SeedSlot, SlotConfig


def _host_and_batch(topology: str) -> tuple[SegmentedHost, Tensor, Tensor]:
    """A small host in train mode, an input batch and class targets."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    if topology == "cnn":
        host: SegmentedHost = CNNHost(5, 1, n_blocks=3, base_channels=8)
        return host, torch.randn(6, 1, 8, 8, generator=generator), torch.randint(0, 5, (6,), generator=generator)
    host = TransformerHost(vocab_size=11, d_model=16, n_heads=2, n_layers=3, block_size=6, n_segments=3)
    return host, torch.randint(0, 11, (4, 6), generator=generator), torch.randint(0, 11, (4, 6), generator=generator)


def _loss(output: Tensor, targets: Tensor) -> Tensor:
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


def _model_with_seed(host: SegmentedHost, slot_id: str, blueprint: str, stage: Stage, *, alpha: float = 1.0,
                     blend: BlendKind = BlendKind.ADD) -> MorphogeneticModel:
    """`host` with one randomly perturbed seed in `slot_id`, driven to `stage`."""
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    slot = model.germinate(slot_id, blueprint, blend=blend)
    perturb_seed(slot, torch.Generator().manual_seed(2))
    drive_to(slot, stage, alpha=alpha)
    return model


#: Branch seeds need a host that measured its segments' inputs, and widening inside a block a host with blocks:
#: test_branch.py and test_inside_width.py check their isolation on one.
ALL_BLUEPRINTS = [(topology, name) for topology in ("cnn", "transformer") for name in blueprint_names(topology)
                  if get_blueprint(topology, name).kind is not BlueprintKind.BRANCH
                  and not get_blueprint(topology, name).inside_only
                  # A copy needs a block of the host's own before its slot, which the built-in CNN has not
                  # (test_stacking.py copies a user's).
                  and not (topology == "cnn" and get_blueprint(topology, name).copies_layer_before)]


def _shadow_backward(model: MorphogeneticModel, x: Tensor, targets: Tensor) -> Tensor:
    """One closed-loop training backward: host loss into everything, shadow loss into TRAINING seeds only."""
    output, shadow = model.forward_with_shadow(x)
    _loss(output, targets).backward()
    assert shadow is not None
    shadow_loss = sum((_loss(shadow.outputs[k], targets) for k in range(len(shadow.slot_ids))), torch.zeros(()))
    shadow_loss.backward(inputs=list(shadow.parameters))
    return output


@pytest.mark.parametrize(("topology", "blueprint"), ALL_BLUEPRINTS)
def test_training_seed_leaves_output_host_gradients_and_state_bit_identical(topology: str, blueprint: str) -> None:
    host, x, targets = _host_and_batch(topology)
    bare_host = copy.deepcopy(host)
    middle = host.slot_ids[1]
    model = _model_with_seed(host, middle, blueprint, Stage.TRAINING)

    output = _shadow_backward(model, x, targets)
    bare_output = bare_host(x)
    assert torch.equal(output, bare_output)
    _loss(bare_output, targets).backward()

    bare_parameters = dict(bare_host.named_parameters())
    for name, parameter in host.named_parameters():
        assert parameter.grad is not None and torch.equal(parameter.grad, bare_parameters[name].grad), name
    # The shadow pass ran the batch-norm layers after the slot in train mode; their statistics are the host's.
    bare_buffers = dict(bare_host.named_buffers())
    for name, buffer in host.named_buffers():
        assert torch.equal(buffer, bare_buffers[name]), name
    seed_gradients = [p.grad for p in model.slot(middle).seed_parameters() if p.grad is not None]
    assert seed_gradients and any(bool(g.abs().sum() > 0) for g in seed_gradients)


@pytest.mark.parametrize("topology", ["cnn", "transformer"])
def test_shadow_path_puts_no_gradient_into_any_host_parameter_or_other_seed(topology: str) -> None:
    host, x, targets = _host_and_batch(topology)
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    first, middle, last = host.slot_ids[0], host.slot_ids[1], host.slot_ids[-1]
    blueprint = "conv_light" if topology == "cnn" else "mlp_small"
    for slot_id, stage in ((first, Stage.HOLDING), (middle, Stage.TRAINING), (last, Stage.FOSSILIZED)):
        slot = model.germinate(slot_id, blueprint)
        perturb_seed(slot, torch.Generator().manual_seed(len(slot_id)))
        drive_to(slot, stage)
    _, shadow = model.forward_with_shadow(x)
    assert shadow is not None and shadow.slot_ids == (middle,)
    _loss(shadow.outputs[0], targets).backward(inputs=list(shadow.parameters))
    for name, parameter in host.named_parameters():
        assert parameter.grad is None, name
    for slot_id in (first, last):
        assert all(p.grad is None for p in model.seed_parameters(slot_id)), slot_id
    assert all(p.grad is not None for p in model.seed_parameters(middle))


def test_closed_loop_gradient_is_that_of_the_model_with_the_seed_fully_in() -> None:
    """Oracle: the seed's gradient equals its gradient in a copy where it is blended at alpha 1 and the
    batch norms after the slot normalize with the running statistics that the host's forward left."""
    host, x, targets = _host_and_batch("cnn")
    model = _model_with_seed(host, "r0c1", "conv_light", Stage.TRAINING)
    blended = copy.deepcopy(model)
    drive_to(blended.slot("r0c1"), Stage.HOLDING)
    with torch.no_grad():
        blended.host(x)  # the host forward's update of the running statistics
    for segment in blended.host.segments[2:]:  # the layers after r0c1
        segment.eval()
    _loss(blended(x), targets).backward()
    _shadow_backward(model, x, targets)
    for parameter, reference in zip(model.seed_parameters("r0c1"), blended.seed_parameters("r0c1"), strict=True):
        assert parameter.grad is not None and reference.grad is not None
        torch.testing.assert_close(parameter.grad, reference.grad, rtol=1e-5, atol=1e-7)


def test_several_training_seeds_share_one_shadow_pass_each_seeing_only_itself() -> None:
    host, x, _ = _host_and_batch("cnn")
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    for index, slot_id in enumerate(("r0c0", "r0c2")):
        slot = model.germinate(slot_id, "conv_light")
        perturb_seed(slot, torch.Generator().manual_seed(index))
        drive_to(slot, Stage.TRAINING)
    model.eval()  # batch statistics would mix the two configurations; running ones do not
    with torch.enable_grad():
        _, shadow = model.forward_with_shadow(x)
    assert shadow is not None and shadow.slot_ids == ("r0c0", "r0c2")
    with torch.no_grad():
        separate = model.counterfactual_forward(x, [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(shadow.outputs.detach(), separate, rtol=0, atol=1e-5)


def test_training_seed_on_a_fixed_batch_lowers_the_loss_of_the_model_with_it_blended_in() -> None:
    host, x, targets = _host_and_batch("cnn")
    bare_host = copy.deepcopy(host)
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    slot = model.germinate("r0c1", "conv_light")
    drive_to(slot, Stage.TRAINING)
    optimizer = torch.optim.SGD(slot.seed_parameters(), lr=0.05)
    shadow_losses = []
    for _ in range(20):
        model.zero_grad(set_to_none=True)
        output, shadow = model.forward_with_shadow(x)
        assert torch.equal(output, bare_host(x))  # the host never sees the seed
        assert shadow is not None
        loss = _loss(shadow.outputs[0], targets)
        loss.backward(inputs=list(shadow.parameters))
        optimizer.step()
        shadow_losses.append(loss.item())
    assert shadow_losses[-1] < shadow_losses[0] - 0.1
    assert all(parameter.grad is None for parameter in host.parameters())


def test_training_seed_is_not_run_without_autograd() -> None:
    host, x, _ = _host_and_batch("cnn")
    model = _model_with_seed(host, "r0c1", "conv_light", Stage.TRAINING)
    calls: list[int] = []
    assert model.slot("r0c1").seed is not None
    model.slot("r0c1").seed.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        assert torch.equal(model(x), copy.deepcopy(host)(x))
        output, shadow = model.forward_with_shadow(x)
    assert shadow is None and torch.equal(output, copy.deepcopy(host)(x))
    assert calls == []


def _capture_slot(slot: SeedSlot) -> dict[str, Tensor]:
    """Records the slot's input `h`, its output, and (after backward) the gradients of both."""
    captured: dict[str, Tensor] = {}

    def hook(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        h = inputs[0]
        captured["h"], captured["out"] = h, output
        h.register_hook(lambda grad: captured.__setitem__("grad_h", grad))
        output.register_hook(lambda grad: captured.__setitem__("grad_out", grad))

    slot.register_forward_hook(hook)
    return captured


def _expected_host_gradient(kind: BlendKind, slot: SeedSlot, h: Tensor, grad_out: Tensor, alpha: float) -> Tensor:
    """Gradient reaching the host at the slot when the seed's output is a constant plus the skip path.

    add:      out = h + a (s - h) with d(s - h)/dh = 0            -> grad_out
    multiply: out = h (1 + a tanh(s - h))                         -> grad_out (1 + a tanh(s - h))
    gate:     out = h + a g(h) (s - h), only g(h) depends on h    -> via autograd of that formula
    """
    assert slot.seed is not None
    with torch.no_grad():
        s = slot.seed(h.detach())
    if kind is BlendKind.ADD:
        return grad_out
    if kind is BlendKind.MULTIPLY:
        return grad_out * (1.0 + alpha * torch.tanh(s - h.detach()))
    assert slot.blend is not None and slot.blend.gate is not None
    leaf = h.detach().requires_grad_(True)
    reference = leaf + alpha * slot.blend.gate(leaf) * (s - leaf.detach())
    (gradient,) = torch.autograd.grad(reference, leaf, grad_out)
    return gradient


@pytest.mark.parametrize("kind", list(BlendKind))
@pytest.mark.parametrize(("stage", "alpha"), [(Stage.BLENDING, 0.6), (Stage.HOLDING, 1.0)])
def test_detached_blended_seed_gives_host_only_its_skip_path_gradient(kind: BlendKind, stage: Stage,
                                                                       alpha: float) -> None:
    host, x, targets = _host_and_batch("cnn")
    model = _model_with_seed(host, "r0c1", "conv_heavy", stage, alpha=alpha, blend=kind)
    slot = model.slot("r0c1")
    assert slot.detach_input and slot.alpha.alpha == alpha
    captured = _capture_slot(slot)
    _loss(model(x), targets).backward()

    grad_h = captured["grad_h"]
    assert bool(grad_h.abs().sum() > 0)
    expected = _expected_host_gradient(kind, slot, captured["h"], captured["grad_out"], alpha)
    torch.testing.assert_close(grad_h, expected, rtol=1e-5, atol=1e-8)
    first_conv = host.segments[0][0]
    assert first_conv.weight.grad is not None and bool(first_conv.weight.grad.abs().sum() > 0)
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in slot.seed_parameters())


def test_an_attached_seed_does_pass_gradient_through_its_internals() -> None:
    """The same check fails for a seed that reads h directly: the check above can tell the difference."""
    host, x, targets = _host_and_batch("cnn")
    config = SlotConfig(detach_input=False, blend_epochs=0, gates=EASY_CONFIG.gates)
    model = MorphogeneticModel(host, config=config)
    slot = model.germinate("r0c1", "conv_heavy")
    perturb_seed(slot, torch.Generator().manual_seed(2))
    slot.record_signals(gradient_health=1.0)
    slot.advance(0)
    slot.advance(0)
    assert slot.stage is Stage.BLENDING and not slot.detach_input
    captured = _capture_slot(slot)
    _loss(model(x), targets).backward()
    assert not torch.allclose(captured["grad_h"], captured["grad_out"], rtol=1e-3, atol=1e-6)


def test_detach_default_per_topology() -> None:
    assert DETACH_AFTER_TRAINING == {"cnn": True, "cnn1d": True, "transformer": False, "mlp": False}
    assert SeedSlot("a", 8, "cnn").detach_input
    assert SeedSlot("a", 8, "cnn1d").detach_input
    assert not SeedSlot("a", 8, "transformer").detach_input
    assert not SeedSlot("a", 8, "cnn", SlotConfig(detach_input=False)).detach_input


def test_ramping_down_freezes_the_seed() -> None:
    host, x, targets = _host_and_batch("cnn")
    model = _model_with_seed(host, "r0c1", "conv_light", Stage.HOLDING)
    slot = model.slot("r0c1")
    slot.set_alpha_target(0.2, 3, epoch=0)
    assert slot.stage is Stage.BLENDING and slot.alpha.ramping
    _loss(model(x), targets).backward()
    assert all(p.grad is None and not p.requires_grad for p in slot.seed_parameters())
    for epoch in range(3):
        slot.step_epoch(epoch)
    assert not slot.alpha.ramping and slot.alpha.alpha == 0.2
    assert all(p.requires_grad for p in slot.seed_parameters())


@pytest.mark.parametrize("stage", [Stage.DORMANT, Stage.GERMINATED, Stage.PRUNED])
def test_empty_or_idle_slot_is_the_identity_and_never_runs_a_seed(stage: Stage) -> None:
    slot = SeedSlot("r0c0", 8, "cnn", EASY_CONFIG)
    if stage is not Stage.DORMANT:
        slot.germinate("conv_light")
        perturb_seed(slot, torch.Generator().manual_seed(0))
        assert slot.seed is not None
        slot.seed.register_forward_hook(lambda *_: pytest.fail("seed ran"))
    if stage is Stage.PRUNED:
        slot.prune(0)
    h = torch.randn(2, 8, 4, 4, requires_grad=True)
    assert slot(h) is h
