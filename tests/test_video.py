"""tools.video: the watched episode is the evaluation's episode, its overlay shows the evaluation's numbers, and bad
input stops with one line. Uses the saved MSFA agent committed under results/babyai/ (Fruitbot's: an untrained agent
of the paper's network written here; UVFA-FARM's: a tiny run here; MiniHack's: tests/test_msfa_minihack.py's tiny
run)."""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import numpy as np
import pytest

from helpers import check_video_is_the_evaluations
from tools import video

ROOT = Path(__file__).resolve().parent.parent
MSFA_BABYAI = ROOT / "results/babyai/paper_protocol_h200/msfa"  # committed in compact form (.eqz)


@pytest.fixture(scope="module")
def uvfa_farm_babyai(tmp_path_factory):
    """A tiny UVFA-FARM run (the repository keeps the saved agents of MSFA alone)."""
    from helpers import VARIANTS

    script, settings, _ = VARIANTS["uvfa-farm"]
    run_dir = tmp_path_factory.mktemp("video") / "uvfa_farm"
    script.main(script.Args(**(settings | dict(run_dir=str(run_dir), total_timesteps=64, log_every=64,
                                               eval_every=64))))
    return run_dir


def test_babyai_video_is_the_evaluations_episode_with_gpi():
    trace = check_video_is_the_evaluations(MSFA_BABYAI, "-1,1,0,1", "on", seed=3)
    assert len(trace.reward) == 200 and trace.contribution.shape == (200, 4)
    assert [f.shape for f in trace.frames[0]] == [(320, 320, 3), (40, 40, 3)]  # the room from above, the agent's view
    train = {tuple(w) for w in np.eye(4)}
    assert {tuple(z) for z in trace.z} <= train  # z* is always one of the train tasks
    counts = trace.phi.sum(0)
    lines = video.overlay_lines(trace, 199, "babyai", np.array([-1, 1, 0, 1.0]), True)
    assert lines[1] == "pickups: " + "  ".join(f"{n} {int(c)}" for n, c in zip(video.CATEGORY_NAMES["babyai"], counts))


def test_babyai_video_of_a_uvfa_agent_without_gpi(uvfa_farm_babyai):
    trace = check_video_is_the_evaluations(uvfa_farm_babyai, "1,1,1,1", "off", seed=1)
    assert trace.contribution.shape == (200, 0)


@pytest.fixture(scope="module")
def msfa_fruitbot_agent(tmp_path_factory):
    """An MSFA agent of the paper's Fruitbot network, as a run saves it (untrained: the video's frames and values
    are what is checked, not what it learned; the repository keeps no Fruitbot agent)."""
    import dataclasses

    import jax

    import msfa_fruitbot
    from common.run import save_checkpoint

    args = msfa_fruitbot.Args(train_levels=200)
    params = eqx.filter(msfa_fruitbot.make_network(args, jax.random.PRNGKey(1)), eqx.is_inexact_array)
    run_dir = tmp_path_factory.mktemp("video") / "msfa_fruitbot"
    run_dir.mkdir()
    save_checkpoint(run_dir / "params_seed1.eqx", params, {"step": 0, "method": "MSFA", "script": "msfa_fruitbot.py",
                                                           "env": "fruitbot", "args": dataclasses.asdict(args),
                                                           "seed": 1})
    return run_dir


def test_fruitbot_video_frames_and_values(msfa_fruitbot_agent):
    trace, header, env, w, args = video.record_episode(msfa_fruitbot_agent, "1,0,1,1", "on", max_steps=12)
    assert env == "fruitbot" and len(trace.reward) == 12 and not trace.complete
    assert trace.frames[0][0].shape == (64, 64, 3)
    np.testing.assert_allclose(trace.contribution.sum(-1), trace.q, atol=1e-4)
    frames = video.video_frames(trace, header, env, w, True, args)
    assert len(frames) == 12 and len({f.shape for f in frames}) == 1


def test_cli_writes_one_frame_per_step(tmp_path, capsys):
    out = tmp_path / "agent.gif"
    video.main(video.Args(str(MSFA_BABYAI), task="1,0,0,0", gpi="off", max_steps=7, out=str(out)))
    from PIL import Image

    assert Image.open(out).n_frames == 7
    assert "7 frames (stopped at --max-steps 7)" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("overrides, message", [
    (dict(task="1,0,0"), "has 3 weights; a task of this env has 4"),
    (dict(task="1,a,0,0"), "is not a task vector"),
    (dict(task="1,0,0,0;0,1,0,0"), "--task takes one task vector"),
    (dict(run_dir="missing"), "is not a directory"),
    (dict(run_seed=7), "params_seed7.eqx does not exist; this run has seeds 1"),
    (dict(run_dir="uvfa-farm"), "has no successor features, so no GPI: use --gpi off"),
    (dict(out="agent.mp4"), "--out must name a .gif file"),
    (dict(gpi="maybe"), "--gpi must be on or off"),
    (dict(panel_height=8), "--panel-height must be at least 16 pixels"),
])
def test_bad_input_gets_one_line(overrides, message, tmp_path, capsys, request):
    fields = dict(run_dir=str(MSFA_BABYAI), out=str(tmp_path / "a.gif")) | overrides
    if fields["run_dir"] == "missing":
        fields["run_dir"] = str(tmp_path / "missing")
    if fields["run_dir"] == "uvfa-farm":
        fields["run_dir"] = str(request.getfixturevalue("uvfa_farm_babyai"))
    with pytest.raises(SystemExit) as exit_info:
        video.main(video.Args(**fields))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not list(tmp_path.glob("*.gif"))
