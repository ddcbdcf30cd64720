"""Copy a script, change it, train it, and use every tool on it: the CleanRL promise.

A copy of msfa_babyai.py outside the repository gets another loss term (the phi regression weighted by 0.25 inside
the loss, not through a flag), a new logged metric (the mean |Q| of the batch), and another layer (a LayerNorm on each
module's state before the psi MLP). It trains tiny; then tools.evaluate (which must reproduce the run's own
evaluation), tools.analyze, tools.plot, tools.summarize and tools.compare_runs run on its directory, rebuilding
the agent with the copy named in config.json and the parameter files' headers, and label its runs by its exp_name.
A moved copy, or one without a name the tools use (docs/contract.md), gives one line.

A second copy edits one part of FARM: common/farm.py copied next to it with another inter-module attention (each
module reads the mean of the modules' values through the same gate), imported instead of common/farm.py. It trains
tiny with the plain backend (the fast ones compute the repository's FARM), and tools.evaluate reproduces it.

A third copy replaces the core itself: tests/fixtures/mean_share_core.py (per-module LSTMs sharing their mean state
through a gate; no FARM at all) in place of FarmCore, through the core's interface alone (docs/contract.md). It
trains tiny, and tools.evaluate, summarize, analyze and video work on its run."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--num-envs", "4", "--sequence-period", "8", "--sequence-length", "9", "--replay-size", "64",
         "--min-replay-size", "8", "--batch-size", "4", "--samples-per-insert", "2.0", "--target-update-period", "3",
         "--eval-episodes", "2", "--num-modules", "2", "--module-size", "16", "--attention-heads", "1",
         "--psi-hidden", "8", "--phi-hidden", "8", "--total-timesteps", "128", "--log-every", "64",
         "--eval-every", "64"]

EDITS = [  # (what the original has, what the copy has instead): each must occur exactly once
    # a loss term: the phi regression counts a quarter, written into the loss itself
    ("            + args.phi_coeff * loss_phi)", "            + 0.25 * args.phi_coeff * loss_phi)"),
    # a new metric, logged by the training loop like the others
    ('LOSS_NAMES = ("loss", "loss_q", "loss_psi", "loss_phi", "q_mean", "grad_norm")',
     'LOSS_NAMES = ("loss", "loss_q", "loss_psi", "loss_phi", "q_mean", "grad_norm", "q_abs")'),
    ('              "loss_phi": loss_phi, "q_mean": jnp.mean(out["q_mean"])}',
     '              "loss_phi": loss_phi, "q_mean": jnp.mean(out["q_mean"]), "q_abs": jnp.mean(jnp.abs(out["q_mean"]))}'),
    # a layer: LayerNorm on the module states feeding psi (new parameters the original network does not have)
    ("        inputs = jnp.concatenate([h, z[None] * self.module_masks()], axis=-1)",
     "        inputs = jnp.concatenate([jax.vmap(self.state_norm)(h), z[None] * self.module_masks()], axis=-1)"),
    ("        self.task_dim, self.entangled_psi, self.entangled_phi = task_dim, args.entangled_psi, args.entangled_phi",
     "        self.task_dim, self.entangled_psi, self.entangled_phi = task_dim, args.entangled_psi, args.entangled_phi\n"
     "        self.state_norm = eqx.nn.LayerNorm(d)"),
    ("class MSFANetwork(eqx.Module):", "class MSFANetwork(eqx.Module):\n    state_norm: eqx.nn.LayerNorm"),
]


@pytest.fixture(scope="module")
def copied_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("copy")
    source = (ROOT / "msfa_babyai.py").read_text()
    for old, new in EDITS:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    script = tmp / "my_msfa.py"
    script.write_text(source)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(script), *FLAGS], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return script, tmp / "runs" / "my_msfa__1"  # the default run directory: named after the copy


def test_the_copy_names_itself_and_logs_its_metric(copied_run):
    script, run = copied_run
    config = json.loads((run / "config.json").read_text())
    assert config["args"]["exp_name"] == "my_msfa" and config["script"] == str(script)
    header = json.loads((run / "params_seed1.eqx").open("rb").readline())
    assert header["script"] == str(script)
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert "q_abs" in rows[0] and rows[-1]["q_abs"] != ""


def test_every_results_tool_rebuilds_the_copys_agent(copied_run, tmp_path, capsys):
    from tools import analyze, compare_runs, plot, summarize, video

    from helpers import check_video_is_the_evaluations, replayed_evaluation

    _, run = copied_run
    again, ran = replayed_evaluation(run, 128, tmp_path)  # the copy's own network and settings, the same numbers
    assert again == ran and len(ran) > 0
    analyze.main(analyze.Args(run_dirs=(str(run),), out=str(tmp_path / "analysis"), episodes=2))
    assert any((tmp_path / "analysis").iterdir())
    plot.main(plot.Args(run_dirs=(str(run),), out=str(tmp_path / "figures"), reference_episodes=0))
    assert (tmp_path / "figures" / "learning_curves.png").exists()
    summarize.main(summarize.Args(run_dir=str(run)))
    compare_runs.main(compare_runs.Args(run_dirs=(str(run),)))
    out = capsys.readouterr().out
    assert "my_msfa: greedy return" in out and "| my_msfa |" in out and "| MSFA |" not in out  # labelled as the copy
    check_video_is_the_evaluations(run, "-1,1,0,1", "on")  # the copy's episode, as its own evaluation plays it
    video.main(video.Args(run_dir=str(run), task="1,0,0,0", max_steps=3, out=str(tmp_path / "copy.gif")))
    assert "3 frames" in capsys.readouterr().out


def test_a_moved_copy_gives_one_line(copied_run, tmp_path, capsys):
    from tools import evaluate

    script, run = copied_run
    moved = script.with_name("moved.py")
    script.rename(moved)
    try:
        with pytest.raises(SystemExit) as exit_info:
            evaluate.main(evaluate.Args(run_dir=str(run), episodes=1, out=str(tmp_path / "x.csv")))
    finally:
        moved.rename(script)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert f"was trained by {script}, which is not there" in err[0]


def test_a_copy_without_a_name_the_tools_use_is_refused_with_one_line_naming_it(copied_run, tmp_path, capsys):
    """The copy with make_evaluate renamed (everywhere in it, so that it still trains): tools.evaluate,
    tools.analyze and tools.video each stop with one line naming what is missing and where it is described."""
    from tools import analyze, evaluate, video

    script, run = copied_run
    broken = tmp_path / "my_msfa_renamed.py"
    broken.write_text(script.read_text().replace("make_evaluate", "make_evaluation"))
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for path in copy.glob("params_seed*.eqx"):  # the run trained by the renamed copy
        header, body = path.read_bytes().split(b"\n", 1)
        path.write_bytes(json.dumps(json.loads(header) | {"script": str(broken)}).encode() + b"\n" + body)
    tools = [lambda: evaluate.main(evaluate.Args(run_dir=str(copy), episodes=1, out=str(tmp_path / "x.csv"))),
             lambda: analyze.main(analyze.Args(run_dirs=(str(copy),), out=str(tmp_path / "a"), episodes=1)),
             lambda: video.main(video.Args(run_dir=str(copy), task="1,0,0,0", max_steps=2,
                                           out=str(tmp_path / "v.gif")))]
    for tool in tools:
        with pytest.raises(SystemExit) as exit_info:
            tool()
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1, err
        assert f"{broken} lacks make_evaluate" in err[0] and "docs/contract.md" in err[0], err[0]


# the inter-module attention of a copied common/farm.py, edited: no attention, every module reads the mean value
FARM_EDIT = ("""        queries = by_head(jax.vmap(self.query)(q))  # [n, heads, d]
        keys, values = by_head(jax.vmap(self.key)(memory)), by_head(jax.vmap(self.value)(memory))  # [n + 1, ...]
        attention = jax.nn.softmax(jnp.einsum("kid,jid->kij", queries, keys) / math.sqrt(d), axis=-1)
        m = jnp.einsum("kij,jid->kid", attention, values).reshape(n, heads * d)
""", """        m = jnp.broadcast_to(jnp.mean(jax.vmap(self.value)(h), axis=0), (n, heads * d))  # edited: mean sharing
""")


@pytest.fixture(scope="module")
def copied_farm_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("farm_copy")
    farm = (ROOT / "common" / "farm.py").read_text()
    assert farm.count(FARM_EDIT[0]) == 1
    (tmp / "my_farm.py").write_text(farm.replace(*FARM_EDIT))
    script = (ROOT / "msfa_babyai.py").read_text()
    old = "from common.farm import FarmCore\n"
    assert script.count(old) == 1
    (tmp / "msfa_meanshare.py").write_text(script.replace(old, "from my_farm import FarmCore\n"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(tmp / "msfa_meanshare.py"), *FLAGS], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    refused = subprocess.run([sys.executable, str(tmp / "msfa_meanshare.py"), *FLAGS, "--core-backend", "fused",
                              "--run-dir", str(tmp / "refused")], cwd=tmp, env=env, capture_output=True, text=True,
                             timeout=300)
    return tmp / "msfa_meanshare.py", tmp / "runs" / "msfa_meanshare__1", refused


def test_a_copy_with_another_inter_module_attention_trains_plain_and_is_evaluated(copied_farm_run, tmp_path):
    import jax
    import numpy as np

    from common.run.scripts import load_script
    from helpers import replayed_evaluation

    script_path, run, refused = copied_farm_run
    copy = load_script(str(script_path))
    args = copy.Args(num_modules=2, module_size=16, attention_heads=1, psi_hidden=(8,), phi_hidden=(8,))
    net = copy.make_network(args, jax.random.PRNGKey(0))
    assert net.core.backend == "plain" and type(net.core.farm).__module__ == "my_farm"
    import msfa_babyai
    original = msfa_babyai.make_network(args, jax.random.PRNGKey(0))  # the same parameters, the repository's FARM
    state = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(2), x.shape),
                         original.core.initial_state())
    image_map = jax.random.normal(jax.random.PRNGKey(1), (5, 5, 16))
    vector = jax.numpy.ones(5)
    assert not np.allclose(net.core.recur(image_map, vector, state)[0],
                           original.core.recur(image_map, vector, state)[0])
    again, ran = replayed_evaluation(run, 128, tmp_path)
    assert again == ran and len(ran) > 0
    err = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(err) == 1, err
    assert "--core-backend fused computes common/farm.py's FARM, and this FARM (my_farm) differs" in err[0]


# a core that is not FARM: the copy's network holds tests/fixtures/mean_share_core.py's MeanShareCore instead
CORE_EDITS = [
    ("from common.farm import FarmCore\n", "from common.farm import FarmCore\nfrom mean_share_core import MeanShareCore\n"),
    ("    core: FarmCore  # the module states s^k = h^k", "    core: MeanShareCore  # the module states s^k = h^k"),
    ("""        self.core = FarmCore(NUM_ACTIONS, n, d, args.attention_heads, args.projection_dim, k_core,
                             backend=args.core_backend, torso_channels=args.torso_channels,
                             reward_input=args.reward_input == "on")""",
     """        self.core = MeanShareCore(NUM_ACTIONS, n, d, k_core, torso_channels=args.torso_channels,
                                  reward_input=args.reward_input == "on")"""),
    ("    FarmCore.backend_to_run(args.core_backend)  # one of BACKENDS, and a fast one only for common/farm.py's FARM\n",
     ""),
]


@pytest.fixture(scope="module")
def copied_core_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("core_copy")
    shutil.copy(ROOT / "tests" / "fixtures" / "mean_share_core.py", tmp)
    source = (ROOT / "msfa_babyai.py").read_text()
    for old, new in CORE_EDITS:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    (tmp / "msfa_meancore.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(tmp / "msfa_meancore.py"), *FLAGS], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "msfa_meancore.py", tmp / "runs" / "msfa_meancore__1"


def test_a_copy_whose_core_is_not_farm_trains_and_works_with_the_tools(copied_core_run, tmp_path, capsys):
    import jax

    from common.farm import FarmCore
    from common.run.scripts import load_script
    from helpers import replayed_evaluation
    from tools import analyze, summarize, video

    script_path, run = copied_core_run
    copy = load_script(str(script_path))
    net = copy.make_network(copy.Args(num_modules=2, module_size=16), jax.random.PRNGKey(0))
    assert type(net.core).__name__ == "MeanShareCore" and not isinstance(net.core, FarmCore)
    again, ran = replayed_evaluation(run, 128, tmp_path)  # tools.evaluate replays the run's own evaluation
    assert again == ran and len(ran) > 0
    summarize.main(summarize.Args(run_dir=str(run), episodes=0))
    analyze.main(analyze.Args(run_dirs=(str(run),), out=str(tmp_path / "analysis"), episodes=2))
    assert (tmp_path / "analysis" / "analysis.md").exists()
    video.main(video.Args(run_dir=str(run), task="1,0,0,0", max_steps=3, out=str(tmp_path / "core.gif")))
    out = capsys.readouterr().out
    assert "| msfa_meancore |" in out and "3 frames" in out
