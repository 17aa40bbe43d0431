"""FactoredLSTMPolicy: masks, head relevance, exact re-evaluation of acted sequences, persistence."""

from __future__ import annotations

import math

import pytest
import torch

from morphogen.control.policy import MASKED_LOGIT, FactoredLSTMPolicy, masked_logits

N_OPS = 4
ACTION_SIZES = (N_OPS, 3, 5)
# op 0 (think WAIT): only the op matters; op 1: head 1; op 2: heads 1 and 2; op 3: head 2.
RELEVANCE = torch.tensor(
    [
        [True, False, False],
        [True, True, False],
        [True, True, True],
        [True, False, True],
    ]
)


def make_policy(seed: int = 0, **kwargs: object) -> FactoredLSTMPolicy:
    torch.manual_seed(seed)
    options: dict[str, object] = {"hidden_size": 16, "head_relevance": RELEVANCE}
    options.update(kwargs)
    return FactoredLSTMPolicy(6, ACTION_SIZES, **options)  # type: ignore[arg-type]


def random_masks(batch: tuple[int, ...], generator: torch.Generator) -> list[torch.Tensor]:
    """Random legal-by-construction masks: every op row and every op-conditioned row keeps one True."""

    def mask(*shape: int) -> torch.Tensor:
        values = torch.rand(*shape, generator=generator) < 0.5
        keep = torch.randint(shape[-1], (*shape[:-1], 1), generator=generator)
        return values.scatter(-1, keep, True)

    return [mask(*batch, N_OPS), mask(*batch, ACTION_SIZES[1]), mask(*batch, N_OPS, ACTION_SIZES[2])]


def test_masked_logits_are_fp32_with_the_finite_mask_value() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    result = masked_logits(logits, torch.tensor([[True, False, True]]))
    assert result.dtype == torch.float32
    assert result.tolist() == [[1.0, MASKED_LOGIT, 3.0]]
    assert torch.softmax(result, -1)[0, 1].item() == 0.0


def test_masked_actions_are_never_sampled_including_op_conditioned_masks() -> None:
    policy = make_policy()
    with torch.no_grad():
        # Make illegal choices attractive so the masks, not the logits, must keep them out.
        for head in policy.action_heads:
            head.bias.copy_(torch.linspace(3.0, -3.0, head.bias.shape[0]))
    generator = torch.Generator().manual_seed(1)
    batch = 256
    seen_ops = torch.zeros(N_OPS, dtype=torch.bool)
    for _ in range(20):
        masks = random_masks((batch,), generator)
        observation = torch.randn(batch, 6, generator=generator)
        output = policy.act(observation, policy.initial_state(batch), masks, generator=generator)
        op = output.actions[:, 0]
        rows = torch.arange(batch)
        relevant = RELEVANCE[op]
        assert masks[0][rows, op].all()
        head1, head2 = output.actions[:, 1], output.actions[:, 2]
        assert torch.where(relevant[:, 1], masks[1][rows, head1], head1 == 0).all()
        assert torch.where(relevant[:, 2], masks[2][rows, op, head2], head2 == 0).all()
        seen_ops[op] = True
    assert seen_ops.all()


def test_deterministic_actions_are_the_best_legal_values() -> None:
    policy = make_policy()
    with torch.no_grad():
        for head in policy.action_heads:
            head.weight.zero_()
            head.bias.copy_(torch.arange(head.bias.shape[0], dtype=torch.float32))  # prefers the last
    masks = [
        torch.tensor([[True, True, True, False]]),  # op 3 is illegal -> op 2
        torch.tensor([[True, True, False]]),  # -> 1
        torch.tensor([[[True] * 5, [True] * 5, [True, True, True, False, False], [True] * 5]]),  # row 2 -> 2
    ]
    output = policy.act(torch.zeros(1, 6), policy.initial_state(1), masks, deterministic=True)
    assert output.actions.tolist() == [[2, 1, 2]]


def test_log_prob_and_entropy_match_hand_computed_values() -> None:
    policy = FactoredLSTMPolicy(2, (4,), hidden_size=8)
    with torch.no_grad():
        head = policy.action_heads[0]
        head.weight.zero_()
        head.bias.copy_(torch.tensor([0.0, math.log(2.0), math.log(3.0), 5.0]))
    mask = [torch.tensor([True, True, True, False]).expand(1, 3, 4)]
    actions = torch.tensor([[[0], [1], [2]]])  # [T=1, B=3, H=1]
    evaluation = policy.evaluate_sequence(
        torch.zeros(1, 3, 2), policy.initial_state(3), torch.ones(1, 3, dtype=torch.bool), actions, mask
    )
    # Legal probabilities are 1/6, 2/6, 3/6.
    expected_log_probs = [math.log(1 / 6), math.log(2 / 6), math.log(3 / 6)]
    expected_entropy = -(1 / 6 * math.log(1 / 6) + 2 / 6 * math.log(2 / 6) + 3 / 6 * math.log(3 / 6))
    assert evaluation.log_prob[0].tolist() == pytest.approx(expected_log_probs, abs=1e-6)
    assert evaluation.entropy_per_head[0, :, 0].tolist() == pytest.approx([expected_entropy] * 3, abs=1e-6)


def test_irrelevant_heads_are_canonical_and_carry_no_log_prob_or_entropy() -> None:
    policy = make_policy()
    batch = 64
    masks = [
        torch.tensor([True, False, False, False]).expand(batch, N_OPS),  # only op 0, for which no head matters
        torch.zeros(batch, 3, dtype=torch.bool),  # all-False rows are fine for heads that do not matter
        torch.zeros(batch, N_OPS, 5, dtype=torch.bool),
    ]
    output = policy.act(
        torch.randn(batch, 6), policy.initial_state(batch), masks, generator=torch.Generator().manual_seed(0)
    )
    assert (output.actions[:, 0] == 0).all()
    assert (output.actions[:, 1:] == 0).all()
    assert (output.log_prob_per_head[:, 1:] == 0).all()
    assert (output.entropy_per_head[:, 1:] == 0).all()
    # Only one legal op: its log-prob is 0 and so is the joint one.
    assert output.log_prob.abs().max().item() < 1e-6
    assert torch.isfinite(output.entropy_per_head).all()


def test_relevant_head_log_probs_sum_to_the_joint_log_prob() -> None:
    policy = make_policy()
    batch = 128
    masks = random_masks((batch,), torch.Generator().manual_seed(3))
    output = policy.act(
        torch.randn(batch, 6), policy.initial_state(batch), masks, generator=torch.Generator().manual_seed(4)
    )
    relevant = policy.relevant_heads(output.actions[:, 0])
    assert ((output.log_prob_per_head != 0) <= relevant).all()
    assert ((output.entropy_per_head > 0) <= relevant).all()
    assert torch.allclose(output.log_prob, output.log_prob_per_head.sum(-1))


def test_evaluate_sequence_reproduces_act_across_an_episode_start() -> None:
    policy = make_policy()
    steps, batch = 7, 3
    generator = torch.Generator().manual_seed(5)
    observations = torch.randn(steps, batch, 6, generator=generator)
    masks = random_masks((steps, batch), generator)
    episode_starts = torch.zeros(steps, batch, dtype=torch.bool)
    episode_starts[3, 1] = True
    episode_starts[5, [0, 2]] = True
    # Start mid-episode from a non-zero state, as a rollout segment does.
    state = policy.act(torch.randn(batch, 6), policy.initial_state(batch)).state
    initial_state = state
    outputs = []
    for step in range(steps):
        output = policy.act(
            observations[step],
            state,
            [mask[step] for mask in masks],
            generator=generator,
            episode_starts=episode_starts[step],
        )
        outputs.append(output)
        state = output.state
    evaluation = policy.evaluate_sequence(
        observations,
        initial_state,
        episode_starts,
        torch.stack([o.actions for o in outputs]),
        masks,
    )
    assert torch.allclose(evaluation.log_prob, torch.stack([o.log_prob for o in outputs]), atol=1e-5)
    assert torch.allclose(evaluation.value, torch.stack([o.value for o in outputs]), atol=1e-5)
    assert torch.allclose(evaluation.log_prob_per_head, torch.stack([o.log_prob_per_head for o in outputs]), atol=1e-5)
    assert torch.allclose(evaluation.entropy_per_head, torch.stack([o.entropy_per_head for o in outputs]), atol=1e-5)
    # Without the resets the same sequence scores differently: the starts were honored.
    no_resets = policy.evaluate_sequence(
        observations,
        initial_state,
        torch.zeros_like(episode_starts),
        torch.stack([o.actions for o in outputs]),
        masks,
    )
    assert not torch.allclose(no_resets.value[5:], evaluation.value[5:], atol=1e-5)


def test_evaluate_sequence_gives_gradients_to_every_learned_part() -> None:
    policy = make_policy()
    steps, batch = 4, 2
    actions = torch.tensor([[2, 1, 3]]).expand(steps, batch, 3)  # op 2: every head matters
    evaluation = policy.evaluate_sequence(
        torch.randn(steps, batch, 6),
        policy.initial_state(batch),
        torch.zeros(steps, batch, dtype=torch.bool),
        actions,
        None,
    )
    (evaluation.log_prob.sum() + evaluation.value.sum()).backward()
    for name, parameter in policy.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_orthogonal_initialization_gains() -> None:
    policy = make_policy(hidden_size=32)
    for head in policy.action_heads:
        gram = head.weight @ head.weight.T
        assert torch.allclose(gram, 0.01**2 * torch.eye(gram.shape[0]), atol=1e-7)
    assert policy.value_head.weight.norm().item() == pytest.approx(1.0, abs=1e-5)
    trunk = policy.trunk[0].weight  # [hidden, in] with in < hidden: orthonormal columns times sqrt(2)
    assert torch.allclose(trunk.T @ trunk, 2.0 * torch.eye(trunk.shape[1]), atol=1e-5)


def test_state_dict_round_trip_reproduces_actions() -> None:
    policy = make_policy(seed=0)
    copy = make_policy(seed=1, head_relevance=None)
    copy.load_state_dict(policy.state_dict())
    assert torch.equal(copy.head_relevance, RELEVANCE)
    observation = torch.randn(8, 6)
    first = policy.act(observation, policy.initial_state(8), None, generator=torch.Generator().manual_seed(9))
    second = copy.act(observation, copy.initial_state(8), None, generator=torch.Generator().manual_seed(9))
    assert torch.equal(first.actions, second.actions)
    assert torch.equal(first.log_prob, second.log_prob)
    assert torch.equal(first.value, second.value)
    assert torch.equal(first.state[0], second.state[0])


def test_default_relevance_makes_every_head_matter() -> None:
    policy = FactoredLSTMPolicy(3, (2, 3), hidden_size=8)
    output = policy.act(torch.randn(16, 3), policy.initial_state(16))
    assert (output.entropy_per_head > 0).all()
    assert (output.log_prob_per_head < 0).all()


def test_state_shapes_and_resets() -> None:
    policy = make_policy()
    state = policy.initial_state(5)
    assert [tuple(t.shape) for t in state] == [(1, 5, 16), (1, 5, 16)]
    observation = torch.randn(5, 6)
    after = policy.act(observation, state).state
    # A start zeroes the state first, so from any state the step equals a step from zeros.
    restarted = policy.act(observation, after, episode_starts=torch.ones(5, dtype=torch.bool))
    assert torch.allclose(restarted.state[0], after[0])
    assert torch.allclose(policy.predict_value(observation, state), policy.act(observation, state).value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"head_relevance": torch.ones(4, 2, dtype=torch.bool)}, "head_relevance must be a bool tensor"),
        ({"head_relevance": torch.ones(4, 3)}, "head_relevance must be a bool tensor"),
        ({"head_relevance": ~torch.eye(4, 3, dtype=torch.bool)}, r"head_relevance\[:, 0\]"),
        ({"hidden_size": 0}, "hidden_size"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_policy(**kwargs)


def test_call_arguments_are_checked() -> None:
    policy = make_policy()
    state = policy.initial_state(2)
    with pytest.raises(ValueError, match="observation_size=6"):
        policy.act(torch.zeros(2, 5), state)
    with pytest.raises(ValueError, match="one entry per head"):
        policy.act(torch.zeros(2, 6), state, [torch.ones(2, 4, dtype=torch.bool)])
    with pytest.raises(ValueError, match=r"action_masks\[1\]"):
        policy.act(torch.zeros(2, 6), state, [None, torch.ones(2, 4, dtype=torch.bool), None])


def test_a_feed_forward_policy_has_no_memory_and_passes_the_state_through() -> None:
    policy = make_policy(recurrent=False)
    assert policy.lstm is None and not any("lstm" in name for name, _ in policy.named_parameters())
    generator = torch.Generator().manual_seed(2)
    observations = torch.randn(5, 3, 6, generator=generator)
    state = policy.initial_state(3)
    outputs = []
    for step in range(5):
        outputs.append(policy.act(observations[step], state, generator=generator))
        assert outputs[-1].state is state  # nothing to remember
    # Each step's action depends on that step's observation alone: the same observation at another step, after
    # another history, scores the same.
    evaluation = policy.evaluate_sequence(observations, state, torch.zeros(5, 3, dtype=torch.bool),
                                          torch.stack([o.actions for o in outputs]))
    assert torch.allclose(evaluation.log_prob, torch.stack([o.log_prob for o in outputs]), atol=1e-6)
    shuffled = policy.evaluate_sequence(observations.flip(0), state, torch.zeros(5, 3, dtype=torch.bool),
                                        torch.stack([o.actions for o in outputs]).flip(0))
    assert torch.allclose(shuffled.log_prob.flip(0), evaluation.log_prob, atol=1e-6)
    (evaluation.log_prob.sum() + evaluation.value.sum()).backward()
    for name, parameter in policy.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
