"""`--compile` of the policy: its forward is one graph (acting and re-evaluating sequences with episode
starts), and compiled acting and PPO re-evaluation match eager ones."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from test_policy import ACTION_SIZES, make_policy, random_masks

from morphogen.control.policy import FactoredLSTMPolicy
from morphogen.core.compilation import CompileSettings

BATCH, STEPS, SLOTS = 3, 5, 2


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _slotted_policy(seed: int = 0) -> FactoredLSTMPolicy:
    return make_policy(seed, n_slots=SLOTS, n_blueprints=3)


def _sequence(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Observations [T, B, 6], episode starts [T, B] (some mid-sequence), blueprint ids [T, B, slots]."""
    generator = torch.Generator().manual_seed(seed)
    observations = torch.randn(STEPS, BATCH, 6, generator=generator)
    starts = torch.rand(STEPS, BATCH, generator=generator) < 0.3
    starts[0] = True
    blueprint_ids = torch.randint(0, 4, (STEPS, BATCH, SLOTS), generator=generator)
    return observations, starts, blueprint_ids


@pytest.mark.parametrize("steps", [1, STEPS])
def test_policy_forward_is_one_graph_with_episode_starts(steps: int) -> None:
    policy = _slotted_policy()
    observations, starts, blueprint_ids = _sequence(0)
    arguments = (policy, observations[:steps], policy.initial_state(BATCH), starts[:steps], blueprint_ids[:steps], True)
    # The compiled path's settings (`morphogen.core.compilation`): nn.LSTM traced as an op.
    with torch._dynamo.config.patch(allow_rnn=True):
        explanation = torch._dynamo.explain(FactoredLSTMPolicy._encode)(*arguments)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_eager_forward_over_a_sequence_does_sync_which_is_why_the_compiled_one_goes_step_by_step() -> None:
    """The eager path finds the spans between episode starts with one host sync: a graph break."""
    policy = _slotted_policy()
    observations, starts, blueprint_ids = _sequence(0)
    with torch._dynamo.config.patch(allow_rnn=True):
        explanation = torch._dynamo.explain(FactoredLSTMPolicy._encode)(
            policy, observations, policy.initial_state(BATCH), starts, blueprint_ids, False)
    assert explanation.graph_break_count >= 1


def test_compiled_acting_chooses_what_eager_acting_chooses() -> None:
    eager, compiled = _slotted_policy(), _slotted_policy()
    compiled.compile_forward(CompileSettings(backend="aot_eager"))
    observations, starts, blueprint_ids = _sequence(1)
    states = [eager.initial_state(BATCH), compiled.initial_state(BATCH)]
    for step in range(STEPS):
        masks = random_masks((BATCH,), torch.Generator().manual_seed(step))
        outputs = [policy.act(observations[step], state, masks, blueprint_ids[step], deterministic=True,
                              episode_starts=starts[step])
                   for policy, state in zip((eager, compiled), states, strict=True)]
        assert torch.equal(outputs[0].actions, outputs[1].actions)
        torch.testing.assert_close(outputs[1].log_prob, outputs[0].log_prob, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(outputs[1].value, outputs[0].value, rtol=1e-5, atol=1e-6)
        states = [output.state for output in outputs]


def test_compiled_sequence_evaluation_matches_eager_values_and_gradients() -> None:
    """PPO's re-evaluation: compiled, the LSTM runs step by step with resets instead of once per span;
    the results agree to float32 rounding."""
    eager, compiled = _slotted_policy(), _slotted_policy()
    compiled.compile_forward(CompileSettings(backend="aot_eager"))
    observations, starts, blueprint_ids = _sequence(2)
    actions = torch.stack([torch.randint(0, size, (STEPS, BATCH), generator=torch.Generator().manual_seed(size))
                           for size in ACTION_SIZES], dim=-1)  # (T, B, H)
    results = []
    for policy in (eager, compiled):
        output = policy.evaluate_sequence(observations, policy.initial_state(BATCH), starts, actions, None,
                                          blueprint_ids)
        (output.log_prob.sum() + output.value.square().sum()).backward()
        results.append((output, [p.grad for p in policy.parameters()]))
    (eager_output, eager_gradients), (output, gradients) = results
    torch.testing.assert_close(output.log_prob, eager_output.log_prob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(output.value, eager_output.value, rtol=1e-5, atol=1e-5)
    for gradient, eager_gradient in zip(gradients, eager_gradients, strict=True):
        if eager_gradient is None:  # the padding row of the blueprint embedding, say
            assert gradient is None
            continue
        torch.testing.assert_close(gradient, eager_gradient, rtol=1e-4, atol=1e-5)
