"""The trainer: configuration and its errors, data order, EMA, gradient accumulation, the NaN guard, checkpoints
and exact resume after SIGKILL (the CLI in a subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dit_core import load_dit
from dit_core.checkpoint import CheckpointError
from dit_core.train import ConfigError, TrainingDiverged, make_config, train
from dit_core.train.batches import DataOrder, MicroBatches, micro_slice, step_draws
from dit_core.cli.train import main, parse_args
from dit_core.train.config import profiles
from dit_core.train.ema import ema_decay_at, update_ema
from dit_core.train.loop import learning_rate

REPO = Path(__file__).resolve().parents[1]

# A tiny DiT and run: a few ms per step on one core.
TINY = dict(model="DiT-S/2", depth=2, hidden_size=32, num_heads=2, image_size=8, channels=1, flip=False,
            batch_size=8, num_workers=0, tensorboard=False, progress=False, sample_at_end=False, log_every=1000,
            lr=1e-3, ema_decay=0.9, diffusion_steps=100, mixed_precision="fp32")
TINY_ARGS = [a for k, v in TINY.items() for a in (f"--{k.replace('_', '-')}", str(v))]


class Blobs(torch.utils.data.Dataset):
    """A deterministic in-memory dataset: ``n`` random 1x8x8 images in 3 classes; NaN at ``nan_at``."""

    num_classes = 3
    sample_shape = (1, 8, 8)
    flip = False

    def __init__(self, n=32, nan_at=()):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 1, 8, 8, generator=g).clamp(-1, 1)
        self.x[list(nan_at)] = float("nan")
        self.y = torch.arange(n) % 3

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def tiny_config(out, **kw):
    return make_config(None, {**TINY, "out": str(out), **kw})


def child_env():
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    from dit_core.data import export_digits

    return export_digits(tmp_path_factory.mktemp("data") / "digits")


# ----------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------


def test_official_and_tutorial_spellings_are_aliases():
    # the official train.py's flags, and the spellings of the single-GPU tutorials (flags and YAML keys)
    profile, over = parse_args([
        "--config", "digits", "--global-batch-size=64", "--results-dir", "runs/x", "--global-seed", "3",
        "--ckpt-every", "50", "--data-path", "/data", "--gradient_accumulation_steps", "4", "--use_checkpoint",
        "--mixed_precision", "fp16", "--data_path", "/data2", "--sample_every", "100",
    ])
    assert profile == "digits"
    assert over == {"batch_size": "64", "out": "runs/x", "seed": "3", "ckpt_every": "50", "data_path": "/data2",
                    "grad_accum": "4", "grad_checkpointing": "true", "mixed_precision": "fp16", "sample_every": "100"}
    cfg = make_config(profile, over)
    assert (cfg.grad_accum, cfg.grad_checkpointing, cfg.mixed_precision, cfg.batch_size, cfg.seed) == (4, True, "fp16", 64, 3)
    yaml_keys = make_config(None, {"base_lr": "2e-4", "gradient_accumulation": 8, "ema_rate": 0.999, "batch_size": 32})
    assert (yaml_keys.lr, yaml_keys.grad_accum, yaml_keys.ema_decay) == (2e-4, 8, 0.999)
    # hyphens and underscores alike; values are read by the fields' types
    assert make_config(None, {"--data-path": "a"}).data_path == make_config(None, {"data_path": "a"}).data_path == "a"
    assert make_config(None, {"grad_checkpointing": "3", "resume": "auto"}).grad_checkpointing == 3
    assert make_config(None, {"adam_betas": "0.9,0.95", "sample_classes": "[1, 2]"}).adam_betas == [0.9, 0.95]
    assert make_config(None, {"adam_betas": [0.9, 0.95]}).adam_betas == [0.9, 0.95]  # a YAML list
    assert make_config(None, {"vae": "none", "class_cond": "no"}).vae is None


@pytest.mark.parametrize("typo, suggestion", [("--batchsize", "--batch-size"), ("--max_step", "--max-steps"),
                                              ("--ema-decy", "--ema-decay"),
                                              ("--gradient-accumulation-step", "--gradient-accumulation-steps"),
                                              ("--ema", "--ema-decay")])
def test_unknown_key_suggests_the_nearest(typo, suggestion, capsys):
    with pytest.raises(ConfigError, match=f"unknown config key .*did you mean.*{suggestion}"):
        parse_args([typo, "1"])
    assert main([typo, "1"]) == 2
    assert suggestion in capsys.readouterr().err


def test_bad_values_and_replaced_flags_are_explained():
    with pytest.raises(ConfigError, match="max_steps.*int"):
        make_config(None, {"max_steps": "many"})
    with pytest.raises(ConfigError, match="mixed_precision must be one of auto, bf16, fp16, fp32"):
        make_config(None, {"mixed_precision": "fp8"})
    with pytest.raises(ConfigError, match="lr_schedule must be one of constant, cosine"):
        make_config(None, {"lr_schedule": "linear"})
    with pytest.raises(ConfigError, match="--max-steps"):
        make_config(None, {"epochs": "10"})
    with pytest.raises(ConfigError, match="one process unless torchrun"):
        parse_args(["--single_gpu"])
    with pytest.raises(ConfigError, match="not divisible by grad_accum"):
        make_config(None, {"batch_size": 10, "grad_accum": 4})
    with pytest.raises(ConfigError, match="unknown profile 'digit'.*digits"):
        make_config("digit")
    with pytest.raises(ConfigError, match="threads must be >= 0"):
        make_config(None, {"threads": -1})


def test_threads_apply_to_the_run_and_the_callers_setting_comes_back(tmp_path):
    """``threads`` sets torch's CPU threads for the run only (a notebook's later cells keep their own)."""
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    summary = train(tiny_config(tmp_path / "t", max_steps=2, threads=other), dataset=LeftRight())
    assert summary["threads"] == other and torch.get_num_threads() == before
    assert train(tiny_config(tmp_path / "u", max_steps=2), dataset=LeftRight())["threads"] == before


def test_every_profile_loads_and_gpu_profiles_follow_the_paper():
    names = profiles()
    assert {"digits", "rtx3060-12gb", "rtx3090-24gb", "a100-40gb", "a100-80gb", "h100-80gb"} <= set(names)
    cards = ("rtx", "a100", "h100")  # the paper's recipe per card; other profiles (digits, small images) are not
    for name in names:
        cfg = make_config(name)
        if name.startswith(cards) or name.startswith("imagenette-"):
            model = "DiT-B/2" if name.startswith("imagenette-") else "DiT-XL/2"  # the GPU track's chapter-sized runs
            assert cfg.model == model and cfg.batch_size == 256 and cfg.image_size == 256, name
            assert cfg.lr == 1e-4 and cfg.weight_decay == 0 and cfg.ema_decay == 0.9999, name
            assert cfg.latents_path is not None and cfg.batch_size % cfg.grad_accum == 0, name


def test_wrong_data_path_is_a_clear_error(tmp_path, capsys):
    code = main(["--data-path", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"), *TINY_ARGS])
    err = capsys.readouterr().err
    assert code == 2 and "training data not found" in err and "nowhere" in err and "--data-path" in err
    assert main(["--out", str(tmp_path / "run2"), *TINY_ARGS]) == 2
    assert "no training data" in capsys.readouterr().err


def test_a_run_folders_config_yaml_resumes_that_run(tmp_path, digits_dir):
    """`dit-train --config RUN/config.yaml --resume true`: the facts the run recorded are not settings."""
    out = tmp_path / "run"
    assert main(["--data-path", str(digits_dir), "--out", str(out), *TINY_ARGS, "--max-steps", "3"]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["run"]["world_size"] == 1 and saved["run"]["num_classes"] == 10 and saved["max_steps"] == 3
    assert main(["--config", str(out / "config.yaml"), "--resume", "true", "--max-steps", "5"]) == 0
    assert final_state(out)["step"] == 5
    # paths may be pathlib objects in Python
    assert make_config("digits", {"out": out, "data_path": digits_dir}).out == str(out)


# ----------------------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------------------


def test_data_order_is_a_permutation_per_epoch_and_slices_partition_the_batch():
    order = DataOrder(10, seed=3)
    first, second = order.indices(0, 10), order.indices(10, 10)
    assert sorted(first) == sorted(second) == list(range(10)) and first != second
    assert order.indices(7, 6) == first[7:] + second[:3]  # batches run across epoch boundaries
    slots = [list(range(12))[micro_slice(12, 3, 2, r, a)] for a in range(3) for r in range(2)]
    assert sorted(sum(slots, [])) == list(range(12)) and all(len(s) == 2 for s in slots)
    # the same step gives the same numbers; another step others
    a, b = step_draws(0, 5, 4, (1, 2, 2), 1000, 0.5), step_draws(0, 5, 4, (1, 2, 2), 1000, 0.5)
    assert torch.equal(a.noise, b.noise) and torch.equal(a.t, b.t) and torch.equal(a.drop, b.drop)
    assert not torch.equal(a.noise, step_draws(0, 6, 4, (1, 2, 2), 1000, 0.5).noise)
    # a sampler started at step 2 continues the stream of one started at 0
    full = list(MicroBatches(order, 0, 4, 1, 1, 0, start_step=0, end_step=4, samples_seen=0))
    resumed = list(MicroBatches(order, 0, 4, 1, 1, 0, start_step=2, end_step=4, samples_seen=8))
    assert resumed == full[2:]


def test_ema_update_and_warmup():
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in a.parameters()]
    update_ema(a, b, 0.9)
    for p, p0, q in zip(a.parameters(), before, b.parameters()):
        torch.testing.assert_close(p, 0.9 * p0 + 0.1 * q)
    assert ema_decay_at(0, 0.999, True) == pytest.approx(0.1) and ema_decay_at(10**6, 0.999, True) == 0.999
    assert ema_decay_at(0, 0.999, False) == 0.999


def test_learning_rate_schedule():
    cfg = make_config(None, {"lr": 1e-3, "warmup_steps": 10, "lr_schedule": "cosine", "min_lr": 1e-4, "max_steps": 110})
    assert learning_rate(0, cfg) == pytest.approx(1e-4) and learning_rate(9, cfg) == pytest.approx(1e-3)
    assert learning_rate(60, cfg) == pytest.approx(5.5e-4) and learning_rate(110, cfg) == pytest.approx(1e-4)
    assert learning_rate(5000, make_config(None, {})) == 1e-4  # the official constant rate


# ----------------------------------------------------------------------------------------------------------
# Training in-process
# ----------------------------------------------------------------------------------------------------------


def final_state(out):
    return torch.load(Path(out) / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)


def whole_and_resumed(tmp_path, steps=6, stop=3, **kw):
    """The final checkpoints of a ``steps``-step run and of the same run stopped after ``stop`` and resumed."""
    train(tiny_config(tmp_path / "ref", max_steps=steps, **kw), dataset=Blobs())
    train(tiny_config(tmp_path / "split", max_steps=stop, **kw), dataset=Blobs())
    train(tiny_config(tmp_path / "split", max_steps=steps, resume="true", **kw), dataset=Blobs())
    return final_state(tmp_path / "ref"), final_state(tmp_path / "split")


#: What may differ between two runs of the same (config, seed, step): where they run, whether they resumed,
#: and the wall time they took.
RUN_SPECIFIC = {("config", "out"), ("config", "resume"), ("metrics", "train_seconds")}


def assert_same_checkpoint(a, b, path=()):
    """Every tensor, array and value of two checkpoints equal, recursively (RUN_SPECIFIC entries excepted)."""
    if path in RUN_SPECIFIC:
        return
    where = ".".join(map(str, path)) or "checkpoint"
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for key in a:
            assert_same_checkpoint(a[key], b[key], path + (key,))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_checkpoint(x, y, path + (i,))
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def test_accumulation_gives_the_update_of_the_large_batch(tmp_path):
    runs = {}
    for accum in (1, 2, 4):
        train(tiny_config(tmp_path / f"a{accum}", grad_accum=accum, max_steps=3, grad_clip=1.0), dataset=Blobs())
        runs[accum] = final_state(tmp_path / f"a{accum}")
    for accum in (2, 4):
        for key in ("model", "ema"):
            for name, ref in runs[1][key].items():
                torch.testing.assert_close(runs[accum][key][name], ref, rtol=0, atol=2e-6, msg=f"{key}.{name}")
    assert runs[1]["step"] == 3 and runs[1]["data"]["samples_seen"] == 24
    # and the updates are real: the weights moved away from their initialisation
    assert not torch.equal(runs[1]["model"]["final_layer.linear.weight"], torch.zeros_like(runs[1]["model"]["final_layer.linear.weight"]))


class LeftRight(torch.utils.data.Dataset):
    """Two classes a model can only tell apart through its label: class 0 is dark, class 1 dark on the left
    and bright on the right."""

    num_classes = 2
    sample_shape = (1, 8, 8)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.full((1, 8, 8), -1.0)
        x[..., 4:] = 1.0 if i % 2 else -1.0
        return x, i % 2


def test_the_trainer_learns_class_conditioning(tmp_path):
    from dit_core.diffusion import create_diffusion
    from dit_core.sample import generate

    train(tiny_config(tmp_path / "lr", hidden_size=64, batch_size=32, max_steps=150, lr=3e-3,
                      diffusion_steps=1000), dataset=LeftRight())
    model = load_dit(tmp_path / "lr" / "checkpoints" / "last.pt")
    labels = torch.tensor([0, 1] * 16)
    images = generate(model, create_diffusion(""), labels, sampler="ddim", steps=20, cfg_scale=3.0)
    right_half_bright = (images[:, 0, :, 4:].mean(dim=(1, 2)) > 0).long()
    assert (right_half_bright == labels).float().mean() >= 0.9


@pytest.mark.parametrize("fused", ["true", "false"], ids=["verdict-on-device", "verdict-read-each-step"])
def test_nan_guard_skips_the_bad_step_and_keeps_weights_finite(tmp_path, capsys, fused):
    # 32 images, batch 8: image 5 lies in exactly one batch of every epoch (steps 3 and 5 here)
    summary = train(tiny_config(tmp_path / "nan", max_steps=8, fused_adam=fused), dataset=Blobs(nan_at=[5]))
    out = capsys.readouterr().out
    assert summary["skipped_steps"] == 2  # two epochs of 4 steps, one bad batch each
    reason = "loss is nan; the input batch itself holds NaN/Inf values"
    if fused == "true":  # fused AdamW skips on the device; the loop reads the guard when it logs (here: the end)
        assert f"steps 3 to 5: 2 skipped, the last (step 5) because {reason}; weights unchanged" in out
    else:  # the optimizer cannot skip by itself: the verdict is read at every step
        assert f"step 3: skipped ({reason}); weights unchanged" in out
        assert f"step 5: skipped ({reason}); weights unchanged" in out
    state = final_state(tmp_path / "nan")
    assert state["ema_updates"] == 6  # the two skipped steps did not update the EMA
    for key in ("model", "ema"):
        assert all(torch.isfinite(v).all() for v in state[key].values())
    assert all(torch.isfinite(v).all() for s in state["opt"]["state"].values() for v in s.values())
    assert all(int(s["step"]) == 6 for s in state["opt"]["state"].values())  # AdamW counted 6 updates


@pytest.mark.parametrize("fused", [True, False], ids=["verdict-on-device", "verdict-read-each-step"])
def test_a_skipped_step_changes_no_weight_moment_or_ema(fused):
    """The step itself: after a bad batch, model, EMA, AdamW's moments and step counts are bit for bit as before."""
    from dit_core.diffusion import create_diffusion
    from dit_core.models import DiT
    from dit_core.train.ema import create_ema
    from dit_core.train.step import StepOptions, TrainStep

    torch.manual_seed(0)
    model = DiT(input_size=8, patch_size=2, in_channels=1, hidden_size=32, depth=2, num_heads=2, num_classes=3).eval()
    ema = create_ema(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=fused or None)
    step = TrainStep(model, create_diffusion(""), opt, ema, StepOptions(ema_decay=0.9), batch_size=4)
    assert step.skips_on_device is fused
    good = (torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 0]))
    bad = (torch.full((4, 1, 8, 8), float("nan")), good[1])
    step(0, iter([good]))
    snapshot = lambda: ([t.clone() for t in model.state_dict().values()], [t.clone() for t in ema.state_dict().values()],
                        [v.clone() for s in opt.state.values() for v in s.values()])
    before = snapshot()
    step(1, iter([bad]))
    after = snapshot()
    for a, b in zip(before, after):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert step.ema_updates == 1
    step.guard.read()
    assert step.guard.skipped == 1 and not step.guard.last_ok
    step(2, iter([good]))  # and training goes on
    assert step.ema_updates == 2 and not torch.equal(model.state_dict()["final_layer.linear.weight"], before[0][-2])


def test_nan_guard_stops_with_a_diagnosis_after_repeated_failures(tmp_path):
    with pytest.raises(TrainingDiverged, match=r"(?s)3 steps in a row.*steps 1, 2, 3.*the data.*--lr"):
        train(tiny_config(tmp_path / "div", max_steps=20, max_bad_steps=3), dataset=Blobs(nan_at=range(32)))


def test_checkpoint_loads_with_load_dit_and_resume_refuses_another_size(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(out, max_steps=2), dataset=Blobs())
    state = final_state(out)
    ema = load_dit(out / "checkpoints" / "last.pt")
    assert ema.config()["hidden_size"] == 32 and ema.num_heads == 2 and ema.num_classes == 3
    for name, value in ema.state_dict().items():
        assert torch.equal(value, state["ema"][name]), name
    assert (out / "config.yaml").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 1
    # a fresh run may not overwrite it, a run of another size may not resume it
    with pytest.raises(ConfigError, match="already holds a run.*--resume true"):
        train(tiny_config(out, max_steps=4), dataset=Blobs())
    with pytest.raises(CheckpointError, match=r"hidden_size: checkpoint 32 vs this run 64.*shape mismatches.*\(64"):
        train(tiny_config(out, max_steps=4, hidden_size=64, resume="true"), dataset=Blobs())
    # resuming with the same settings continues from step 2
    summary = train(tiny_config(out, max_steps=4, resume="true"), dataset=Blobs())
    assert summary["steps"] == 4 and summary["steps_this_run"] == 2


def test_fp16_with_gradient_scaler_and_the_debug_mode(tmp_path, digits_dir):
    summary = train(tiny_config(tmp_path / "fp16", max_steps=3, mixed_precision="fp16"), dataset=Blobs())
    state = final_state(tmp_path / "fp16")
    assert summary["precision"] == "fp16" and state["scaler"]["scale"] > 0
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    # --debug: 5 steps of the configured micro-batch on a small subset, whatever the profile asks for
    cfg = make_config("digits", {"data_path": str(digits_dir), "out": str(tmp_path / "debug"), "debug": "true",
                                 "depth": 2, "hidden_size": 32, "num_heads": 2, "progress": False,
                                 "tensorboard": False, "batch_size": 64, "grad_accum": 4})
    summary = train(cfg)
    state = final_state(tmp_path / "debug")
    assert summary["steps"] == 5 and state["data"]["dataset_size"] == 64 and state["config"]["batch_size"] == 16
    assert Path(summary["samples"]).exists()


def test_unconditional_training_and_sample_grid(tmp_path):
    out = tmp_path / "uncond"
    summary = train(tiny_config(out, max_steps=2, class_cond=False, sample_at_end=True, sample_steps=5),
                    dataset=Blobs())
    model = load_dit(out / "checkpoints" / "last.pt")
    assert model.num_classes == 0 and model.y_embedder is None
    assert Path(summary["samples"]).exists()


# ----------------------------------------------------------------------------------------------------------
# The CLI in a subprocess: exact resume after SIGKILL
# ----------------------------------------------------------------------------------------------------------


def run_cli(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "dit_core.train", *args], env=child_env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def kill_after_first_checkpoint(proc, last, timeout=240) -> int:
    """SIGKILL a training process as soon as its first checkpoint exists; return the checkpoint's step."""
    deadline = time.time() + timeout
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stdout.read()
    return torch.load(last, map_location="cpu", weights_only=True)["step"]


def test_resume_after_sigkill_is_bit_exact(tmp_path, digits_dir):
    common = ["--data-path", str(digits_dir), *TINY_ARGS, "--hidden-size", "64", "--batch-size", "32",
              "--max-steps", "60", "--ckpt-every", "10", "--mixed-precision", "bf16", "--log-every", "5"]
    reference = run_cli([*common, "--out", str(tmp_path / "ref")])
    killed = run_cli([*common, "--out", str(tmp_path / "killed")])
    last = tmp_path / "killed" / "checkpoints" / "last.pt"
    at_kill = kill_after_first_checkpoint(killed, last)
    assert 10 <= at_kill < 60 and not (tmp_path / "killed" / "summary.json").exists()

    resumed = run_cli([*common, "--out", str(tmp_path / "killed"), "--resume", "true"])
    out_resumed, _ = resumed.communicate(timeout=240)
    out_ref, _ = reference.communicate(timeout=240)
    assert resumed.returncode == 0, out_resumed
    assert reference.returncode == 0, out_ref
    ref, res = final_state(tmp_path / "ref"), final_state(tmp_path / "killed")
    assert res["step"] == ref["step"] == 60 and res["data"] == ref["data"]
    # the whole checkpoint: weights, EMA, optimizer, the generator states of torch, numpy and Python, metrics
    assert_same_checkpoint(ref, res)
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["resumed_from"].endswith("last.pt") and summary["steps_this_run"] == 60 - at_kill
    # the metric records of the interrupted run after its checkpoint were replaced, not duplicated
    records = lambda run: [(r["step"], r["loss"]) for r in map(json.loads, (tmp_path / run / "metrics.jsonl").open())]
    assert records("killed") == records("ref") and [s for s, _ in records("ref")] == list(range(5, 61, 5))


def test_an_image_folder_with_flips_is_preloaded_and_flipped_as_the_loader_does(tmp_path):
    from dit_core.data import ImageFolderDataset
    from dit_core.data.shapes import generate_shapes
    from dit_core.train.batches import SeededItems
    from dit_core.train.batches import flipped_batch, flips_only, item_flips, preload, unflipped

    folder = generate_shapes(tmp_path / "shapes", per_class=4)
    ds = ImageFolderDataset(folder, 8, flip=True)
    assert flips_only(ds) and not flips_only(ImageFolderDataset(folder, 8, flip=False))
    x_all, y_all = preload(unflipped(torch.utils.data.Subset(ds, range(12))), torch.device("cpu"))
    assert ds.flip  # the caller's dataset keeps its flips
    items = [(i, 7 * i + 3) for i in range(12)] + [(i, 5 * i + 1) for i in range(12)]
    assert 0 < int(item_flips([s for _, s in items]).sum()) < len(items)
    loader = SeededItems(ds)
    x, y = flipped_batch(x_all, y_all, items)
    assert torch.equal(x, torch.stack([loader[it][0] for it in items])) and y.tolist() == [loader[it][1] for it in items]
    # the whole run: in memory (auto) and through the data loader (false) train the same weights
    args = [*TINY_ARGS, "--channels", "3", "--flip", "true", "--max-steps", "3", "--data-path", str(folder)]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b"), "--preload", "false"]) == 0
    a, b = (torch.load(tmp_path / r / "checkpoints" / "last.pt", weights_only=True)["model"] for r in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_small_images_profile_takes_the_folders_classes_and_size(tmp_path, capsys):
    """`dit-train --config small-images --data-path FOLDER`: classes from the folder names, any count; a grey
    folder is named by the pre-flight check, and --channels / --image-size fit the model to it."""
    from dit_core.data.shapes import generate_shapes

    cfg = make_config("small-images")
    assert (cfg.image_size, cfg.channels, cfg.flip, cfg.crop, cfg.data_path, cfg.objective) == \
        (16, 3, "auto", "object", None, "flow")
    folder = generate_shapes(tmp_path / "grey", per_class=3, classes=("star", "cross"), mode="L")
    small = ["--depth", "1", "--repa-depth", "1", "--hidden-size", "32", "--num-heads", "2", "--tensorboard", "false",
             "--progress", "false", "--debug", "true"]
    if not hasattr(torch.optim, "Muon"):  # the profile's muon needs torch 2.9; this test is about the data
        small += ["--optimizer", "adamw"]
    assert main(["--config", "small-images", "--data-path", str(folder), "--out", str(tmp_path / "a"), *small]) == 0
    out = capsys.readouterr().out
    run = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())["run"]
    assert run["classes"] == ["cross", "star"] and run["num_classes"] == 2 and run["sample_shape"] == [3, 16, 16]
    assert "pre-flight warning [channels]" in out and "fix: --channels 1." in out
    assert main(["--config", "small-images", "--data-path", str(folder), "--out", str(tmp_path / "b"), *small,
                 "--channels", "1", "--image-size", "48"]) == 0
    assert "[channels]" not in capsys.readouterr().out
    run = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())["run"]
    assert run["sample_shape"] == [1, 48, 48]
    model = load_dit(tmp_path / "b" / "checkpoints" / "last.pt")
    assert (model.in_channels, model.input_size, model.num_classes) == (1, 48, 2)


def test_compile_auto_compiles_long_cpu_runs_only_where_a_compiler_is(monkeypatch, capsys):
    """``compile``: true and false are obeyed; auto compiles a CPU run of 1,000+ steps when a C++ compiler is
    found, says why not when none is, and leaves short runs (the book's 300 steps) and GPUs eager."""
    from dit_core.train import loop

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert loop.should_compile(make_config(None, {"compile": True, "max_steps": 5}), cpu) is True
    assert loop.should_compile(make_config(None, {"compile": "false", "max_steps": 10**6}), cpu) is False
    assert make_config("small-images").compile == "auto"
    monkeypatch.setattr(loop, "compiler_missing", lambda device: None)
    long_run = make_config("small-images")  # a time budget: max_steps is only a cap
    assert loop.should_compile(long_run, cpu) is True
    assert "compiling the training step" in capsys.readouterr().out
    assert loop.should_compile(make_config("small-images", {"max_steps": loop.COMPILE_MIN_STEPS - 1}), cpu) is False
    assert loop.should_compile(long_run, gpu) is False
    monkeypatch.setattr(loop, "compiler_missing", lambda device: "no C++ compiler was found")
    assert loop.should_compile(long_run, cpu) is False
    assert "compile auto: off (no C++ compiler was found)" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="compile must be one of auto, true, false"):
        make_config(None, {"compile": "sometimes"})


def test_a_model_name_sets_the_size_and_size_keys_beside_it_are_reported(tmp_path, capsys):
    """``--model DiT-B/2`` on a profile that sizes its own model trains DiT-B/2's size, not the profile's; size keys
    given beside a name override it, the trainer says so, and the run's config.yaml records what was trained."""
    assert make_config("small-images").depth == 4  # the profile alone: its own 4-block model
    named = make_config("small-images", {"model": "DiT-B/2"})
    assert (named.model, named.depth, named.hidden_size, named.num_heads) == ("DiT-B/2", None, None, None)
    assert make_config("small-images", {"model": "DiT-B/2", "depth": 2}).depth == 2
    _, overrides = parse_args(["--config", "small-images", "--model", "DiT-S/4"])
    assert make_config("small-images", overrides).hidden_size is None
    out = tmp_path / "run"
    train(tiny_config(out, max_steps=1), dataset=Blobs())
    said = capsys.readouterr().out
    assert f"model: DiT-S/2 with depth {TINY['depth']}, hidden_size {TINY['hidden_size']}" in said
    assert "overriding its size" in said
    run = yaml.safe_load((out / "config.yaml").read_text())
    assert run["model"] == "DiT-S/2" and run["depth"] == TINY["depth"]
    assert run["run"]["architecture"]["depth"] == TINY["depth"]
    assert run["run"]["architecture"]["hidden_size"] == TINY["hidden_size"]
