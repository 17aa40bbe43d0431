"""The growing model: lifecycle, alpha schedules, blends, blueprints, hosts, slots and the model."""
