"""The protocol's methods: each env's method table (name -> script and flags, in the paper's order), their
reward-blind forms, the scales, and what the env implies for its runs (env workers, analysis, seeds fitted to the
device's memory)."""

from __future__ import annotations

METHODS = {  # per env, in the order the paper's claims need them: name -> script and flags
    "babyai": {
        "msfa": "msfa_babyai.py",
        "usfa_learned": "usfa.py --learned-cumulants",
        "usfa": "usfa.py",
        "uvfa_farm": "uvfa.py --farm",
        "msfa_entangled_psi": "msfa_babyai.py --entangled-psi",
        "msfa_entangled_phi": "msfa_babyai.py --entangled-phi",
        "msfa_entangled_both": "msfa_babyai.py --entangled-psi --entangled-phi",
        "uvfa": "uvfa.py",
        "mvfa": "uvfa.py --modular",
    },
    "fruitbot": {
        "msfa": "msfa_fruitbot.py",
        "usfa_learned": "usfa.py --env fruitbot --learned-cumulants",
        "usfa": "usfa.py --env fruitbot",
        "uvfa_farm": "uvfa.py --env fruitbot --farm",
        "msfa_entangled_psi": "msfa_fruitbot.py --entangled-psi",
        "msfa_entangled_phi": "msfa_fruitbot.py --entangled-phi",
        "msfa_entangled_both": "msfa_fruitbot.py --entangled-psi --entangled-phi",
        "uvfa": "uvfa.py --env fruitbot",
        "mvfa": "uvfa.py --env fruitbot --modular",
    },
    "minihack": {  # USFA with hand-designed cumulants has no cumulants here (docs/protocol.md)
        "msfa": "msfa_minihack.py",
        "usfa_learned": "usfa.py --env minihack --learned-cumulants",
        "uvfa_farm": "uvfa.py --env minihack --farm",
        "msfa_entangled_psi": "msfa_minihack.py --entangled-psi",
        "msfa_entangled_phi": "msfa_minihack.py --entangled-phi",
        "msfa_entangled_both": "msfa_minihack.py --entangled-psi --entangled-phi",
        "uvfa": "uvfa.py --env minihack",
        "mvfa": "uvfa.py --env minihack --modular",
    },
}
BLIND = "_blind"
"""<method>_blind is the method with --reward-input off: its recurrent core cannot read the reward, so neither can
cumulants learned from its state (docs/cumulants.md); e.g. msfa_blind, usfa_learned_blind. Named with --methods; the
default methods are the paper's."""
for _methods in METHODS.values():
    _methods.update({name + BLIND: command + " --reward-input off" for name, command in list(_methods.items())})


def paper_methods(env: str) -> tuple[str, ...]:
    """An env's methods as the paper has them, in its order (not the reward-blind forms): what a protocol runs when
    --methods names none."""
    return tuple(name for name in METHODS[env] if not name.endswith(BLIND))


SCALES = {
    "paper": {},
    # The miniature BabyAI: the paper's methods, losses, n-step, replay ratio, batch, optimiser, epsilon schedule and
    # GPI, in a smaller room with every network's widths divided by 4 and a budget at which MSFA and USFA with the
    # env's cumulants both reach 80% of the BFS oracle's train-task return and settle (docs/babyai.md: every setting
    # tried); replay capacity and target-network period scaled as the paper's are.
    "mini": {"babyai": {
        "all": "--grid-size 6 --objects-per-category 1 --episode-steps 50 --torso-channels 8 16 16 "
               "--total-timesteps 2560000 --replay-size 30000 --target-update-period 750 --eval-every 51200",
        "msfa": "--module-size 38 --projection-dim 4 --psi-hidden 32 --phi-hidden 64 64",
        "msfa_entangled_psi": "--module-size 38 --projection-dim 4 --psi-hidden 32 --phi-hidden 64 64",
        "msfa_entangled_phi": "--module-size 35 --projection-dim 4 --psi-hidden 32 --phi-hidden 64 64",
        "msfa_entangled_both": "--module-size 35 --projection-dim 4 --psi-hidden 32 --phi-hidden 64 64",
        "usfa_learned": "--lstm-size 128 --psi-hidden 32 --phi-hidden 64 64",
        "usfa": "--lstm-size 128 --psi-hidden 32",
        "uvfa_farm": "--module-size 38 --projection-dim 4 --q-hidden 32",
        "uvfa": "--lstm-size 128 --q-hidden 32",
        "mvfa": "--module-size 38 --projection-dim 4 --q-hidden 32",
    }},
}
"""--scale: flags added to every method's command ("all") and to each method's own (its networks' sizes), before
--extra; "paper" adds none (the scripts' defaults are the paper's settings)"""
HOST_ENVS = ("minihack",)
"""envs stepped by C++ on the host (NLE): their runs get --env-workers processes per seed's envs"""
ENV_WORKERS = 8
"""--env-workers' default: worker processes stepping each seed's NLE envs"""
ANALYSES = ("babyai",)
"""envs tools.analyze plays (GotoAvoid)"""
FIT_SEEDS = ("fruitbot",)
"""envs whose replay may limit the seeds a device holds (Fruitbot's, where it keeps 64x64x3 frames)"""
PAPER_SEEDS = 10
"""seeds per method in the paper: --seeds' default, and the most a device is given where the replay limits them"""
