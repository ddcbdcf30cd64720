"""The environments: BabyAI (JAX) and its minigrid twin, Fruitbot (JAX: rules and frames; stock procgen as a host env), MiniHack (NLE as a host env)."""
