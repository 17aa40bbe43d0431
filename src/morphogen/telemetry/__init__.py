"""Telemetry: typed events, sinks, gradient/LSTM/anomaly monitors and profilers; imports no other morphogen layer.

Import from the modules: `events` (typed events), `sinks` (the `Telemetry` hub and its sinks), `config`,
`anomalies`, `gradients`, `lstm_health`, `drift`, `escalation`, `profiler`, `debug` (per-layer statistics,
which loads torch's compiler: it is imported only at telemetry level `debug`), `story`, `tensorboard`,
`resume` and `schema`.
"""
