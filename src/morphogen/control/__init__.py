"""Who decides: the heuristic and learned controllers, their normalizers, rollouts and PPO."""
