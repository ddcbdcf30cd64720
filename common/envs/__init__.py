"""The environments: BabyAI in JAX and its minigrid twin; Fruitbot in JAX (rules, frames) and stock procgen as a
host env; MiniHack (NLE) as a host env."""
