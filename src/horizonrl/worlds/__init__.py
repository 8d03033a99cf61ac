"""AutoEnv-style layered worlds: a YAML DSL, three layers (dynamics, observation, skin), level
generators with planners, three-stage validation, and generation by the coder role in sandboxes."""
