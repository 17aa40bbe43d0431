"""Growth inside the user's own training loop (`morphogen.Grower`) and under a real `lightning.Trainer`."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import re
import sys
import warnings
from collections.abc import Callable

import pytest
import torch
from models import blobs, eager_config, mlp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import morphogen
from morphogen import Grower
from morphogen.control.controller import NoGrowthController
from morphogen.control.growth_choice import best_growth
from morphogen.core.lifecycle import BLENDED_STAGES, Stage
from morphogen.core.slot import SeedSlot
from morphogen.env.governor import DivergenceError


def make_grower(epochs: int = 5, **options: object) -> tuple[Grower, DataLoader[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    train, validation = blobs(192, 0), blobs(96, 1)
    host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=train[0][:2])
    config = eager_config(epochs)
    grower = Grower(host, validation, epochs=epochs, episode=config.episode, heuristic=config.heuristic,
                    **options)  # type: ignore[arg-type]
    return grower, DataLoader(TensorDataset(*train), batch_size=32, shuffle=True)


def train_epoch(grower: Grower, loader: DataLoader[tuple[torch.Tensor, ...]], optimizer: torch.optim.Optimizer
                ) -> morphogen.EpochReport:
    """One epoch of the README's loop: step, backward, `after_backward`, the optimizer; then `end_epoch`."""
    for inputs, targets in loader:
        optimizer.zero_grad()
        grower.training_step(inputs, targets).backward()
        grower.after_backward()
        optimizer.step()
    return grower.end_epoch()


def test_an_own_loop_with_adamw_a_scheduler_and_bf16_autocast_grows_seeds() -> None:
    grower, loader = make_grower()
    optimizer = torch.optim.AdamW(grower.model.host_parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 5)
    host_before = [p.detach().clone() for p in grower.model.host_parameters()]
    reports = []
    for _ in range(5):
        for inputs, targets in loader:
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = grower.training_step(inputs, targets)
            loss.backward()
            grower.after_backward()
            optimizer.step()
        schedule.step()
        reports.append(grower.end_epoch())
    assert [r.epoch for r in reports] == [1, 2, 3, 4, 5] and grower.done and reports[-1].next_action is None
    assert reports[1].action.startswith("GERMINATE") and reports[1].succeeded
    assert any(slot.stage in BLENDED_STAGES for slot in grower.model.slots())
    assert reports[-1].parameters > reports[0].parameters  # a seed was blended in
    assert reports[-1].score > 80.0
    assert any(not torch.equal(a, b) for a, b in zip(host_before, grower.model.host_parameters(), strict=True))


def test_a_bfloat16_models_epoch_loss_is_the_mean_of_its_batch_losses() -> None:
    # 384 batches of 1 sample: summed in bfloat16 (8 bits of mantissa) the epoch's loss lost most batches' losses.
    torch.manual_seed(0)
    train, validation = blobs(384, 0), blobs(64, 1)
    host = morphogen.host_from_module(mlp().bfloat16(), ["1", "3"], example_input=train[0][:2].bfloat16())
    grower = Grower(host, (validation[0].bfloat16(), validation[1]), epochs=2, controller=NoGrowthController())
    optimizer = torch.optim.SGD(host.parameters(), lr=1e-3)
    losses = []
    for inputs, targets in zip(train[0].bfloat16().split(1), train[1].split(1), strict=True):
        optimizer.zero_grad()
        loss = grower.training_step(inputs, targets)
        loss.backward()
        grower.after_backward()
        optimizer.step()
        losses.append(loss.item())
    report = grower.end_epoch()
    assert report.snapshot.train_loss == pytest.approx(sum(losses) / len(losses), rel=1e-4)
    assert round(report.score * 64 / 100, 4).is_integer()  # a share of the 64 validation samples


def test_a_depth_blueprint_the_slots_cannot_take_is_a_warning_when_the_grower_is_built() -> None:
    """`run` prints a note after its first epoch; an own loop prints nothing, so the Grower warns, naming the slots and
    what the heuristic does instead (it grew seed by seed without a word)."""
    train, validation = blobs(64, 0), blobs(32, 1)
    host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=train[0][:2])
    with pytest.warns(UserWarning, match=r"^\[heuristic\] depth_blueprint = 'block_copy' cannot be grafted into 1, 3 "
                                         r"\(.*\); the heuristic grows seed by seed instead$"):
        Grower(host, validation, epochs=3, config={"heuristic": {"depth_blueprint": "block_copy"}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Grower(host, validation, epochs=3, config={"heuristic": {"depth_blueprint": "branch_wide"}})


def test_a_training_seed_learns_from_its_shadow_and_the_host_from_its_own_loss() -> None:
    grower, loader = make_grower()
    optimizer = torch.optim.SGD(grower.model.host_parameters(), lr=0.05)
    train_epoch(grower, loader, optimizer)  # epoch 1 waits; the controller germinates at its end, for epoch 2
    training = [slot for slot in grower.model.slots() if slot.stage is Stage.TRAINING]
    assert training, "the controller germinated a seed"
    before = [p.detach().clone() for p in training[0].seed_parameters()]
    inputs, targets = next(iter(loader))
    optimizer.zero_grad()
    grower.training_step(inputs, targets).backward()
    grower.after_backward()
    assert any(not torch.equal(a, b) for a, b in zip(before, training[0].seed_parameters(), strict=True))


def test_an_optimizer_built_on_the_hosts_parameters_trains_the_grown_model_and_your_network() -> None:
    """The Grower grows the host it is given, not a copy: an optimizer built on `host.parameters()` before it (as
    the README writes) steps the parameters the model trains with, and the user's network holds them."""
    torch.manual_seed(0)
    (train, targets), validation = blobs(192, 0), blobs(96, 1)
    network = mlp()
    host = morphogen.host_from_module(network, ["1", "3"], example_input=train[:2])
    optimizer = torch.optim.SGD(host.parameters(), lr=0.1)
    config = eager_config(3)
    grower = Grower(host, validation, epochs=3, optimizer=optimizer, episode=config.episode,
                    heuristic=config.heuristic)
    assert grower.model.host is host
    before = [p.detach().clone() for p in network.parameters()]
    scores = []
    for _ in range(3):
        for start in range(0, 192, 32):
            optimizer.zero_grad()
            grower.training_step(train[start:start + 32], targets[start:start + 32]).backward()
            grower.after_backward()
            optimizer.step()
        scores.append(grower.end_epoch().score)
    assert all(not torch.equal(a, b) for a, b in zip(before, network.parameters(), strict=True))
    assert scores[-1] > scores[0] and scores[-1] > 80.0
    network.eval(), grower.model.eval()
    if not any(slot.stage in BLENDED_STAGES for slot in grower.model.slots()):
        assert torch.equal(network(validation[0]), grower.model(validation[0]))


def test_the_last_reported_score_is_the_score_of_the_model_the_grower_leaves_and_exports() -> None:
    grower, loader = make_grower(epochs=5)  # these settings end the episode with a seed blending at alpha 2/3
    optimizer = torch.optim.SGD(grower.model.host_parameters(), lr=0.1)
    reports = [train_epoch(grower, loader, optimizer) for _ in range(5)]
    assert reports[-1].stages["1"] == "blending" and grower.model.slot("1").alpha.alpha == pytest.approx(2 / 3)
    inputs, targets = blobs(96, 1)
    grower.model.eval()
    with torch.no_grad():
        outputs = grower.model(inputs)
        assert (outputs.argmax(1) == targets).float().mean().item() * 100 == pytest.approx(reports[-1].score)
        torch.testing.assert_close(morphogen.grown_network(grower.model)(inputs), outputs, rtol=0, atol=1e-5)


def test_inputs_of_another_dtype_than_the_model_say_so_wherever_they_first_meet_it() -> None:
    inputs, targets = blobs(96, 1)
    doubles = inputs.double()  # numpy's default dtype, against a float32 model
    with pytest.raises(morphogen.HostBuildError, match=r"the inputs are float64, the model's parameters float32"):
        morphogen.host_from_module(mlp(), ["1"], example_input=doubles[:2])
    host = morphogen.host_from_module(mlp(), ["1"], example_input=inputs[:2])
    with pytest.raises(morphogen.DataError, match=r"the inputs are float64, the model's parameters float32: convert"):
        Grower(host, (doubles, targets), epochs=2)
    grower = Grower(host, (inputs, targets), epochs=2)
    with pytest.raises(ValueError, match=r"training_step: the inputs are float64, .*\(x.to\(torch.float32\)\)"):
        grower.training_step(doubles[:8], targets[:8])
    assert grower.training_step(inputs[:8], targets[:8]).isfinite()


def test_integer_inputs_to_a_float_model_say_to_convert_them_and_token_ids_do_not() -> None:
    """uint8 pixels fed to a float model: the hint names their dtype at host_from_module and at the first validation
    (where the cross-entropy hint misled); ids an embedding reads, failing for another reason, get no such hint, nor do
    inputs the model takes when the loss is what refuses the targets' dtype."""
    images = torch.randint(0, 256, (16, 1, 4, 4), dtype=torch.uint8)
    labels = torch.arange(16) % 3
    convolution = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                      torch.nn.Linear(64, 3))
    with pytest.raises(morphogen.HostBuildError, match=r"\(the inputs are uint8, the model's parameters float32: "
                                                       r"convert the inputs \(x.to\(torch.float32\), scaled as"):
        morphogen.host_from_module(convolution, ["1"], example_input=images[:2])
    host = morphogen.host_from_module(convolution, ["1"], example_input=images[:2].float())
    with pytest.raises(morphogen.DataError, match=r"^task 'own loop': the inputs are uint8, the model's parameters "
                                                  r"float32: convert the inputs"):
        Grower(host, (images, labels), epochs=2)
    ids = torch.randint(0, 5, (16, 6))
    embedding = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Flatten(), torch.nn.Linear(24, 3))
    with pytest.raises(morphogen.HostBuildError) as raised:
        morphogen.host_from_module(embedding, ["1"], example_input=ids[:2] + 5)  # ids beyond the vocabulary
    assert "convert the inputs" not in str(raised.value)
    token_host = morphogen.host_from_module(embedding, ["1"], example_input=ids[:2])
    with pytest.raises(morphogen.DataError) as raised:
        Grower(token_host, (ids, labels.float()), epochs=2)  # float targets: the loss refuses them
    assert "convert the inputs" not in str(raised.value)


def test_a_models_state_loaded_around_the_grower_is_refused_when_the_next_epoch_begins() -> None:
    grower, loader = make_grower(epochs=5)
    for _ in range(3):
        report = train_epoch(grower, loader, torch.optim.SGD(grower.model.host_parameters(), lr=0.1))
    assert report.stages["1"] != "dormant"
    fresh, _ = make_grower(epochs=5)
    fresh.model.load_state_dict(grower.model.state_dict())  # the usual torch way, which skips the growth's state
    inputs, targets = next(iter(loader))
    with pytest.raises(RuntimeError, match=r"slot 1 holds \w+ \w+, where the Grower left it dormant\): .* load "
                                           r"grower.load_state_dict\(state\)"):
        fresh.training_step(inputs, targets)
    while not grower.done:
        train_epoch(grower, loader, torch.optim.SGD(grower.model.host_parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match=r"episode is over .* train grower.model on as any module"):
        grower.training_step(inputs, targets)


def test_after_backward_before_the_backward_says_so() -> None:
    grower, loader = make_grower()
    inputs, targets = next(iter(loader))
    loss = grower.training_step(inputs, targets)
    with pytest.raises(RuntimeError, match=r"found no gradient on the host: call it after training_step\(\)'s "
                                           r"loss.backward\(\)"):
        grower.after_backward()
    loss.backward()
    grower.after_backward()  # the same step, now in order


def test_an_optimizer_that_is_not_the_hosts_is_refused_when_the_grower_is_built() -> None:
    host = morphogen.host_from_module(mlp(), ["1"], example_input=torch.randn(2, 12))
    validation = blobs(32, 1)
    optimizer = torch.optim.SGD(host.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"optimizer= is your host's torch.optim optimizer .*got StepLR"):
        Grower(host, validation, epochs=2, optimizer=torch.optim.lr_scheduler.StepLR(optimizer, 1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got SGD"):
        Grower(host, validation, epochs=2, optimizer=torch.optim.SGD)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"holds none of the host's parameters"):
        Grower(host, validation, epochs=2, optimizer=torch.optim.SGD(mlp().parameters(), lr=0.1))


def test_a_state_saved_by_another_grower_is_refused_in_one_line_before_anything_loads() -> None:
    grower, loader = make_grower(epochs=4)
    train_epoch(grower, loader, torch.optim.SGD(grower.model.host_parameters(), lr=0.1))
    state = grower.state_dict()
    other_epochs, _ = make_grower(epochs=6)
    with pytest.raises(ValueError, match=r"not built as the saved one was: it was saved with epochs=4, this one has "
                                         r"epochs=6"):
        other_epochs.load_state_dict(state)
    validation = blobs(96, 1)
    wider = Grower(morphogen.host_from_module(mlp(hidden=24), ["1", "3"], example_input=validation[0][:2]),
                   validation, epochs=4)
    with pytest.raises(ValueError, match=r"its host holds shape \(16, 12\) for .*weight, this one shape \(24, 12\)"):
        wider.load_state_dict(state)
    fewer_slots = Grower(morphogen.host_from_module(mlp(), ["1"], example_input=validation[0][:2]), validation,
                         epochs=4)
    with pytest.raises(ValueError, match=r"it was saved with slots 1, 3, this one has 1;"):
        fewer_slots.load_state_dict(state)
    assert fewer_slots.training_step(validation[0][:8], validation[1][:8]).isfinite()  # nothing was loaded
    not_growing = Grower(morphogen.host_from_module(mlp(), ["1", "3"], example_input=validation[0][:2]),
                         validation, epochs=4, controller=NoGrowthController())
    with pytest.raises(ValueError, match=r"saved by a 'HeuristicController' controller, this one has "
                                         r"'NoGrowthController'"):
        not_growing.load_state_dict(state)
    partial = {key: value for key, value in state.items() if key not in ("controller", "applied")}
    with pytest.raises(ValueError, match=r"^not a whole Grower state: it lacks controller, applied \(save it"):
        other_epochs.load_state_dict(partial)  # was a KeyError from inside


def test_a_forgotten_after_backward_is_an_error_naming_it() -> None:
    grower, loader = make_grower()
    for inputs, targets in loader:
        grower.training_step(inputs, targets).backward()
    with pytest.raises(RuntimeError, match=r"after_backward\(\) was called for 0 of 6 batches this epoch"):
        grower.end_epoch()
    grower, loader = make_grower()
    grower.training_step(*next(iter(loader))).backward()
    grower.after_backward()
    with pytest.raises(RuntimeError, match=r"called more often than training_step"):
        grower.after_backward()


class MaskedMLP(nn.Module):
    """The MLP of `mlp()` called with two inputs, `model(x, mask)`: the same layers on the masked features."""

    def __init__(self, layers: nn.Sequential) -> None:
        super().__init__()
        self.layers = layers

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.layers(x * mask)


def test_a_model_of_two_inputs_trains_in_an_own_loop_and_is_charged_the_flops_of_its_layers() -> None:
    """Batches of `(x, mask)` go through `training_step` as the model takes them; the episode charges them what the
    same layers cost on one tensor (the mask's product is element-wise: FlopCounterMode counts none). Validation
    given as one dict with its labels (`target_key`) calls the model by name."""
    (train, targets), validation = blobs(192, 0), blobs(96, 1)
    layers = mlp()
    accounts, scores = [], []
    for network, slots, wrap, target_key in (
            (copy.deepcopy(layers), ["1", "3"], lambda x: x, None),
            (MaskedMLP(copy.deepcopy(layers)), ["layers.1", "layers.3"], lambda x: (x, torch.ones_like(x)), None),
            (MaskedMLP(copy.deepcopy(layers)), ["layers.1", "layers.3"],
             lambda x: {"mask": torch.ones_like(x), "x": x}, "label")):
        host = morphogen.host_from_module(network, slots, example_input=wrap(train[:2]))
        split = ({**wrap(validation[0]), "label": validation[1]} if target_key  # type: ignore[dict-item]
                 else (wrap(validation[0]), validation[1]))
        grower = Grower(host, split, epochs=2, controller=NoGrowthController(), target_key=target_key)
        optimizer = torch.optim.SGD(grower.model.host_parameters(), lr=0.1)
        for _ in range(2):
            for start in range(0, 192, 32):
                optimizer.zero_grad()
                grower.training_step(wrap(train[start:start + 32]), targets[start:start + 32]).backward()
                grower.after_backward()
                optimizer.step()
            report = grower.end_epoch()
        accounts.append(grower.episode.compute.as_dict())
        scores.append(report.score)
    assert accounts[2] == accounts[1] == accounts[0] and accounts[1]["training"] > 0 and accounts[1]["validation"] > 0
    assert scores[2] == scores[1] == scores[0]  # the same layers from the same seed, on inputs masked by ones


def test_inputs_that_are_not_tensors_are_one_clear_error_at_the_first_step() -> None:
    grower, loader = make_grower()
    inputs, targets = next(iter(loader))
    with pytest.raises(ValueError, match=r"inputs must be a tensor, .*got a tuple of Tensor, list: every input"):
        grower.training_step((inputs, [1, 2]), targets)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"as the host's example_input was; got a tuple where the host takes one "
                                         r"tensor"):
        grower.training_step((inputs,), targets)
    grower.training_step(inputs, targets).backward()  # nothing was counted: the grower goes on
    grower.after_backward()
    assert grower.end_epoch().parameters > 0


def test_end_epoch_after_the_last_epoch_says_the_episode_is_over_and_the_network_stays_in_training_mode() -> None:
    """Past the last epoch, `end_epoch` says what `training_step` says (it said an epoch had no training_step).
    Validation runs in eval mode and gives the user's network back in training mode, which the loop goes on in."""
    grower, loader = make_grower(epochs=2)
    optimizer = torch.optim.SGD(grower.model.host_parameters(), lr=0.1)
    for _ in range(2):
        report = train_epoch(grower, loader, optimizer)
        assert all(module.training for module in grower.model.modules()), f"after epoch {report.epoch}"
    with pytest.raises(RuntimeError, match=r"^end_epoch\(\) after the last epoch: the growth episode is over "
                                           r"\(all its epochs were played\); build a new Grower"):
        grower.end_epoch()


@pytest.mark.parametrize("no_gradients", [torch.no_grad, torch.inference_mode])
def test_end_epoch_called_without_gradients_grows_as_it_does_with_them(
        no_gradients: Callable[[], contextlib.AbstractContextManager[None]]) -> None:
    """A loop that wraps `end_epoch` as it wraps a validation: the growth signals took no gradients there and
    failed in the FLOP count of the first epoch's measurements; under inference mode a new seed would never train."""

    def reports(wrapped: bool) -> list[tuple[float, str, dict[str, str]]]:
        grower, loader = make_grower(epochs=4)
        optimizer = torch.optim.SGD(grower.model.host_parameters(), lr=0.1)
        seen = []
        for _ in range(4):
            for inputs, targets in loader:
                optimizer.zero_grad()
                grower.training_step(inputs, targets).backward()
                grower.after_backward()
                optimizer.step()
            with no_gradients() if wrapped else contextlib.nullcontext():
                report = grower.end_epoch()
            seen.append((report.score, report.action, report.stages))
        return seen

    wrapped = reports(wrapped=True)
    assert any(stages["1"] == "blending" for _, _, stages in wrapped)  # a seed germinated under it, trained, blended
    assert wrapped == reports(wrapped=False)


def test_a_frozen_backbones_batch_norm_the_loop_put_in_eval_mode_keeps_its_statistics_while_seeds_grow() -> None:
    """`net.backbone.eval()` as fine-tuning freezes batch norm: every training_step put the whole model back in
    training mode, and its running statistics drifted with each batch. A model the loop put wholly in eval mode (it
    validated it itself) trains again at the next step in the modes it trained in."""
    torch.manual_seed(0)
    train, validation = blobs(192, 0), blobs(96, 1)
    net = nn.Sequential(nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16)), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                        nn.Linear(16, 3))
    backbone = net[0]
    backbone.requires_grad_(False)
    backbone.eval()  # frozen: its batch norm keeps the statistics it was trained with
    statistics = [buffer.clone() for buffer in backbone.buffers()]
    host = morphogen.host_from_module(net, ["1", "3"], example_input=train[0][:2])
    config = eager_config(4)
    optimizer = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.05)
    grower = Grower(host, validation, epochs=4, episode=config.episode, heuristic=config.heuristic)
    trained = net[2].weight.clone()
    loader = DataLoader(TensorDataset(*train), batch_size=32, shuffle=True)
    for _ in range(3):
        train_epoch(grower, loader, optimizer)
        assert not any(module.training for module in backbone.modules()) and net[2].training
    assert any(slot.stage is not Stage.DORMANT for slot in grower.model.slots())
    assert all(torch.equal(a, b) for a, b in zip(statistics, backbone.buffers(), strict=True))
    assert not torch.equal(trained, net[2].weight)
    for validated in (net, grower.model):  # the loop validates, and goes on without .train()
        validated.eval()
        grower.training_step(*next(iter(loader)))
        assert not any(module.training for module in backbone.modules()) and net[2].training
        assert all(module.training for slot in grower.model.slots() for module in slot.modules())


@pytest.mark.parametrize(("epochs", "message"), [
    (0, "Grower's epochs must be >= 1, got 0"), (2.5, "Grower's epochs must be an integer, got 2.5")])
def test_epochs_a_grower_cannot_play_are_refused_naming_its_argument(epochs: object, message: str) -> None:
    validation = blobs(32, 1)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=validation[0][:2])
    with pytest.raises(ValueError, match=f"^{message}$"):
        Grower(host, validation, epochs=epochs)  # type: ignore[arg-type]


def test_an_epoch_without_training_is_an_error_naming_training_step() -> None:
    grower, _ = make_grower()
    with pytest.raises(RuntimeError, match=r"end_epoch\(\) without a training_step\(\)"):
        grower.end_epoch()


def test_a_grower_that_keeps_diverging_names_the_learning_rates_a_user_sets() -> None:
    """The host of a Grower is stepped by the user's optimizer: the advice is its learning rate and the seeds',
    not `episode.optimizer.host_lr`, which a Grower never reads."""
    train, validation = blobs(64, 0), blobs(32, 1)
    host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=train[0][:2])
    optimizer = torch.optim.SGD(host.parameters(), lr=0.1)
    grower = Grower(host, validation, epochs=3, optimizer=optimizer,
                    config={"episode": {"governor": {"max_consecutive_rollbacks": 1}}})
    optimizer.zero_grad()
    grower.training_step(torch.full_like(train[0], float("nan")), train[1]).backward()
    grower.after_backward()
    optimizer.step()
    with pytest.raises(DivergenceError, match=r"diverged 1 epochs in a row .*; lower your optimizer's learning rate "
                                              r"\(it steps the host\) or the seeds' seed_lr \(Grower\(config="):
        grower.end_epoch()


def test_fp16_grad_scaler_and_gradient_accumulation() -> None:
    grower, loader = make_grower(epochs=3)
    optimizer = torch.optim.AdamW(grower.model.host_parameters(), lr=2e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for _ in range(3):
        for index, (inputs, targets) in enumerate(loader):
            loss = grower.training_step(inputs, targets) / 2  # two micro-batches per optimizer step
            scaler.scale(loss).backward()
            grower.after_backward(scaler)
            if index % 2 == 1:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        report = grower.end_epoch()
    assert report.score > 60.0 and all(torch.isfinite(p).all() for p in grower.model.parameters())


def seeds_after_a_step(stage: Stage, scaler: torch.amp.GradScaler | None) -> list[torch.Tensor]:
    """The parameters of the first seed in `stage` after one more step of the README's loop, its loss scaled by
    `scaler` where given (no autocast: the scale is the only difference), and the gradient health's sums over that
    step (norm, vanishing and exploding counts)."""
    grower, loader = make_grower()
    optimizer = torch.optim.SGD(grower.model.host_parameters(), lr=0.1)
    def found() -> list[SeedSlot]:  # a blended seed at alpha 0 (its first blending epoch) would get no gradient
        return [slot for slot in grower.model.slots()
                if slot.stage is stage and (stage is Stage.TRAINING or slot.alpha.alpha > 0.0)]

    while not found():
        train_epoch(grower, loader, optimizer)
    seed = found()[0]
    inputs, targets = next(iter(loader))
    optimizer.zero_grad()
    loss = grower.training_step(inputs, targets)
    (loss if scaler is None else scaler.scale(loss)).backward()
    grower.after_backward(scaler)
    health = grower.episode.monitor.collect().seed_sums[seed.slot_id]
    return [*(p.detach().clone() for p in seed.seed_parameters()), health.clone()]


def test_a_grad_scaler_unscales_the_blended_seeds_gradients_and_leaves_the_training_seeds_alone() -> None:
    """A TRAINING seed learns from its shadow loss, which `training_step` backpropagates unscaled: with a
    `GradScaler` it takes the very step it takes without one. A blended seed's gradients came through the user's
    scaled loss: unscaled before the gradient health reads them, its step and health are the unscaled run's too."""
    for stage in (Stage.TRAINING, Stage.BLENDING):
        plain = seeds_after_a_step(stage, None)
        scaled = seeds_after_a_step(stage, torch.amp.GradScaler("cpu", init_scale=1024.0))
        assert plain[-1][0] > 0.0, f"the {stage.value} seed has a gradient"
        for a, b in zip(plain, scaled, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=f"a {stage.value} seed")


lightning = pytest.importorskip("lightning.pytorch", reason="the lightning extra is not installed")
from lightning_module import GrowingModule  # noqa: E402  # needs the extra checked just above


def test_a_lightning_trainer_grows_the_model_through_the_callback(tmp_path: object) -> None:
    from morphogen.lightning import GrowthCallback

    grower, loader = make_grower(epochs=4)
    callback = GrowthCallback(grower)
    trainer = lightning.Trainer(max_epochs=4, callbacks=[callback], accelerator="cpu", logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                default_root_dir=str(tmp_path))
    trainer.fit(GrowingModule(grower), loader)
    assert [r.epoch for r in callback.reports] == [1, 2, 3, 4] and grower.done
    assert any(r.action.startswith("GERMINATE") and r.succeeded for r in callback.reports)
    assert callback.reports[-1].parameters > callback.reports[0].parameters


def test_the_lightning_callback_under_a_trainer_of_pytorch_lightning_says_which_package_it_needs(
        tmp_path: object) -> None:
    """The standalone `pytorch_lightning` package has classes of its own: the callback failed at its second hook,
    in Lightning's `is_overridden` ("ValueError: Expected a parent"), and its checkpoint checks saw no checkpoint."""
    standalone = pytest.importorskip("pytorch_lightning")
    from morphogen.lightning import GrowthCallback

    grower, loader = make_grower(epochs=2)

    class StandaloneModule(standalone.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = grower.model

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_index: int) -> torch.Tensor:
            return grower.training_step(*batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.model.host_parameters(), lr=1e-2)

    trainer = standalone.Trainer(max_epochs=2, callbacks=[GrowthCallback(grower)], accelerator="cpu", logger=False,
                                 enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                 default_root_dir=str(tmp_path))
    with pytest.raises(TypeError, match=r"^GrowthCallback is a callback of the lightning package \(lightning.pytorch"
                                        r"\), given to a pytorch_lightning Trainer, .*import lightning.pytorch as pl"):
        trainer.fit(StandaloneModule(), loader)
    assert grower.snapshot.epoch == 0


def test_the_lightning_callback_without_lightning_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lightning", None)  # as if `morphogen[lightning]` were not installed
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.delitem(sys.modules, "morphogen.lightning", raising=False)
    with pytest.raises(ImportError, match=r"^morphogen.lightning needs PyTorch Lightning: pip install "
                                          r"'morphogen\[lightning\]'$"):
        importlib.import_module("morphogen.lightning")


@pytest.mark.parametrize(("trainer_options", "callback_options", "message"), [
    ({"max_epochs": 5}, {}, r"the Trainer trains 5 epochs \(max_epochs=5; Lightning's default is 1000\), past the "
                            r"grower's 4: give Trainer\(max_epochs=4\)"),
    ({}, {}, r"the Trainer trains 1000 epochs \(max_epochs=1000; .*give Trainer\(max_epochs=4\)"),
    ({"max_steps": 13}, {"every_n_steps": 3}, r"Trainer\(max_steps=13\) trains past the grower's 4 periods of "
                                              r"every_n_steps=3: give Trainer\(max_steps=12\)"),
], ids=["more_epochs", "lightnings_default", "more_steps"])
def test_a_trainer_set_to_train_past_the_growth_is_refused_before_the_first_batch(
        trainer_options: dict[str, int], callback_options: dict[str, int], message: str, tmp_path: object) -> None:
    """It trained the grower's epochs, then failed at the next epoch's first batch (the episode is over)."""
    from morphogen.lightning import GrowthCallback

    grower, loader = make_grower(epochs=4)
    trainer = lightning.Trainer(callbacks=[GrowthCallback(grower, **callback_options)], accelerator="cpu",
                                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, default_root_dir=str(tmp_path), **trainer_options)
    with pytest.raises(ValueError, match=rf"^GrowthCallback: {message}; after the growth's last period"):
        trainer.fit(GrowingModule(grower), loader)
    assert grower.snapshot.epoch == 0


def test_a_trainer_set_to_train_past_the_periods_a_resumed_grower_has_left_is_refused_before_the_first_batch(
        tmp_path: object) -> None:
    """A grower resumed with `load_state_dict` at its second of four periods: `Trainer(max_epochs=4)` was let through
    (it compared the grower's whole four), trained two epochs and failed at the third's first batch."""
    from morphogen.lightning import GrowthCallback

    first, loader = make_grower(epochs=4)
    optimizer = torch.optim.AdamW(first.model.host_parameters(), lr=1e-2)
    for _ in range(2):
        train_epoch(first, loader, optimizer)
    state = first.state_dict()

    def fit(every_n_steps: int | None = None, **trainer_options: int) -> GrowthCallback:
        grower, loader = make_grower(epochs=4)
        grower.load_state_dict(state)
        callback = GrowthCallback(grower, every_n_steps=every_n_steps)
        trainer = lightning.Trainer(callbacks=[callback], accelerator="cpu", logger=False, enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False,
                                    default_root_dir=str(tmp_path), **trainer_options)
        trainer.fit(GrowingModule(grower), loader)
        return callback

    with pytest.raises(ValueError, match=r"^GrowthCallback: the Trainer trains 4 epochs \(max_epochs=4; .*\), past the "
                                         r"grower's 4 \(2 of them played\): give Trainer\(max_epochs=2\); after the"):
        fit(max_epochs=4)
    with pytest.raises(ValueError, match=r"^GrowthCallback: Trainer\(max_steps=12\) trains past the grower's 4 periods "
                                         r"of every_n_steps=3 \(2 of them played\): give Trainer\(max_steps=6\)"):
        fit(every_n_steps=3, max_steps=12, max_epochs=-1)
    for callback in (fit(max_epochs=2), fit(every_n_steps=3, max_steps=6, max_epochs=-1)):
        assert [report.epoch for report in callback.reports] == [3, 4] and callback.grower.done


def test_the_grower_measures_the_growth_signals_its_heuristic_chooses_by() -> None:
    """As in `run`, a heuristic choosing by signal gets every empty slot's growth signals in the user's loop, and
    germinates the candidate they score best."""
    torch.manual_seed(0)
    train, validation = blobs(192, 0), blobs(96, 1)
    host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=train[0][:2])
    config = eager_config(5)
    # The first seed left to the signals too (by default it is a branch, chosen without them).
    grower = Grower(host, validation, epochs=5, episode=config.episode,
                    heuristic=dataclasses.replace(config.heuristic, choice="signal", first_seed=""))
    optimizer = torch.optim.SGD(grower.model.host_parameters(), lr=0.1)
    for inputs, targets in DataLoader(TensorDataset(*train), batch_size=32):
        optimizer.zero_grad()
        grower.training_step(inputs, targets).backward()
        grower.after_backward()
        optimizer.step()
    report = grower.end_epoch()
    slots = grower.snapshot.slots
    assert all(slot.depth_signal is not None for slot in slots)
    best = best_growth(slots, [slot.slot_id for slot in slots], "mlp", "wider")  # the rotation's first, and widening
    assert best is not None and report.next_action is not None
    assert report.next_action.startswith(f"GERMINATE {best.blueprint}@{best.slot} ")


def test_a_seed_trains_with_the_growers_sgd_whatever_the_hosts_optimizer_and_config_changes_it() -> None:
    """What the README says the seeds get: SGD at 0.01, momentum 0.9, no weight decay, beside the user's AdamW;
    `config={"episode": {"optimizer": ...}}` gives them another."""
    eager = {"heuristic": {"warmup_epochs": 0, "plateau_epochs": 1, "plateau_threshold": 1e9,
                           "loss_plateau_threshold": 1e9, "relative_plateau_threshold": 1e9, "min_training_epochs": 1},
             "episode": {"slots": {"gates": {"mode": "permissive", "min_training_epochs": 1}, "blend_epochs": 3}}}
    train, validation = blobs(192, 0), blobs(96, 1)
    loader = DataLoader(TensorDataset(*train), batch_size=32)
    for optimizer_table, kind, settings in (
            ({}, torch.optim.SGD, {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.0}),
            ({"name": "adamw", "seed_lr": 1e-3, "seed_weight_decay": 0.01}, torch.optim.AdamW,
             {"lr": 1e-3, "weight_decay": 0.01})):
        torch.manual_seed(0)
        host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=train[0][:2])
        config = {**eager, "episode": {**eager["episode"], "optimizer": optimizer_table}}
        grower = Grower(host, validation, epochs=5, config=config)
        optimizer = torch.optim.AdamW(host.parameters(), lr=1e-2)
        train_epoch(grower, loader, optimizer)  # the seed germinated at its end trains from the next batch
        grower.training_step(*next(iter(loader))).backward()
        grower.after_backward()
        (_, seed_optimizer), = grower.episode.trainer.seed_optimizers.values()
        assert type(seed_optimizer) is kind and seed_optimizer is not optimizer
        assert {key: seed_optimizer.param_groups[0][key] for key in settings} == settings


def test_a_grower_takes_its_settings_as_grow_does() -> None:
    """`config=` a preset's name or a mapping of tables gives the Grower the episode and heuristic settings."""
    train, validation = blobs(64, 0), blobs(32, 1)
    host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=train[0][:2])
    lean = Grower(host, validation, epochs=3, config="grow_lean")
    assert lean.controller.config.widening == "wider_half"  # type: ignore[attr-defined]
    tables = Grower(host, validation, epochs=3, config={"heuristic": {"warmup_epochs": 7},
                                                        "episode": {"slots": {"gates": {"criterion": "loss"}}}})
    assert tables.controller.config.warmup_epochs == 7  # type: ignore[attr-defined]
    assert tables.episode.config.max_epochs == 3 and tables.episode.config.slots.gates.criterion.value == "loss"
    with pytest.raises(ValueError, match="give config, or episode and heuristic, not both"):
        Grower(host, validation, epochs=3, config="grow_lean", heuristic=tables.controller.config)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"give controller= or policy=, not both"):
        Grower(host, validation, epochs=3, policy="default", controller=NoGrowthController())


class SeedMoves(lightning.Callback):
    """How far the TRAINING seeds' parameters moved in each epoch (placed before the `GrowthCallback`, which
    advances the stages at the epoch's end)."""

    def __init__(self, grower: Grower) -> None:
        self.grower, self.before, self.moved = grower, [torch.empty(0)], [0.0]

    def training_seeds(self) -> list[torch.Tensor]:
        return [p for slot in self.grower.model.slots() if slot.stage is Stage.TRAINING for p in slot.seed_parameters()]

    def on_train_epoch_start(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule) -> None:
        self.before = [p.detach().clone() for p in self.training_seeds()]

    def on_train_epoch_end(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule) -> None:
        now = self.training_seeds()
        moved = sum((p.detach() - b).norm().item() for p, b in zip(now, self.before, strict=True))
        self.moved.append(moved if self.before else 0.0)


def test_under_lightnings_16_bit_mixed_precision_a_training_seed_learns_as_in_32_bit(tmp_path: object) -> None:
    """The callback passes the precision plugin's `GradScaler` to `after_backward`; the TRAINING seed's unscaled
    shadow gradients are not divided by its scale (65536), so the seed moves about as far as in full precision."""
    from lightning.pytorch.plugins import MixedPrecision

    from morphogen.lightning import GrowthCallback

    moved = {}
    # On a CPU, Trainer(precision="16-mixed") turns itself into bf16-mixed, without a scaler: the plugin is given.
    for precision, plugins in (("32-true", []), ("16-mixed", [MixedPrecision("16-mixed", "cpu")])):
        grower, loader = make_grower(epochs=5)  # germinates after epoch 1; two epochs of the five are enough
        moves = SeedMoves(grower)
        trainer = lightning.Trainer(max_epochs=2, plugins=plugins, callbacks=[moves, GrowthCallback(grower)],
                                    accelerator="cpu", logger=False, enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False,
                                    default_root_dir=str(tmp_path))
        trainer.fit(GrowingModule(grower), loader)
        assert moves.moved[1] == 0.0 and moves.before, "the seed germinated after epoch 1 trains in epoch 2"
        moved[precision] = moves.moved[2]
    assert moved["32-true"] > 0.0 and 0.5 < moved["16-mixed"] / moved["32-true"] < 2.0, moved


class OnceNaN(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """`blobs(192, 0)` whose sample 5 is NaN the first time it is read: one bad batch in the first epoch."""

    def __init__(self) -> None:
        self.inputs, self.targets = blobs(192, 0)
        self.read: set[int] = set()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = self.inputs[index].clone()
        if index == 5 and index not in self.read:
            inputs[0] = float("nan")
        self.read.add(index)
        return inputs, self.targets[index]


def fit_quietly(module: lightning.LightningModule, callbacks: list[lightning.Callback], epochs: int, root: object,
                loader: object) -> lightning.Trainer:
    trainer = lightning.Trainer(max_epochs=epochs, callbacks=callbacks, accelerator="cpu", logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                default_root_dir=str(root))
    trainer.fit(module, loader)
    return trainer


def test_under_lightning_a_rollback_resets_the_optimizer_configure_optimizers_built(tmp_path: object) -> None:
    """`configure_optimizers` runs after the Grower is built; the callback hands its optimizer to the grower, so a
    NaN batch rolled back also clears AdamW's NaN moments and halves its rate, and the next epoch trains on."""
    from morphogen.lightning import GrowthCallback

    grower, _ = make_grower(epochs=5)
    callback = GrowthCallback(grower)
    trainer = fit_quietly(GrowingModule(grower), [callback], 2, tmp_path, DataLoader(OnceNaN(), batch_size=32))
    assert grower.optimizer is trainer.optimizers[0]
    assert [r.rolled_back for r in callback.reports] == [True, False]
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-2 * grower.episode.config.governor.backoff)
    assert all(torch.isfinite(p).all() for p in grower.model.parameters()) and callback.reports[1].score > 50.0


class TwoOptimizers(GrowingModule):
    """The host's parameters split between two optimizers (Lightning's manual optimization)."""

    def __init__(self, grower: Grower) -> None:
        super().__init__(grower)
        self.automatic_optimization = False

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:  # type: ignore[override]
        parameters = list(self.model.host_parameters())
        return [torch.optim.SGD(parameters[:2], lr=0.1), torch.optim.SGD(parameters[2:], lr=0.1)]


def test_under_lightning_an_optimizer_the_callback_cannot_choose_is_refused_when_fit_starts(tmp_path: object) -> None:
    from morphogen.lightning import GrowthCallback

    grower, loader = make_grower(epochs=2)
    with pytest.raises(ValueError, match=r"GrowthCallback: 2 optimizers hold the host's parameters, .* give that "
                                         r"one as Grower\(optimizer=...\)"):
        fit_quietly(TwoOptimizers(grower), [GrowthCallback(grower)], 1, tmp_path, loader)
    grower, loader = make_grower(epochs=2)
    grower.use_optimizer(torch.optim.SGD(grower.model.host_parameters(), lr=0.1))  # as optimizer= would
    with pytest.raises(ValueError, match=r"the Grower's optimizer= is not one the trainer steps: return it from "
                                         r"configure_optimizers"):
        fit_quietly(GrowingModule(grower), [GrowthCallback(grower)], 1, tmp_path, loader)


@pytest.mark.parametrize("num_classes", [3, None])
def test_a_growers_validation_labels_beyond_its_classes_are_named_as_validation(num_classes: int | None) -> None:
    """A Grower reads one split, the validation data it was given: a label outside its classes (given, or the
    model's scores) is named as the validation's, though the task it makes uses that data to train too."""
    inputs, targets = blobs(96, 1)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=inputs[:2])
    with pytest.raises(morphogen.DataError, match=r"validation: targets hold class 3, outside 0\.\.2 of "):
        Grower(host, (inputs, targets + 1), epochs=2, num_classes=num_classes)


@pytest.mark.parametrize(("labels", "said"), [
    (lambda y: y.float(), "the targets are float32 whole numbers: cross-entropy takes class indices as int64 "
                          "(y.long()), or class probabilities shaped as the outputs"),
    (lambda y: y.float() + 0.5, "the targets are float32 of shape (8,) against outputs (8, 3): cross-entropy takes "
                                "class indices as int64 (y.long()), or class probabilities shaped as the outputs"),
    (lambda y: y.int(), "the targets are int32: cross-entropy takes class indices as int64 (y.long())"),
], ids=["float", "fractions", "int32"])
def test_training_labels_of_another_dtype_than_class_indices_say_what_is_expected(
        labels: Callable[[torch.Tensor], torch.Tensor], said: str) -> None:
    """int64 validation labels, but float or int32 ones in a training batch: one line naming the batch's dtype
    (was torch's "expected target dtype to be Long"), at any step, not only the first."""
    inputs, targets = blobs(96, 1)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=inputs[:2])
    grower = Grower(host, (inputs, targets), epochs=2)
    assert grower.training_step(inputs[:8], targets[:8]).isfinite()
    with pytest.raises(ValueError, match=rf"^training_step: {re.escape(said)} \(the loss failed on them: "):
        grower.training_step(inputs[:8], labels(targets[:8]))
    assert grower.training_step(inputs[8:16], targets[8:16]).isfinite()


@pytest.mark.parametrize("num_classes", [3, None])
def test_a_first_training_batch_with_a_class_beyond_the_scores_is_refused_before_the_loss(
        num_classes: int | None) -> None:
    """Class 201 of 3 in the first batch that trains: one line naming it, before the loss (on a GPU, torch's
    cross-entropy met it as a device-side assert that ends the CUDA context), read once, not at every step."""
    inputs, targets = blobs(96, 1)
    host = morphogen.host_from_module(mlp(), ["1"], example_input=inputs[:2])
    grower = Grower(host, (inputs, targets), epochs=2, num_classes=num_classes)
    beyond = targets[:8].clone()
    beyond[5] = 201
    counted = "num_classes=3" if num_classes else "the model's 3 class scores"
    with pytest.raises(morphogen.DataError, match=rf"^training_step \(the first batch\): targets hold class 201, "
                                                  rf"outside 0\.\.2 of {counted} \(-100"):
        grower.training_step(inputs[:8], beyond)
    assert grower.training_step(inputs[:8], targets[:8]).isfinite()
    with pytest.raises(IndexError, match="Target 201 is out of bounds"):  # later batches are torch's to check
        grower.training_step(inputs[:8], beyond)
