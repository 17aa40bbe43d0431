"""Views of a run for people; they read only what telemetry wrote into the run directory."""
