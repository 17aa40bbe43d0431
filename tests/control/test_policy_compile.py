"""`--compile` of the policy: its forward is one graph (acting and re-evaluating sequences with episode
starts), and compiled acting and PPO re-evaluation match eager ones."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from test_growth_policy import random_inputs

from morphogen.control.growth_policy import GrowthInputs, GrowthPolicy
from morphogen.control.policy import RecurrentActorCritic
from morphogen.core.compilation import CompileSettings
from morphogen.env.actions import HEADS

BATCH, STEPS, SLOTS, BLUEPRINTS = 3, 5, 2, 4


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _growth_policy(seed: int = 0) -> GrowthPolicy:
    torch.manual_seed(seed)
    return GrowthPolicy(hidden_size=16)


def _sequence(seed: int) -> tuple[GrowthInputs, torch.Tensor]:
    """Observations (leading [T, B]) and episode starts [T, B] (some mid-sequence)."""
    generator = torch.Generator().manual_seed(seed)
    observations = random_inputs((STEPS, BATCH), SLOTS, BLUEPRINTS, generator)
    starts = torch.rand(STEPS, BATCH, generator=generator) < 0.3
    starts[0] = True
    return observations, starts


def _step(observations: GrowthInputs, step: int) -> GrowthInputs:
    return GrowthInputs(*(tensor[step] for tensor in observations))


@pytest.mark.parametrize("steps", [1, STEPS])
def test_policy_forward_is_one_graph_with_episode_starts(steps: int) -> None:
    policy = _growth_policy()
    observations, starts = _sequence(0)
    first = GrowthInputs(*(tensor[:steps] for tensor in observations))
    arguments = (policy, first, policy.initial_state(BATCH), starts[:steps], True)
    # The compiled path's settings (`morphogen.core.compilation`): nn.LSTM traced as an op.
    with torch._dynamo.config.patch(allow_rnn=True):
        explanation = torch._dynamo.explain(RecurrentActorCritic._encode)(*arguments)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_eager_forward_over_a_sequence_does_sync_which_is_why_the_compiled_one_goes_step_by_step() -> None:
    """The eager path finds the spans between episode starts with one host sync: a graph break."""
    policy = _growth_policy()
    observations, starts = _sequence(0)
    with torch._dynamo.config.patch(allow_rnn=True):
        explanation = torch._dynamo.explain(RecurrentActorCritic._encode)(
            policy, observations, policy.initial_state(BATCH), starts, False)
    assert explanation.graph_break_count >= 1


def test_compiled_acting_chooses_what_eager_acting_chooses() -> None:
    eager, compiled = _growth_policy(), _growth_policy()
    compiled.compile_forward(CompileSettings(backend="aot_eager"))
    observations, starts = _sequence(1)
    states = [eager.initial_state(BATCH), compiled.initial_state(BATCH)]
    for step in range(STEPS):
        outputs = [policy.act(_step(observations, step), state, deterministic=True, episode_starts=starts[step])
                   for policy, state in zip((eager, compiled), states, strict=True)]
        assert torch.equal(outputs[0].actions, outputs[1].actions)
        torch.testing.assert_close(outputs[1].log_prob, outputs[0].log_prob, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(outputs[1].value, outputs[0].value, rtol=1e-5, atol=1e-6)
        states = [output.state for output in outputs]


def test_compiled_sequence_evaluation_matches_eager_values_and_gradients() -> None:
    """PPO's re-evaluation: compiled, the LSTM runs step by step with resets instead of once per span;
    the results agree to float32 rounding."""
    eager, compiled = _growth_policy(), _growth_policy()
    compiled.compile_forward(CompileSettings(backend="aot_eager"))
    observations, starts = _sequence(2)
    actions = eager.act(_step(observations, 0), eager.initial_state(BATCH)).actions  # (B, H): legal choices
    actions = actions.unsqueeze(0).expand(STEPS, BATCH, len(HEADS))
    results = []
    for policy in (eager, compiled):
        output = policy.evaluate_sequence(observations, policy.initial_state(BATCH), starts, actions)
        (output.log_prob.sum() + output.value.square().sum()).backward()
        results.append((output, [p.grad for p in policy.parameters()]))
    (eager_output, eager_gradients), (output, gradients) = results
    torch.testing.assert_close(output.log_prob, eager_output.log_prob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(output.value, eager_output.value, rtol=1e-5, atol=1e-5)
    for gradient, eager_gradient in zip(gradients, eager_gradients, strict=True):
        if eager_gradient is None:  # a head the sampled ops never needed
            assert gradient is None
            continue
        torch.testing.assert_close(gradient, eager_gradient, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs)")
def test_compiled_acting_under_cuda_graphs_keeps_every_steps_state() -> None:
    """`auto` compiles with CUDA graphs on CUDA, whose next replay overwrites a replay's outputs: the states
    kept from earlier steps must still read as eager acting computed them."""
    eager, compiled = _growth_policy().cuda(), _growth_policy().cuda()
    compiled.compile_forward(CompileSettings())
    observations, starts = _sequence(1)
    observations, starts = GrowthInputs(*(tensor.cuda() for tensor in observations)), starts.cuda()
    states = [eager.initial_state(BATCH), compiled.initial_state(BATCH)]
    kept: list[list[torch.Tensor]] = [[], []]
    for step in range(STEPS):
        outputs = [policy.act(_step(observations, step), state, deterministic=True, episode_starts=starts[step])
                   for policy, state in zip((eager, compiled), states, strict=True)]
        assert torch.equal(outputs[0].actions, outputs[1].actions)
        states = [output.state for output in outputs]
        for held, state in zip(kept, states, strict=True):
            held.append(state[0])
    # Read after every later replay. An overwritten state would differ wholesale; the kernels of CUDA's compiled and
    # eager paths round differently (up to 6.4e-5 apart on an H100), hence the looser bounds than on CPU.
    for eager_hidden, compiled_hidden in zip(*kept, strict=True):
        torch.testing.assert_close(compiled_hidden, eager_hidden, rtol=1e-3, atol=5e-4)
