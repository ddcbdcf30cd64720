"""Watch a saved agent: one greedy episode as an animated GIF, with what the agent computed at every step.

    python -m tools.video RUN_DIR --task "-1,1,0,1" [--gpi on|off] [--seed N] --out agent.gif

Any run of any script, on any env: BabyAI as the whole room seen from above (the minigrid twin's full render, the
agent's field of view highlighted) beside the agent's own 5x5 view; Fruitbot from its 64x64 frames (the agent sees
the whole frame); MiniHack from the agent-centred 9x9 crop of tiles the network sees (drawn at 16 pixels a tile, before
the 64x64 resize). Under each frame:

- the step, the action, the step's reward and the return so far;
- the pickups so far per category (BabyAI, Fruitbot: the env's phi summed over the episode; MiniHack: the episode's
  end, success or death);
- the policy z* that GPI chose (the train task whose successor features give the chosen action its value; without
  GPI z* = w), and each module's contribution psi^k(s, a, z*) . w^k to the chosen action's value Q(s, a): the
  contributions sum to Q. USFA's contributions are per cumulant; the UVFA family has no psi and shows Q alone.

The episode is the one the run's own evaluation plays for that task, seed and key: `tools.evaluate RUN_DIR --tasks
W --episodes 1 --seed S` returns the same return (tests/test_video.py checks it). The agent is one seed's parameter
file (params_seed<N>.eqx, written at every evaluation), rebuilt with the script that trained it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import tyro

from common.run import exit_on_config_error, format_task, require
from tools.script_contract import has_psi, play_names, require_names
from tools.evaluate import greedy_step, load_agent, params_files, parse_tasks
from tools.run_reader import recorded_env, tasks_of_env

CATEGORY_NAMES = {
    "babyai": ("red ball", "blue ball", "green key", "yellow box"),
    "fruitbot": ("fruit 1-3", "fruit 4-6", "food 1-3", "food 4-6"),
    "minihack": ("monster", "trap", "dark"),
}
ACTION_NAMES = {
    "babyai": ("left", "right", "forward", "pickup"),
    "minihack": ("N", "E", "S", "W", "NE", "SE", "SW", "NW"),
}  # Fruitbot's 15 are procgen's button combinations: shown by index
TEXT_LINES = 5


@dataclass
class Args:
    run_dir: tyro.conf.Positional[str]
    """a run directory holding params_seed<N>.eqx files"""
    task: str = "1,1,0,0"
    """the task vector w the agent acts on (comma-separated weights), or train/test for the first of the env's set"""
    gpi: str = "on"
    """on: GPI over the run's GPI support (the SF methods' evaluation policy); off: act on w (the UVFA family: off)"""
    seed: int = 0
    """seed of the episode (tools.evaluate's --seed; a run's own evaluation at step S used 10000 + S)"""
    run_seed: int | None = None
    """which of the run's seeds to watch (params_seed<N>.eqx); default: the first"""
    max_steps: int = 400
    """stop the video after this many steps (a Fruitbot lifetime can last 4,000)"""
    fps: float = 8.0
    """frames per second of the GIF"""
    panel_height: int = 240
    """pixels: each panel (the view from above, the agent's view) is scaled to at most this height: up by the largest
    whole factor (nearest neighbour), or averaged down where the panel is taller"""
    out: str = "agent.gif"
    """the GIF to write"""


@dataclass
class Trace:
    """One greedy episode, step by step (T steps; frames[t] is what the agent saw before acting at t)."""
    frames: list  # per step, the panels [H, W, 3] uint8 (BabyAI: room from above, agent's view; else one)
    action: np.ndarray  # int [T]
    reward: np.ndarray  # float [T]
    phi: np.ndarray  # float [T, C]: the env's cumulant of each step (MiniHack: zeros)
    q: np.ndarray  # float [T]: the value the policy gave the chosen action
    z: np.ndarray  # float [T, C]: the policy z* GPI chose (w without GPI)
    contribution: np.ndarray  # float [T, G]: per module (or cumulant) sum of psi_c(s, a, z*) w_c; empty for UVFA
    ends: list  # per step, a word on how the step ended ("", "success", "died", "timeout", "level")
    complete: bool  # the episode ended within the steps played


def select_params(run_dir: Path, run_seed: int | None) -> Path:
    files = params_files(run_dir)
    if run_seed is None:
        return files[0]
    chosen = [p for p in files if p.stem == f"params_seed{run_seed}"]
    require(chosen, f"{run_dir / f'params_seed{run_seed}.eqx'} does not exist; this run has seeds "
                    f"{', '.join(p.stem.split('seed')[1] for p in files)}")
    return chosen[0]


def gpi_support(env: str, args) -> jax.Array:
    train, test = tasks_of_env(env)
    return jnp.asarray(test if getattr(args, "gpi_support", "train") == "test" else train)


def network_input(env: str, setup):
    """The stored observation -> what core_step takes (as the scripts' evaluations feed it)."""
    render = getattr(setup, "render", None)  # usfa.py / uvfa.py: BabyAI and MiniHack draw theirs
    if render is not None:
        return render
    if env == "babyai":
        return setup.env.rgb_from_symbolic
    return lambda image: image  # Fruitbot's frames; msfa_minihack.py's core_step draws its tiles itself


def contribution_groups(args, num_categories: int) -> tuple[int, str]:
    """How the chosen action's value splits: MSFA's modules (each its slice of psi and w), else one part per
    cumulant (USFA, and MSFA with entangled psi)."""
    if hasattr(args, "num_modules") and not getattr(args, "entangled_psi", False):
        return args.num_modules, "module"
    return num_categories, "cumulant"


def make_decide(script, setup, env: str, args, use_gpi: bool):
    """A jitted decide(params, image, w, prev_action, prev_reward, rnn) -> (action, Q(s, a), z*, contributions,
    rnn): one greedy step of the script's evaluation policy, with what it computed on the way."""
    policies = gpi_support(env, args)
    to_input = network_input(env, setup)
    groups = contribution_groups(args, policies.shape[1])[0]

    @jax.jit
    def decide(params, image, w, prev_action, prev_reward, rnn):
        net = eqx.combine(params, setup.static)
        action, q, z_star, contribution, rnn = greedy_step(script, net, to_input, policies, use_gpi,
                                                           image, w, prev_action, prev_reward, rnn)
        contribution = contribution.reshape(groups, -1).sum(-1) if has_psi(script) else jnp.zeros(0)
        return action, q, z_star, contribution, rnn

    return decide


def play_babyai(script, setup, args, params, w, use_gpi: bool, key, max_steps: int) -> Trace:
    """BabyAI: the evaluation's episode (make_evaluate's key layout: [GPI setting, task, episode])."""
    from common.envs.minigrid_twin import GotoAvoidMiniGrid

    env = setup.env
    env_params = env.task_params(jnp.asarray(w))
    decide = make_decide(script, setup, "babyai", args, use_gpi)
    k_episode = jax.random.split(key, (2, 1, 1))[int(use_gpi)][0, 0]
    key_reset, key_run = jax.random.split(k_episode)
    obs, state = env.reset(key_reset, env_params)
    rnn = eqx.combine(params, setup.static).core.initial_state()
    prev_action, prev_reward = jnp.zeros((), jnp.int32), jnp.zeros(())
    twin = GotoAvoidMiniGrid(obs_mode="rgb", grid_size=env.grid_size, objects_per_category=env.objects_per_category,
                             max_steps=env.episode_steps)
    step = jax.jit(env.step)
    rows = _Rows()
    steps = min(max_steps, env_params.max_steps_in_episode)
    for k_step in jax.random.split(key_run, env_params.max_steps_in_episode)[:steps]:
        twin.reset(options={"layout": (np.asarray(state.agent_pos), int(state.agent_dir), np.asarray(state.obj_pos)),
                            "w": np.asarray(w)})
        room = twin.get_frame(highlight=True, tile_size=32)
        view = np.asarray(env.rgb_from_symbolic(obs.image))
        action, q, z, contribution, rnn = decide(params, obs.image, obs.w, prev_action, prev_reward, rnn)
        obs, state, reward, _, _, info = step(k_step, state, action, env_params)
        rows.add([room, view], action, reward, info["phi"], q, z, contribution, "")
        prev_action, prev_reward = action, reward
    return rows.trace(complete=steps == env_params.max_steps_in_episode)


def play_fruitbot_jax(script, setup, args, params, w, use_gpi: bool, key, max_steps: int) -> Trace:
    """Fruitbot's JAX game: one lifetime on the evaluation levels (make_jax_evaluate's keys, one env)."""
    from common.envs import fruitbot_jax

    env = setup.env
    eval_params = env.make_params(np.asarray(w)[None], num_levels=args.eval_levels, seed=1)
    decide = make_decide(script, setup, "fruitbot", args, use_gpi)
    k_reset, key = jax.random.split(key)
    obs, state = jax.vmap(env.reset_to, (0, 0, None))(jax.random.split(k_reset, 1), jnp.zeros(1, jnp.int32),
                                                     eval_params)
    step = jax.jit(jax.vmap(env.step, (0, 0, 0, None)))
    rnn = eqx.combine(params, setup.static).core.initial_state()
    prev_action, prev_reward = jnp.zeros((), jnp.int32), jnp.zeros(())
    rows = _Rows()
    done = False
    for _ in range(min(max_steps, args.max_levels * fruitbot_jax.TIMEOUT)):
        key, k_step = jax.random.split(key)
        frame = np.asarray(obs.image[0])
        action, q, z, contribution, rnn = decide(params, obs.image[0], obs.w[0], prev_action, prev_reward, rnn)
        obs, state, reward, terminated, truncated, info = step(jax.random.split(k_step, 1), state, action[None],
                                                               eval_params)
        done = bool(terminated[0] | truncated[0])
        end = ("died" if bool(info["died"][0]) else "timeout" if bool(info["timed_out"][0]) else "") if done else ""
        rows.add([frame], action, reward[0], info["phi"][0], q, z, contribution, end)
        prev_action, prev_reward = action, reward[0]
        if done:
            break
    return rows.trace(complete=done)


def play_host(script, setup, args, params, w, use_gpi: bool, key, max_steps: int, env_name: str) -> Trace:
    """MiniHack (NLE) and Fruitbot on procgen: the host env of the evaluation, one env, seeded as it seeds."""
    from common.envs import minihack

    seed = int(jax.random.randint(key, (), 0, 2**31 - 1))  # the evaluation's level seed
    make = script.make_env
    env = make(args, 1, seed, np.asarray(w, np.float32)[None], num_levels=0, task_of_env=np.zeros(1, np.int64))
    obs_key = "tiles" if env_name == "minihack" else "image"
    decide = make_decide(script, setup, env_name, args, use_gpi)
    tile_images = minihack.tile_set()[0] if env_name == "minihack" else None
    rnn = eqx.combine(params, setup.static).core.initial_state()
    prev_action, prev_reward = jnp.zeros((), jnp.int32), jnp.zeros(())
    rows = _Rows()
    obs = env.reset()
    done = False
    try:
        for _ in range(max_steps):
            image = obs[obs_key][0]
            if tile_images is not None:  # the crop at 16 pixels a tile, before the network's 64x64 resize
                frame = tile_images[image].transpose(0, 2, 1, 3, 4).reshape(
                    minihack.CROP * minihack.TILE_PX, minihack.CROP * minihack.TILE_PX, 3)
            else:
                frame = np.asarray(image)
            action, q, z, contribution, rnn = decide(params, jnp.asarray(image), jnp.asarray(obs["w"][0]), prev_action,
                                                     prev_reward, rnn)
            obs, reward, terminated, truncated, info = env.step(np.asarray(action)[None])
            done = bool(terminated[0] | truncated[0])
            if env_name == "minihack":
                phi = np.zeros(len(w), np.float32)
                end = ("success" if info["success"][0] else "died" if info["died"][0] else "timeout") if done else ""
            else:
                phi = np.asarray(info["phi"][0], np.float32)
                end = ("died" if info["died"][0] else "timeout") if done else ""
            rows.add([frame], action, reward[0], phi, q, z, contribution, end)
            prev_action, prev_reward = action, jnp.asarray(reward[0], jnp.float32)
            if done:
                break
    finally:
        env.close()
    return rows.trace(complete=done)


class _Rows:
    """Collects a Trace step by step."""

    def __init__(self):
        self.columns = {k: [] for k in ("frames", "action", "reward", "phi", "q", "z", "contribution", "ends")}

    def add(self, frames, action, reward, phi, q, z, contribution, end):
        for k, v in zip(self.columns, (frames, action, reward, phi, q, z, contribution, end)):
            self.columns[k].append(v if k in ("frames", "ends") else np.asarray(v))

    def trace(self, complete: bool) -> Trace:
        c = self.columns
        return Trace(frames=c["frames"], action=np.array(c["action"]), reward=np.array(c["reward"], np.float64),
                     phi=np.array(c["phi"]), q=np.array(c["q"]), z=np.array(c["z"]),
                     contribution=np.array(c["contribution"]), ends=c["ends"], complete=complete)


def record_episode(run_dir: Path, task: str, gpi: str = "on", seed: int = 0, run_seed: int | None = None,
                   max_steps: int = 400):
    """(Trace, header, env name, w, the run's Args) of one greedy episode of a saved agent; bad input raises one-line
    ConfigErrors."""
    require(gpi in ("on", "off"), f"--gpi must be on or off, got {gpi!r}")
    require(max_steps > 0, f"--max-steps must be positive, got {max_steps}")
    path = select_params(run_dir, run_seed)
    script, args, params, header = load_agent(path)
    env_name = recorded_env(header)
    host = env_name == "minihack" or (env_name == "fruitbot" and getattr(args, "env_backend", "jax") == "procgen")
    host_env = ("make_env",) if host else ()
    require_names(script, play_names(script) + ("make_setup",) + host_env, __spec__.name, str(path))
    train, test = tasks_of_env(env_name)
    tasks = parse_tasks(task, train, test)
    require(len(tasks) == 1, f"--task takes one task vector, got {len(tasks)} ({task!r})")
    use_gpi = gpi == "on"
    require(not use_gpi or has_psi(script), f"{header['method']} has no successor features, so no GPI: use --gpi off")
    w = tasks[0]
    setup = script.make_setup(args)
    key = jax.random.fold_in(jax.random.PRNGKey(seed), header["seed"])  # tools.evaluate's key of this seed
    if host:
        trace = play_host(script, setup, args, params, w, use_gpi, key, max_steps, env_name)
    elif env_name == "fruitbot":
        trace = play_fruitbot_jax(script, setup, args, params, w, use_gpi, key, max_steps)
    else:
        trace = play_babyai(script, setup, args, params, w, use_gpi, key, max_steps)
    return trace, header, env_name, w, args


def overlay_lines(trace: Trace, t: int, env_name: str, w: np.ndarray, use_gpi: bool,
                  label: str = "module") -> list[str]:
    """The text under frame t: what the agent did and computed at step t (numbers from the Trace, nothing else)."""
    names = CATEGORY_NAMES[env_name]
    ret = float(trace.reward[: t + 1].sum())
    end = f"  [{trace.ends[t]}]" if trace.ends[t] else ""
    a = int(trace.action[t])
    action = ACTION_NAMES[env_name][a] if env_name in ACTION_NAMES else str(a)
    lines = [f"step {t + 1}  action {action}  reward {trace.reward[t]:+.2f}  "
             f"return {ret:+.2f}{end}"]
    if env_name == "minihack":
        lines.append("pickups: (MiniHack rewards reaching the goal; see the step's end)")
    else:
        counts = trace.phi[: t + 1].sum(0)
        lines.append("pickups: " + "  ".join(f"{n} {int(round(c))}" for n, c in zip(names, counts)))
    if trace.contribution.shape[1:] and trace.contribution.shape[1] > 0:
        lines.append(f"z* = [{format_task(trace.z[t])}]" + (" (GPI)" if use_gpi else " (= w, no GPI)")
                     + f"   Q(s,a) = {trace.q[t]:+.3f}")
        lines.append(f"per {label}, psi^k.w^k: " + "  ".join(f"{k + 1}: {c:+.3f}" for k, c in enumerate(
            trace.contribution[t])))
    else:
        lines.append(f"Q(s,a) = {trace.q[t]:+.3f}   (no successor features: no z*, no per-module values)")
        lines.append("")
    return lines


def compose_frame(panels: list[np.ndarray], lines: list[str], title: str, panel_height: int = 240) -> np.ndarray:
    """Panels side by side (scaled to one height), the title above, the step's lines below."""
    from PIL import Image, ImageDraw, ImageFont

    scaled = []
    for p in panels:
        if p.shape[0] > panel_height:  # averaged down (BabyAI's 320-pixel room)
            width = round(p.shape[1] * panel_height / p.shape[0])
            scaled.append(np.asarray(Image.fromarray(p).resize((width, panel_height), Image.Resampling.BOX)))
        else:  # whole pixels scaled up (the agent's 40-pixel view, Fruitbot's 64-pixel frame)
            factor = panel_height // p.shape[0]
            scaled.append(np.kron(p, np.ones((factor, factor, 1), np.uint8)))
    height = max(s.shape[0] for s in scaled)
    row = np.concatenate([np.pad(s, ((0, height - s.shape[0]), (4, 4), (0, 0)), constant_values=255)
                          for s in scaled], axis=1)
    width = max(row.shape[1], 620)
    font = ImageFont.load_default(size=13)
    line_height = 17
    top, bottom = line_height + 6, TEXT_LINES * line_height + 8
    canvas = Image.new("RGB", (width, top + height + bottom), "white")
    canvas.paste(Image.fromarray(row), ((width - row.shape[1]) // 2, top))
    draw = ImageDraw.Draw(canvas)
    draw.text((6, 4), title, fill="black", font=font)
    for i, line in enumerate(lines):
        draw.text((6, top + height + 4 + i * line_height), line, fill="black", font=font)
    return np.asarray(canvas)


def video_frames(trace: Trace, header: dict, env_name: str, w: np.ndarray, use_gpi: bool, args,
                 panel_height: int = 240) -> list[np.ndarray]:
    label = contribution_groups(args, len(w))[1]
    title = (f"{header['method']}, seed {header['seed']}, step {header['step']:,}: task w = [{format_task(w)}], "
             + ("GPI over the train tasks" if use_gpi else "acting on w"))
    return [compose_frame(trace.frames[t], overlay_lines(trace, t, env_name, w, use_gpi, label), title, panel_height)
            for t in range(len(trace.reward))]


def write_gif(frames: list[np.ndarray], path: Path, fps: float) -> None:
    from PIL import Image

    # one palette for the whole video, no dithering: a step redraws only the pixels that changed, which the GIF stores
    # as a small patch (a palette per frame, dithered, makes every frame new and the file several times larger)
    sample = Image.fromarray(np.concatenate(frames[:: max(1, len(frames) // 16)], axis=0))
    palette = sample.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    images = [Image.fromarray(f).quantize(palette=palette, dither=Image.Dither.NONE) for f in frames]
    tmp = path.with_name(path.name + ".tmp")
    images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0,
                   optimize=True)
    tmp.replace(path)


@exit_on_config_error
def main(args: Args) -> None:
    out = Path(args.out)
    require(out.suffix.lower() == ".gif", f"--out must name a .gif file, got {args.out!r}")
    require(out.parent.is_dir(), f"--out: the folder {out.parent} does not exist; create it first")
    require(args.fps > 0, f"--fps must be positive, got {args.fps}")
    require(args.panel_height >= 16, f"--panel-height must be at least 16 pixels, got {args.panel_height}")
    trace, header, env_name, w, run_args = record_episode(Path(args.run_dir), args.task, args.gpi, args.seed,
                                                          args.run_seed, args.max_steps)
    write_gif(video_frames(trace, header, env_name, w, args.gpi == "on", run_args, args.panel_height), out, args.fps)
    ended = "the episode ended" if trace.complete else f"stopped at --max-steps {args.max_steps}"
    print(f"wrote {out}: {len(trace.reward)} frames ({ended}), return {trace.reward.sum():+.2f}")


if __name__ == "__main__":
    main(tyro.cli(Args))
