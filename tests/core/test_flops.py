"""FLOP counts of training steps and validation batches: a hand count, the shadow's share, the cache."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from morphogen import CNNHost, MorphogeneticModel, host_from_module
from morphogen.core.branch import NoBranchSiteError
from morphogen.core.flops import FlopCounter, StepFlops, meta_copy
from morphogen.inputs import InputSpec

BATCH, IN_CHANNELS, OUT_CHANNELS, SIDE, KERNEL, CLASSES = 6, 3, 4, 5, 3, 10


def conv_linear_model() -> MorphogeneticModel:
    """One 3x3 convolution (no bias) and one linear layer, with a slot between them."""
    network = nn.Sequential(nn.Conv2d(IN_CHANNELS, OUT_CHANNELS, KERNEL, padding=1, bias=False), nn.ReLU(),
                            nn.Flatten(), nn.Linear(OUT_CHANNELS * SIDE * SIDE, CLASSES))
    host = host_from_module(network, ["1"], example_input=torch.randn(2, IN_CHANNELS, SIDE, SIDE))
    return MorphogeneticModel(host)


def test_a_plain_host_costs_what_a_hand_count_of_its_conv_and_linear_layers_says() -> None:
    # A multiply-add is 2 FLOPs. The convolution: every output value (N*C_out*H*W) sums C_in*k*k products.
    convolution = 2 * BATCH * OUT_CHANNELS * SIDE * SIDE * IN_CHANNELS * KERNEL * KERNEL
    linear = 2 * BATCH * (OUT_CHANNELS * SIDE * SIDE) * CLASSES
    # Backward: the linear layer's input gradient and weight gradient cost what its forward does, each; the
    # convolution needs only its weight gradient (the network's input asks for none).
    counter = FlopCounter()
    step = counter.training_step(conv_linear_model(), InputSpec.tensor((BATCH, IN_CHANNELS, SIDE, SIDE)))
    assert step.main == 2 * convolution + 3 * linear
    assert step.shadow == 0  # no seed is TRAINING
    validation = counter.validation_batch(conv_linear_model(), [[0.0]],
                                          InputSpec.tensor((BATCH, IN_CHANNELS, SIDE, SIDE)))
    assert (validation.main, validation.counterfactual) == (convolution + linear, 0)


@pytest.mark.parametrize("parametrize", [nn.utils.parametrizations.weight_norm,
                                         nn.utils.parametrizations.spectral_norm])
def test_a_parametrized_layer_costs_what_the_plain_layer_costs(parametrize: object) -> None:
    """A parametrization passes parameters to a module of its own: counting validation must not trip on it (it
    did under inference_mode, where FlopCounterMode's module hooks fail on an input that requires grad)."""
    spec = InputSpec.tensor((BATCH, IN_CHANNELS, SIDE, SIDE))
    plain, parametrized = conv_linear_model(), conv_linear_model()
    parametrize(parametrized.host.segments[0][0])  # type: ignore[operator]  # registers it on the conv itself
    assert not hasattr(plain.host.segments[0][0], "parametrizations")
    for kind in ("training_step", "validation_batch"):
        counts = [getattr(FlopCounter(), kind)(model, *([[[0.0]]] if kind == "validation_batch" else []), spec)
                  for model in (plain, parametrized)]
        assert counts[0].main == counts[1].main > 0


def test_a_training_seed_is_charged_to_the_shadow_and_its_counterfactual_to_validation() -> None:
    model = MorphogeneticModel(CNNHost(10, 1, n_blocks=2, base_channels=4))
    spec = InputSpec.tensor((8, 1, 8, 8))
    counter = FlopCounter()
    bare = counter.training_step(model, spec)
    model.germinate("r0c0", "conv_light")
    model.slot("r0c0").advance(0)  # TRAINING: the host path is unchanged, the shadow pass is new
    training = counter.training_step(model, spec)
    assert training.main == bare.main and training.shadow > 0
    plain = counter.validation_batch(model, [[0.0, 0.0]], spec)
    with_shadow = counter.validation_batch(model, [[0.0, 0.0], [1.0, 0.0]], spec)
    assert with_shadow.main == plain.main  # the model's own forward is the same with or without the shadow
    assert plain.counterfactual == 0 and with_shadow.counterfactual > 0


def test_an_unchanged_plan_is_not_counted_again() -> None:
    model = MorphogeneticModel(CNNHost(10, 1, n_blocks=2, base_channels=4))
    counter = FlopCounter()
    first = counter.training_step(model, InputSpec.tensor((8, 1, 8, 8)))
    made = counter.counts_made
    assert made > 0
    for _ in range(3):
        assert counter.training_step(model, InputSpec.tensor((8, 1, 8, 8))) == first
    # The last, smaller batch of an epoch: scaled from the count per sample, as a count of its own would say.
    last = counter.training_step(model, InputSpec.tensor((3, 1, 8, 8)))
    assert counter.counts_made == made
    assert 8 * last.main == 3 * first.main
    model.germinate("r0c1", "conv_small")  # GERMINATED: the seed does not run, the plan is unchanged
    counter.training_step(model, InputSpec.tensor((8, 1, 8, 8)))
    assert counter.counts_made == made
    model.slot("r0c1").advance(0)  # TRAINING: a new plan
    counter.training_step(model, InputSpec.tensor((8, 1, 8, 8)))
    assert counter.counts_made > made


def test_validation_is_counted_once_per_pattern_of_alphas_not_per_value() -> None:
    model = MorphogeneticModel(CNNHost(10, 1, n_blocks=2, base_channels=4))
    for slot_id in model.slot_ids:
        model.germinate(slot_id, "conv_light")
        model.slot(slot_id).advance(0)
    counter, spec = FlopCounter(), InputSpec.tensor((8, 1, 8, 8))
    ramp = [counter.validation_batch(model, [[a, 0.0], [a, 1.0]], spec) for a in (0.2, 0.4)]
    made = counter.counts_made
    ramp.append(counter.validation_batch(model, [[0.6, 0.0], [0.6, 1.0]], spec))
    assert counter.counts_made == made and ramp[0] == ramp[1] == ramp[2]
    counter.validation_batch(model, [[0.5, 0.0], [0.0, 1.0]], spec)  # expands at the first slot
    assert counter.counts_made > made


def test_a_blueprint_that_cannot_go_into_a_slot_is_refused_again_without_another_count() -> None:
    """Growth signals are measured with every blueprint's cost in every empty slot, each epoch: one that cannot go
    there (a branch on a host without measured segment inputs) must not cost a model copy each time."""
    model = MorphogeneticModel(CNNHost(10, 1, n_blocks=2, base_channels=4))
    counter, spec = FlopCounter(), InputSpec.tensor((8, 1, 8, 8))
    for attempt in range(3):
        with pytest.raises(NoBranchSiteError):
            counter.seed_cost(model, "r0c1", "branch_wide", spec)
        if attempt == 0:
            made = counter.counts_made
    assert counter.counts_made == made == 1
    assert counter.seed_cost(model, "r0c1", "conv_small", spec).parameters > 0


class PerBatch(nn.Module):
    """A layer whose cost does not grow with the batch: a product of two weight matrices on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Parameter(torch.randn(6, 6)), nn.Parameter(torch.randn(6, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.a @ self.b)


def test_a_model_whose_flops_are_not_per_sample_is_counted_at_each_batch_size() -> None:
    network = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), PerBatch())
    model = MorphogeneticModel(host_from_module(network, ["1"], example_input=torch.randn(2, 6)))
    counter = FlopCounter()
    for batch in (8, 3):
        validation = counter.validation_batch(model, [[0.0]], InputSpec.tensor((batch, 6)))
        assert validation.main == 2 * batch * 36 + 2 * 6 * 36 + 2 * batch * 36  # the weight product: per call


def test_counting_leaves_the_model_untouched() -> None:
    model = MorphogeneticModel(CNNHost(10, 1, n_blocks=2, base_channels=4))
    model.germinate("r0c0", "conv_light")
    model.slot("r0c0").advance(0)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items() if isinstance(tensor, torch.Tensor)}
    FlopCounter().training_step(model, InputSpec.tensor((8, 1, 8, 8)))
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert all(parameter.grad is None for parameter in model.parameters())


def test_counting_a_model_with_dropout_leaves_torchs_global_generator_where_it_was() -> None:
    """A count runs the copy in training mode, where dropout draws; the count is made the first time a plan is
    seen, so a draw from the user's generator would fall elsewhere in a resumed process than in one never stopped."""
    network = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5), nn.ReLU(), nn.Linear(6, 3))
    model = MorphogeneticModel(host_from_module(network, ["2"], example_input=torch.randn(2, 6)))
    model.germinate("2", "mlp_small")
    model.slot("2").advance(0)  # TRAINING: the shadow pass runs dropout too
    counter, spec = FlopCounter(), InputSpec.tensor((8, 6))
    before = torch.get_rng_state()
    counter.training_step(model, spec)
    counter.validation_batch(model, [[0.0], [1.0]], spec)
    counter.probe(model, spec)
    assert counter.counts_made > 0 and torch.equal(torch.get_rng_state(), before)


def test_a_meta_copy_shares_tied_weights_and_allocates_nothing() -> None:
    from morphogen import TransformerHost

    host = TransformerHost(vocab_size=11, d_model=8, n_heads=2, n_layers=2, block_size=6, n_segments=2)
    copy = meta_copy(MorphogeneticModel(host))
    assert all(parameter.device.type == "meta" for parameter in copy.parameters())
    head = copy.host.segments[-1].output.weight
    assert head is copy.host.segments[0][0].token.weight


def test_counts_are_kept_per_sample_spec_and_scaled_to_every_batch_of_it() -> None:
    """A count is keyed by one sample's shapes and dtypes (`InputSpec.per_sample`), not by the batch's rows: a
    batch of another size is scaled from it, one of another dtype or sequence length is counted anew."""
    from morphogen import TransformerHost

    host = TransformerHost(vocab_size=11, d_model=8, n_heads=2, n_layers=2, block_size=6, n_segments=2)
    model, counter = MorphogeneticModel(host), FlopCounter()
    full = counter.training_step(model, InputSpec.tensor((8, 6), torch.int64))
    made = counter.counts_made
    last = counter.training_step(model, InputSpec.tensor((3, 6), torch.int64))
    assert counter.counts_made == made and 8 * last.main == 3 * full.main
    assert counter.training_step(model, InputSpec.tensor((8, 6), torch.int32)) == full  # a new key, the same FLOPs
    assert counter.counts_made > made
    made = counter.counts_made
    shorter = counter.training_step(model, InputSpec.tensor((8, 4), torch.int64))
    assert counter.counts_made > made and 0 < shorter.main < full.main
    probe = counter.probe(model, InputSpec.tensor((8, 6), torch.int64))
    assert 2 * counter.probe(model, InputSpec.tensor((4, 6), torch.int64)) == probe > 0
    cost = counter.seed_cost(model, "r0c0", "mlp_small", InputSpec.tensor((8, 6), torch.int64))
    made = counter.counts_made
    smaller = counter.seed_cost(model, "r0c0", "mlp_small", InputSpec.tensor((2, 6), torch.int64))
    assert counter.counts_made == made and cost.flops > 0 and smaller == cost._replace(flops=cost.flops // 4)


class Masked(nn.Module):
    """A model of two inputs, called `model(x, mask)`: two linear layers, the first on the masked features."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x * mask)))


def test_a_model_called_with_a_tuple_of_inputs_costs_what_a_hand_count_says() -> None:
    host = host_from_module(Masked(), ["first"], example_input=(torch.randn(2, 6), torch.ones(2, 6)))
    model, counter = MorphogeneticModel(host), FlopCounter()
    spec = InputSpec.of((torch.randn(BATCH, 6), torch.ones(BATCH, 6)))
    assert spec.kind == "tuple"
    first, second = 2 * BATCH * 6 * 8, 2 * BATCH * 8 * 3
    # The first layer's backward is its weight gradient alone: neither input asks for a gradient.
    assert counter.training_step(model, spec) == StepFlops(2 * first + 3 * second, 0)
    assert counter.validation_batch(model, [[0.0]], spec).main == first + second
    made = counter.counts_made
    assert 2 * counter.validation_batch(model, [[0.0]], spec.with_rows(3)).main == first + second  # scaled
    assert counter.counts_made == made
    model.germinate("first", "mlp_small")
    model.slot("first").advance(0)  # TRAINING: a shadow pass over the layers after the slot, on half the batch
    whole, half = counter.training_step(model, spec), counter.training_step(model, spec, BATCH // 2)
    assert whole.main == half.main == 2 * first + 3 * second and whole.shadow == 2 * half.shadow > 0


class Recurrent(nn.Module):
    """An LSTM over sequences of 3 features, its last step classified: torch runs it on the CPU as oneDNN's fused
    layer, which `FlopCounterMode` alone counts as nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = LastStep(nn.LSTM(3, 8, batch_first=True))
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


class LastStep(nn.Module):
    def __init__(self, lstm: nn.LSTM) -> None:
        super().__init__()
        self.lstm = lstm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0][:, -1]


def test_an_lstm_costs_what_a_hand_count_says_on_the_cpu_as_on_the_meta_device() -> None:
    steps = 7
    spec = InputSpec.tensor((BATCH, steps, 3))
    host = host_from_module(Recurrent(), ["encoder"], example_input=torch.randn(2, steps, 3))
    # Each step of each sequence multiplies its input (3) and hidden state (8) into 4 gates of 8.
    lstm, head = 2 * BATCH * steps * 4 * 8 * (3 + 8), 2 * BATCH * 8 * CLASSES
    counter = FlopCounter()
    assert counter.validation_batch(MorphogeneticModel(host), [[0.0]], spec).main == lstm + head
    with torch.no_grad(), FlopCounterMode(display=False) as on_meta:
        meta_copy(host)(torch.zeros(BATCH, steps, 3, device="meta"))
    assert on_meta.get_total_flops() == lstm + head
    assert counter.training_step(MorphogeneticModel(host), spec).main == 3 * lstm + 3 * head  # backward: 2x forward
