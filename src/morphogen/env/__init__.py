"""One host-training episode as an environment: train, validate with counterfactuals, act, reward."""
