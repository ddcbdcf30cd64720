"""common/envs/fruitbot_jax.py against procgen's Fruitbot (stock-hard and stock-easy), and the paper configuration.

Dynamics: procgen states from random, gap-seeking and key-firing play (with the agent sometimes moved to a random
spot and the level clock sometimes set near its limit, so that deaths, level ends, doors, keys in flight and
timeouts all occur) are loaded into the JAX game; both step with the same action and the next states are compared
entity by entity (position, velocity, extent, type, sprite; keys ordered by age), with the stock reward, the
objects collected per type and the done / level-complete flags. On a step that ends a level procgen has already
reset to the next one: there the step is replayed in a scratch procgen env from the state with barriers, doors and
presents made inert (common.envs.fruitbot.neutralised), which gives the agent's move and the objects collected (not the
keys: in the replay a barrier no longer stops one).
"""

from __future__ import annotations

import dataclasses
import inspect
import struct
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.envs import fruitbot as fb
from common.envs import fruitbot_jax as fj
from common.envs.procgen_env import ProcgenEnv


STEPS_PER_MODE = {"hard": 340, "easy": 340}  # x 16 envs: 5,440 states per mode, 10,880 in all
NUM_ENVS = 16


def _set_field(state: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(state)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


class ProcgenStates:
    """Stock Fruitbot in procgen (its own environment: common/envs/procgen_env.py), whose states can be read, edited
    and written."""

    def __init__(self, mode: str, num: int, seed: int):
        options = dict(env_name="fruitbot", distribution_mode=mode, num_levels=0, start_level=0, rand_seed=seed)
        self.env = ProcgenEnv(num=num, **options)
        self.scratch = ProcgenEnv(num=1, **options)
        self.num = num

    def get(self, env, i: int) -> bytes:
        return env.get_state(i)

    def put(self, env, i: int, state: bytes):
        env.set_state(i, state)

    def replay(self, state: bytes, action: int) -> bytes:
        """The state right after `action`, with nothing that could end the level (the terminal step's own view)."""
        self.put(self.scratch, 0, fb.neutralised(state))
        self.scratch.act(np.array([action], np.int32))
        return self.get(self.scratch, 0)


def _canonical(game: fj.Game, config) -> np.ndarray:
    """The live slots in procgen's list order (keys oldest first): procgen erases entities from its list."""
    lay = fj.layout(config)
    live = np.flatnonzero(np.asarray(game.alive))
    age = np.where(live >= lay.bullets, -np.asarray(game.life)[live], 0)
    return live[np.lexsort((age, live >= lay.bullets))]


def _compare(a: fj.Game, b: fj.Game, config, fields=("x", "y", "vx", "vy", "rx", "ry", "kind", "sprite")) -> list[str]:
    """Names of the fields in which the live entities of a and b differ ([] if none)."""
    a, b = jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, b)
    ia, ib = _canonical(a, config), _canonical(b, config)
    if len(ia) != len(ib) or not np.array_equal(a.kind[ia], b.kind[ib]):
        return ["entities"]
    bad = [k for k in fields if not np.array_equal(getattr(a, k)[ia], getattr(b, k)[ib])]
    return bad + [k for k in ("cur_time", "last_fire") if int(getattr(a, k)) != int(getattr(b, k))]


def run_against_procgen(mode: str, steps: int, seed: int = 0, step_fn=None):
    """Mismatch classes -> count, and counts of what the play covered."""
    config = fj.CONFIGS[f"stock-{mode}"]
    rewards = jnp.asarray(fj.task_games(config, fj.TRAIN_TASKS[:1]).rewards[0])
    step_fn = step_fn or fj.game_step
    step = jax.jit(jax.vmap(lambda g, a: step_fn(g, a, config, rewards)))
    envs = ProcgenStates(mode, NUM_ENVS, seed)
    rng = np.random.default_rng(seed)
    envs.env.act(np.full(NUM_ENVS, -1, np.int32))
    mismatches, seen = {}, {"states": 0, "deaths": 0, "completions": 0, "timeouts": 0, "keys": 0, "doors_opened": 0,
                            "collected": 0}
    for _ in range(steps):
        before = []
        for i in range(NUM_ENVS):
            state = envs.get(envs.env, i)
            u = rng.random()
            layout = fb.StateLayout(state)
            if u < 0.04:  # move the agent to a random spot of the level (near barriers, objects, the presents)
                x = rng.uniform(0.4, fj.CONFIGS[f"stock-{mode}"].main_width - 0.4)
                y = rng.uniform(0.4, config.main_height - 0.4)
                state = _set_field(_set_field(state, layout.entities, "<f", x), layout.entities + 4, "<f", y)
            elif u < 0.05:  # the level clock near its limit
                state = _set_field(state, layout.step_fields + 4 * fb.CUR_TIME_FIELD, "<i",
                                   int(rng.integers(fj.TIMEOUT - 3, fj.TIMEOUT)))
            if u < 0.05:
                envs.put(envs.env, i, state)
            before.append(state)
        scripted = np.array([fb.gap_seeking_action(s, fb.WORLD_WIDTH[mode]) for s in before])
        u = rng.random(NUM_ENVS)
        actions = np.where(u < 0.6, scripted, np.where(u < 0.8, rng.integers(0, fj.NUM_ACTIONS, NUM_ENVS), fb.FIRE))
        actions = actions.astype(np.int32)
        envs.env.act(actions)
        reward, _, first = envs.env.observe()
        info = envs.env.get_info()
        games = [fj.game_from_procgen(s, config) for s in before]
        after, events = step(jax.tree.map(lambda *xs: jnp.stack(xs), *games), jnp.asarray(actions))
        for i in range(NUM_ENVS):
            seen["states"] += 1
            ev = jax.tree.map(lambda x: np.asarray(x[i]), events)
            complete = bool(info[i]["prev_level_complete"])
            bad = []
            if bool(ev.done) != bool(first[i]):
                bad.append("done")
            if bool(ev.level_complete) != complete:
                bad.append("level_complete")
            if abs(float(ev.stock_reward) - float(reward[i])) > 1e-4:
                bad.append("stock_reward")
            game_after = jax.tree.map(lambda x: x[i], after)
            if first[i]:
                replayed = envs.replay(before[i], int(actions[i]))
                truth = fj.game_from_procgen(replayed, config)
                # the agent's move (keys may differ: in the replay barriers no longer stop them)
                bad += [f"terminal agent {k}" for k in ("x", "y", "vx", "vy")
                        if float(getattr(truth, k)[0]) != float(getattr(game_after, k)[0])]
                collected = fb.type_counts(before[i]) - fb.type_counts(replayed)
                seen["deaths"] += int(not complete and not ev.timed_out)
                seen["completions"] += int(complete)
                seen["timeouts"] += int(bool(ev.timed_out))
            else:
                truth = fj.game_from_procgen(envs.get(envs.env, i), config)
                bad += _compare(truth, game_after, config)
                collected = fb.type_counts(before[i]) - fb.type_counts(envs.get(envs.env, i))
                kinds = np.asarray(games[i].kind)[np.asarray(games[i].alive)]
                seen["doors_opened"] += int(np.sum(kinds == fj.DOOR) > np.sum(
                    np.asarray(truth.kind)[np.asarray(truth.alive)] == fj.DOOR))
            if not np.array_equal(collected, ev.collected):
                bad.append("collected")
            if not np.array_equal(fb.category_cumulants(collected), np.asarray(fj.category_counts(ev.collected))):
                bad.append("phi")
            seen["collected"] += int(collected.sum())
            seen["keys"] += int(np.sum(np.asarray(games[i].kind)[np.asarray(games[i].alive)] == fj.BULLET))
            for k in bad:
                mismatches[k] = mismatches.get(k, 0) + 1
    return mismatches, seen


@pytest.mark.parametrize("mode", ["hard", "easy"])
def test_dynamics_match_procgen(mode):
    mismatches, seen = run_against_procgen(mode, STEPS_PER_MODE[mode])
    print(f"\nFruitbot {mode}: {seen}; mismatches {mismatches or 0}")
    assert seen["states"] >= 5000 and seen["deaths"] > 20 and seen["completions"] > 5 and seen["timeouts"] > 5
    assert seen["keys"] > 100 and seen["collected"] > 50
    if mode == "hard":
        assert seen["doors_opened"] > 0
    assert not mismatches, f"JAX Fruitbot differs from procgen {mode}: {mismatches}"


def _mutant(old: str, new: str, monkeypatch) -> types.ModuleType:
    """common.envs.fruitbot_jax with one line of its source changed (a planted rule bug)."""
    source = inspect.getsource(fj)
    assert source.count(old) == 1, old
    module = types.ModuleType("fruitbot_jax_mutant")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # its dataclasses look themselves up there
    exec(compile(source.replace(old, new), "fruitbot_jax_mutant", "exec"), module.__dict__)
    return module


PLANTED = {
    # collisions tested where the agent was before its move, not after it
    "collision order": ("touch = others & _hits(x, y, game.rx, game.ry, ax, ay,",
                        "touch = others & _hits(x, y, game.rx, game.ry, game.x[0], game.y[0],"),
    "scroll speed": ("MIXRATE, MAXSPEED, THRUST_Y = 0.5, 0.85, 0.2", "MIXRATE, MAXSPEED, THRUST_Y = 0.5, 0.85, 0.21"),
    "category swapped": ("TYPE_CATEGORY = np.repeat(np.arange(TASK_DIM), 3)",
                         "TYPE_CATEGORY = np.repeat(np.arange(TASK_DIM), 3)[[6, 1, 2, 3, 4, 5, 0, 7, 8, 9, 10, 11]]"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_rule_bugs_are_caught(bug, monkeypatch):
    mutant = _mutant(*PLANTED[bug], monkeypatch)
    monkeypatch.setattr(fj, "category_counts", mutant.category_counts)  # the test reads phi through fj
    mismatches, seen = run_against_procgen("hard", 60, seed=3, step_fn=mutant.game_step)
    print(f"\nplanted {bug}: mismatches {mismatches}")
    assert mismatches, f"the planted bug {bug!r} went unnoticed"


# ---------------------------------------------------------------------------------------------------------------------
# Level generation: distributions against procgen's levels
# ---------------------------------------------------------------------------------------------------------------------
NUM_LEVELS = 2048
ALPHA = 1e-3  # per statistic, Bonferroni-corrected below: a correct generator fails a run with probability <= 0.001


def level_statistics(games: list[fj.Game], config) -> dict[str, np.ndarray]:
    """Per-level and pooled quantities whose distributions procgen's rules fix."""
    lay = fj.layout(config)
    stats = {k: [] for k in ("agent_x", "row_y", "gap_width", "gap_left", "doors", "fruit", "food", "object_x",
                             "object_y", "spacing", "sprite", "background", "present")}
    for g in games:
        g = jax.tree.map(np.asarray, g)
        stats["agent_x"].append(g.x[0])
        rows = lay.walls + 4 * np.arange(config.num_walls)
        stats["row_y"] += list(g.y[rows])
        stats["gap_width"] += list((g.x[rows + 1] - g.rx[rows + 1]) - (g.x[rows] + g.rx[rows]))
        stats["gap_left"] += list(2 * g.rx[rows])
        stats["doors"].append(int(g.alive[rows + 2].sum()))
        objects = np.flatnonzero(g.alive & ((g.kind == fj.GOOD) | (g.kind == fj.BAD)))
        stats["fruit"].append(int(np.sum(g.kind[objects] == fj.GOOD)))
        stats["food"].append(int(np.sum(g.kind[objects] == fj.BAD)))
        stats["object_x"] += list(g.x[objects])
        stats["object_y"] += list(g.y[objects])
        dist = np.hypot(g.x[objects, None] - g.x[None, objects], g.y[objects, None] - g.y[None, objects])
        np.fill_diagonal(dist, np.inf)
        stats["spacing"] += list(dist.min(1))
        stats["sprite"] += list(g.sprite[objects])
        stats["background"].append(int(g.background))
        stats["present"] += list(g.sprite[lay.presents:lay.presents + config.main_width])
    return {k: np.asarray(v) for k, v in stats.items()}


CATEGORICAL = ("doors", "sprite", "background", "present")


def compare_distributions(a: dict, b: dict) -> dict[str, float]:
    """p-value per statistic: two-sample Kolmogorov-Smirnov (chi-square on counts for the categorical ones)."""
    from scipy import stats

    out = {}
    for k in a:
        if k in CATEGORICAL:
            values = np.union1d(a[k], b[k])
            table = np.array([[np.sum(x == v) for v in values] for x in (a[k], b[k])])
            out[k] = 1.0 if len(values) == 1 else float(stats.chi2_contingency(table)[1])
        else:
            out[k] = float(stats.ks_2samp(a[k], b[k]).pvalue)
    return out


def procgen_levels(mode: str, config) -> list[fj.Game]:
    envs = ProcgenStates(mode, 64, seed=5)
    games = []
    while len(games) < NUM_LEVELS:
        envs.env.act(np.full(64, -1, np.int32))  # action -1: every env starts a fresh level
        games += [fj.game_from_procgen(envs.get(envs.env, i), config) for i in range(64)]
    return games[:NUM_LEVELS]


def jax_levels(config, seed: int = 0) -> list[fj.Game]:
    games = fj.task_games(config, fj.TRAIN_TASKS[:1])
    make = jax.jit(jax.vmap(lambda k: fj.generate_level(k, config, games, 0)))
    levels = make(jax.random.split(jax.random.PRNGKey(seed), NUM_LEVELS))
    return [jax.tree.map(lambda x: x[i], levels) for i in range(NUM_LEVELS)]


@pytest.fixture(scope="module")
def procgen_statistics():
    return {mode: level_statistics(procgen_levels(mode, fj.CONFIGS[f"stock-{mode}"]), fj.CONFIGS[f"stock-{mode}"])
            for mode in ("hard", "easy")}


@pytest.mark.parametrize("mode", ["hard", "easy"])
def test_generated_levels_match_procgen(mode, procgen_statistics):
    config = fj.CONFIGS[f"stock-{mode}"]
    ours = level_statistics(jax_levels(config), config)
    p = compare_distributions(procgen_statistics[mode], ours)
    print(f"\nFruitbot {mode} levels ({NUM_LEVELS} each), p-values: " + ", ".join(f"{k} {v:.3g}" for k, v in p.items()))
    failed = {k: v for k, v in p.items() if v < ALPHA / len(p)}
    assert not failed, f"JAX levels differ from procgen {mode}'s: {failed}"


@pytest.mark.parametrize("change", [{"min_pct": 0.13}, {"group_size": 5}])
def test_a_planted_generator_change_fails(change, procgen_statistics):
    config = dataclasses.replace(fj.CONFIGS["stock-hard"], **change)
    p = compare_distributions(procgen_statistics["hard"], level_statistics(jax_levels(config), config))
    failed = {k: v for k, v in p.items() if v < ALPHA / len(p)}
    print(f"\nplanted {change}: failing statistics {failed}")
    assert failed, f"the planted generator change {change} went unnoticed"


# ---------------------------------------------------------------------------------------------------------------------
# The environment: the paper's games, lifetimes, level pools, bad input
# ---------------------------------------------------------------------------------------------------------------------
def _play(env, params, steps: int, key, policy="mixed"):
    """Random / gap-seeking play of 64 envs over all of params' tasks; the per-step outputs [steps, 64]."""
    n = 64

    @jax.jit
    def run(key):
        _, state = jax.vmap(env.reset_to, (0, 0, None))(
            jax.random.split(key, n), jnp.arange(n) % params.tasks.shape[0], params)

        def step(state, key):
            k_act, k_mix, k_env = jax.random.split(key, 3)
            scripted = jax.vmap(lambda g: fj.gap_seeking_action(g, env.config))(state.game)
            random = jax.random.randint(k_act, (n,), 0, fj.NUM_ACTIONS)
            action = jnp.where(jax.random.uniform(k_mix, (n,)) < 0.7, scripted, random)
            _, new, reward, terminated, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(
                jax.random.split(k_env, n), state, action, params)
            return new, (reward, terminated, truncated, info, state.task, state.levels)

        return jax.lax.scan(step, state, jax.random.split(key, steps))[1]

    return jax.tree.map(np.asarray, run(key))


def test_the_papers_games_pay_w_dot_phi_and_show_their_categories():
    """In the paper configuration the original's games' own rewards (good +1, bad the task's penalty, neutral 0, no
    completion bonus) equal w . phi at every step, and each task's levels hold only the categories its game
    spawns (a train task: its own and one distractor category)."""
    env = fj.FruitbotJax("paper")
    tasks = np.concatenate([fj.TRAIN_TASKS, fj.TEST_TASKS])
    params = env.make_params(tasks, num_levels=20)
    reward, terminated, truncated, info, task, levels = _play(env, params, 1500, jax.random.PRNGKey(0))
    np.testing.assert_allclose(info["stock_reward"], reward, atol=1e-6)
    np.testing.assert_allclose(reward, (info["phi"] * info["w"]).sum(-1), atol=1e-6)
    assert info["level_complete"].sum() > 20 and terminated.sum() > 20  # levels end both ways
    shown = {(1, 0, 0, 0): {0, 1}, (0, 1, 0, 0): {0, 1}, (0, 0, 1, 0): {0, 2}, (0, 0, 0, 1): {0, 3},
             (1, 1, 1, 1): {0, 2}, (1, -1, -1, -1): {0, 1}, (1, 0, -1, -1): {0, 1, 2}, (1, 0, 1, 1): {0, 1, 2},
             (1, 0, 0, -1): {0, 1, 3}, (1, 0, 0, 1): {0, 1, 3}}
    pool = jax.tree.map(np.asarray, params.pool)
    for t, w in enumerate(tasks):
        objects = pool.alive[t] & np.isin(pool.kind[t], (fj.GOOD, fj.BAD, fj.NEUTRAL))
        categories = set(fj.TYPE_CATEGORY[pool.sprite[t][objects] - fj.frame.FRUIT].tolist())
        assert categories == shown[tuple(int(v) for v in w)], (w, categories)
    collected = info["phi"].sum((0, 1))
    assert (collected > 0).all()  # every category gets collected somewhere


def _edited(state: fj.EnvState, **game_fields) -> fj.EnvState:
    return state.replace(game=state.game._replace(**game_fields))


def test_a_lifetime_is_four_levels_and_ends_by_termination_or_truncation():
    env = fj.FruitbotJax("paper")
    params = env.make_params(fj.TRAIN_TASKS, num_levels=4)
    step = jax.jit(lambda k, s, a: env.step(k, s, a, params))
    _, state = env.reset_to(jax.random.PRNGKey(0), 2, params)
    top = float(env.config.main_height - 1.41)  # the agent's box reaches the presents on its next step
    for level in range(1, 5):
        state = _edited(state, y=state.game.y.at[0].set(top))
        obs, state, reward, terminated, truncated, info = step(jax.random.PRNGKey(level), state, 4)
        assert bool(info["level_complete"]) and int(info["levels"]) == level and not bool(truncated)
        assert bool(terminated) == (level == 4) and float(info["stock_reward"]) == 0.0  # no completion bonus
        assert int(state.levels) == (level % 4) and int(state.game.cur_time) == 0  # a fresh level
        if level < 4:
            assert int(state.task) == 2  # the episode goes on with its task
    # death: the agent on a barrier
    lay = fj.layout(env.config)
    barrier = lay.walls
    state = _edited(state, x=state.game.x.at[0].set(state.game.x[barrier]), y=state.game.y.at[0].set(
        state.game.y[barrier] - 0.5))
    _, state, _, terminated, truncated, info = step(jax.random.PRNGKey(9), state, 4)
    assert bool(terminated) and bool(info["died"]) and not bool(truncated)
    # the level clock runs out: truncation
    state = _edited(state, cur_time=jnp.asarray(fj.TIMEOUT - 1, jnp.int32))
    _, state, _, terminated, truncated, info = step(jax.random.PRNGKey(10), state, 4)
    assert bool(truncated) and bool(info["timed_out"]) and not bool(terminated) and int(state.game.cur_time) == 0


def test_levels_come_from_the_pool_and_fresh_levels_differ():
    env = fj.FruitbotJax("stock-easy")
    params = env.make_params(fj.TRAIN_TASKS, num_levels=3, seed=0)
    again = env.make_params(fj.TRAIN_TASKS, num_levels=3, seed=0)
    np.testing.assert_array_equal(params.pool.x, again.pool.x)  # the same levels for every run, as procgen's seeds
    starts = jax.vmap(lambda k: env.reset(k, params)[1])(jax.random.split(jax.random.PRNGKey(1), 64))
    xs = {tuple(np.asarray(x).round(5)) for x in np.asarray(starts.game.x[:, 1:])}
    # 3 levels: a stock game is the same for every task, and each task's pool is drawn from the same keys (as procgen's
    # level seeds are the same whatever the task; in the paper's games the keys then give the same barrier rows)
    assert len(xs) == 3
    fresh = env.make_params(fj.TRAIN_TASKS, num_levels=0)
    starts = jax.vmap(lambda k: env.reset(k, fresh)[1])(jax.random.split(jax.random.PRNGKey(1), 64))
    assert len({tuple(np.asarray(x).round(5)) for x in np.asarray(starts.game.x[:, 1:])}) == 64


def test_the_default_params_are_drawn_once_and_concretely():
    """reset/step without params use the train tasks' 200-level pools, drawn once: first asked for inside a jitted
    reset, they are kept as concrete arrays (no leaked tracer), and a later call reuses them."""
    env = fj.FruitbotJax("stock-easy")
    obs, state = jax.jit(env.reset)(jax.random.PRNGKey(0))
    params = env.default_params
    assert not isinstance(params.pool.x, jax.core.Tracer) and params.pool.x.shape[1] == 200
    env.step(jax.random.PRNGKey(1), state, 0)
    assert env.default_params is params


@pytest.mark.parametrize("call, message", [
    (lambda: fj.FruitbotJax("medium"), "Fruitbot config must be one of"),
    (lambda: fj.FruitbotJax("paper").make_params([[0.5, 0, 0, 0]]), "has no game for task [0.5, 0.0, 0.0, 0.0]"),
    (lambda: fj.FruitbotJax("paper").make_params([[1, 0, 0]]), "Fruitbot tasks must be an [n, 4] array"),
])
def test_bad_input_gets_one_line(call, message):
    from common.run import ConfigError

    with pytest.raises(ConfigError) as error:
        call()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_paper_games_never_show_more_than_the_renderer_draws():
    """render draws a fixed number of slots in view (fruitbot_frame.max_visible); over the paper's training and test
    levels (200 per task), with the agent at every height, the slots in view stay within it (with room to spare)."""
    env = fj.FruitbotJax("paper")
    params = env.make_params(np.concatenate([fj.TRAIN_TASKS, fj.TEST_TASKS]), num_levels=200)
    pool = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]), params.pool)  # [levels, N]
    heights = jnp.arange(0.4, env.config.main_height, 0.25)

    def most(y, ry, sprite, alive):
        counts = jax.vmap(lambda h: fj.frame.count_visible(y.at[0].set(h), ry, sprite, alive, 10))(heights)
        return counts[0].max(), counts[1].max()

    tiled, others = jax.jit(jax.vmap(most))(pool.y, pool.ry, pool.sprite, pool.alive)
    limit = fj.frame.max_visible(env.config.main_width)
    print(f"\npaper levels: at most {int(tiled.max())} tiled and {int(others.max())} other slots in view "
          f"(render draws {limit})")
    assert int(tiled.max()) <= limit[0] and int(others.max()) <= limit[1] - 5


# ---------------------------------------------------------------------------------------------------------------------
# Game views: the replay's compact items, drawn back into the frames the actors saw
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", ["paper", "stock-hard"])
def test_frames_drawn_from_game_views_are_the_frames_the_actors_saw(config):
    """Every observation of 32 envs over 240 steps of mixed play (and their first), drawn back from its GameView
    alone and the level pool, is bit-identical to the frame the env rendered from its whole state. Lifetimes of 2
    levels and half the agents started near the presents make the steps cross level completions, deaths, lifetime
    ends and episode starts; in stock hard, keys fly and locked doors open."""
    env = fj.FruitbotJax(config, max_levels=2)
    tasks = fj.TRAIN_TASKS if config == "paper" else fj.TRAIN_TASKS[:1]
    params = env.make_params(tasks, num_levels=16)
    lay, n = fj.layout(env.config), 32
    view = jax.vmap(env.view, (0, None))

    @jax.jit
    def run(key):
        k_reset, k_y, key = jax.random.split(key, 3)
        _, state = jax.vmap(env.reset_to, (0, 0, None))(jax.random.split(k_reset, n), jnp.arange(n) % len(tasks),
                                                        params)
        high = env.config.main_height - 1.41 - 6 * jax.random.uniform(k_y, (n,))  # near the presents
        state = _edited(state, y=state.game.y.at[:, 0].set(jnp.where(jnp.arange(n) % 2 == 0, state.game.y[:, 0],
                                                                      high)))
        obs = jax.vmap(env.observe, (0, None))(state, params)

        def step(state, key):
            k_act, k_mix, k_env = jax.random.split(key, 3)
            scripted = jax.vmap(lambda g: fj.gap_seeking_action(g, env.config))(state.game)
            action = jnp.where(jax.random.uniform(k_mix, (n,)) < 0.7, scripted,
                               jax.random.randint(k_act, (n,), 0, fj.NUM_ACTIONS))
            obs, new, _, terminated, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(
                jax.random.split(k_env, n), state, action, params)
            doors_open = (state.game.kind == fj.DOOR) & ~state.game.alive & jnp.take_along_axis(
                params.pool.alive.reshape(-1, lay.size), view(state, params).level[:, None], 0)
            return new, (obs.image, view(new, params), terminated | truncated, info["level_complete"],
                         state.game.alive[:, lay.bullets:].any(-1), doors_open.any(-1))

        first = (obs.image, view(state, params))
        return first, jax.lax.scan(step, state, jax.random.split(key, 240))[1]

    (first_frame, first_view), (frames, views, episode_end, complete, keys, doors) = run(jax.random.PRNGKey(0))
    frames = np.concatenate([np.asarray(first_frame)[None], np.asarray(frames)])
    views = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first_view, views)
    drawn = np.asarray(jax.jit(env.draw)(views, params))
    assert drawn.shape == frames.shape == (241, n, 64, 64, 3)
    np.testing.assert_array_equal(drawn, frames)
    episode_end, complete = np.asarray(episode_end), np.asarray(complete)
    counts = (episode_end.sum(), (complete & ~episode_end).sum(), np.asarray(keys).sum(), np.asarray(doors).sum())
    print(config, "lifetime ends, levels completed within a lifetime, steps with a key, with an open door:", counts)
    assert counts[0] >= 10 and counts[1] >= 5  # lifetimes end, and levels end within them
    assert np.asarray(keys).sum() > 0 or config == "paper"  # keys fly in stock hard (the paper's games have no doors)
    assert np.asarray(doors).sum() > 0 or config == "paper"
    assert views.alive.dtype == np.uint8 and views.alive.shape[-1] == -(-lay.size // 8)
