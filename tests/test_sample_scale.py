"""Sampling at FID scale: the caller's model left alone, labels, shards that resume bit-identically, processes
that split the work, a full disk, the official mode, and models without a null class."""

from __future__ import annotations

import errno
import json
import threading
import zipfile

import numpy as np
import pytest
import torch

from dit_core.diffusion import create_diffusion
from dit_core.models import DiT
from dit_core.sample import files, generate, has_null_class, load_model, sampling_copy, to_uint8
from dit_core.sample import samplers, shards
from dit_core.sample.shards import SampleRunError, assigned_shards, make_labels, sample_to_npz, shard_folder


def tiny_dit(in_channels=1, num_classes=10, seed=0, class_dropout_prob=0.1):
    torch.manual_seed(seed)
    model = DiT(input_size=8, patch_size=2, in_channels=in_channels, hidden_size=32, depth=2, num_heads=2,
                num_classes=num_classes, class_dropout_prob=class_dropout_prob)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.05)
    return model.eval()


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_untouched(model, before, modes, device="cpu", dtype=torch.float32):
    after = model.state_dict()
    assert set(after) == set(before)
    for k, v in after.items():
        assert v.device == torch.device(device) and torch.equal(v, before[k]), k
    assert [m.training for m in model.modules()] == modes
    assert all(p.dtype == dtype for p in model.parameters())


# ----------------------------------------------------------------------------------------------------------
# generate() leaves the caller's model as it was
# ----------------------------------------------------------------------------------------------------------


def test_generate_restores_train_mode_and_changes_no_weight():
    model = tiny_dit()
    model.train()
    model.blocks[1].eval()  # a mixed state, to check every module gets its own mode back
    modes, before = [m.training for m in model.modules()], snapshot(model)
    out = generate(model, None, [1, 2, 3], sampler="ddim", steps=3, cfg_scale=2.0, seed=0)
    assert_untouched(model, before, modes)
    # sampled in eval mode: the same images as the model in eval mode (train mode would drop labels at random)
    ref = generate(tiny_dit(), None, [1, 2, 3], sampler="ddim", steps=3, cfg_scale=2.0, seed=0)
    assert torch.equal(out, ref)


def test_sampling_copy_never_touches_the_original():
    model = tiny_dit()
    before, modes = snapshot(model), [m.training for m in model.modules()]
    clone = sampling_copy(model, "meta", torch.bfloat16)  # the meta device stands in for a GPU here
    assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in clone.parameters())
    assert not any(p.requires_grad for p in clone.parameters()) and not clone.training
    assert {id(p) for p in clone.parameters()}.isdisjoint(id(p) for p in model.parameters())
    assert_untouched(model, before, modes)
    same = sampling_copy(model, "cpu")
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), model.state_dict().values()))


def test_a_model_on_another_device_is_sampled_through_a_temporary_copy(monkeypatch):
    """generate() on a device other than the model's. A CPU machine has one real device, so the model is made to
    look like it lives elsewhere: generate must then copy it (sampling_copy) and sample the copy, and leave the
    model itself (its tensors, modes and dtype) as it was. The CUDA test does this with a real GPU."""
    model = tiny_dit()
    model.train()
    before, modes = snapshot(model), [m.training for m in model.modules()]
    ref = generate(tiny_dit(), None, [4, 5], sampler="ddim", steps=3, cfg_scale=1.5, seed=3)
    copies = []
    real_copy = samplers.sampling_copy

    def spy(m, device, dtype=None):
        copies.append((m is model, torch.device(device), dtype))
        return real_copy(m, device, dtype)

    monkeypatch.setattr(samplers, "model_device", lambda m: torch.device("meta"))
    monkeypatch.setattr(samplers, "sampling_copy", spy)
    out = generate(model, None, [4, 5], sampler="ddim", steps=3, cfg_scale=1.5, seed=3, device="cpu")
    assert copies == [(True, torch.device("cpu"), None)]
    assert torch.equal(out, ref)
    generate(model, None, [4], sampler="ddim", steps=2, seed=0, device="cpu", amp="bf16")
    assert copies[-1][2] == torch.bfloat16  # the copy is made in the autocast precision
    assert_untouched(model, before, modes)


def test_trainer_grid_leaves_a_cpu_ema_on_the_cpu_and_unchanged(tmp_path, monkeypatch):
    from dit_core.train import make_config
    from dit_core.train.ema import create_ema
    from dit_core.train.grids import sample_grid

    cfg = make_config(None, dict(out=str(tmp_path), sample_steps=3, sample_per_class=2, sample_classes=[0, 1, 2],
                                 mixed_precision="fp32", ema_device="cpu"))
    ema = create_ema(tiny_dit(), device="cpu")
    before, modes = snapshot(ema), [m.training for m in ema.modules()]
    diffusion = create_diffusion("")
    path = sample_grid(ema, diffusion, cfg, tmp_path, 7, [str(i) for i in range(10)], False, None, torch.device("cpu"))
    assert path.is_file()
    assert_untouched(ema, before, modes)
    # The training device is another one than the EMA's (a GPU; here the EMA pretends to live elsewhere): the
    # grid samples a temporary copy in the training precision, and the EMA stays as it was.
    copies, real_copy = [], samplers.sampling_copy
    monkeypatch.setattr(samplers, "model_device", lambda m: torch.device("meta"))
    monkeypatch.setattr(samplers, "sampling_copy", lambda m, d, t=None: copies.append((m is ema, t)) or real_copy(m, d, t))
    bf16 = make_config(None, dict(out=str(tmp_path), sample_steps=3, sample_per_class=2, sample_classes=[0, 1, 2],
                                  mixed_precision="bf16", ema_device="cpu"))
    sample_grid(ema, diffusion, bf16, tmp_path, 8, [str(i) for i in range(10)], False, None, torch.device("cpu"))
    assert copies == [(True, torch.bfloat16)] and (tmp_path / "samples" / "step_0000008.png").is_file()
    assert_untouched(ema, before, modes)


# ----------------------------------------------------------------------------------------------------------
# Labels and the partition of the shards
# ----------------------------------------------------------------------------------------------------------


def test_uniform_and_balanced_labels_are_fixed_by_the_seed():
    u = make_labels(5000, 10, "uniform", seed=3)
    assert u.dtype == np.int64 and np.array_equal(u, make_labels(5000, 10, "uniform", seed=3))
    assert not np.array_equal(u, make_labels(5000, 10, "uniform", seed=4))
    counts = np.bincount(u, minlength=10)
    assert counts.min() > 400 and counts.max() < 600 and len(set(counts)) > 1  # random counts around 500
    b = make_labels(5000, 10, "balanced", seed=3)
    assert np.bincount(b).tolist() == [500] * 10 and not np.array_equal(b[:10], np.arange(10))  # equal, shuffled
    odd = make_labels(1003, 10, "balanced", seed=0)
    assert sorted(np.bincount(odd).tolist()) == [100] * 7 + [101] * 3
    sub = make_labels(300, 1000, "balanced", seed=1, classes=[5, 7, 9])
    assert sorted(set(sub.tolist())) == [5, 7, 9] and np.bincount(sub)[[5, 7, 9]].tolist() == [100] * 3
    assert make_labels(4, 0, "uniform").tolist() == [0, 0, 0, 0]  # unconditional
    with pytest.raises(ValueError, match="uniform, balanced"):
        make_labels(4, 10, "random")


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_processes_take_disjoint_shards_that_cover_the_missing_ones(world):
    todo = [0, 2, 3, 5, 6, 7, 8, 11, 12]
    parts = [assigned_shards(todo, r, world) for r in range(world)]
    flat = [k for part in parts for k in part]
    assert sorted(flat) == todo and len(flat) == len(set(flat))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1  # balanced


# ----------------------------------------------------------------------------------------------------------
# Shards: resume, processes, settings, a full disk (a fast stand-in sampler)
# ----------------------------------------------------------------------------------------------------------


class FakeSampler:
    """Images that depend on (label, seed) only, like generate's; can stop at a given shard like a kill."""

    def __init__(self, stop_after=None):
        self.calls, self.stop_after = [], stop_after

    def __call__(self, labels, seed, tick):
        if self.stop_after is not None and len(self.calls) == self.stop_after:
            raise KeyboardInterrupt  # killed while sampling this shard
        self.calls.append(seed)
        out = np.stack([np.random.default_rng([int(c), seed + i]).integers(0, 256, (4, 4, 3), dtype=np.uint8)
                        for i, c in enumerate(labels)])
        tick(len(labels))
        return out


SETTINGS = dict(num_samples=23, seed=5, sampler="fake", labels="uniform")


def run(out, sampler=None, settings=SETTINGS, **kw):
    labels = make_labels(settings["num_samples"], 10, settings["labels"], settings["seed"])
    kw.setdefault("shard_size", 4)
    return sample_to_npz(out, sampler or FakeSampler(), settings, labels, progress=False, **kw)


@pytest.fixture
def reference(tmp_path):
    path = tmp_path / "ref" / "samples.npz"
    result = run(path)
    assert result["complete"] and result["sampled"] == 23 and result["resumed"] == 0
    return path


def test_npz_is_what_the_fid_tools_read_and_shards_are_cleaned_up(reference):
    with np.load(reference) as data:
        assert sorted(data.files) == ["arr_0", "labels"]
        arr, labels = data["arr_0"], data["labels"]
    assert arr.dtype == np.uint8 and arr.shape == (23, 4, 4, 3)
    assert np.array_equal(labels, make_labels(23, 10, "uniform", 5))
    expected = FakeSampler()(labels, 5, lambda n: None)  # sample i from (label i, seed + i), whatever the shard
    assert np.array_equal(arr, expected)
    folder = shard_folder(reference)
    assert sorted(p.name for p in folder.iterdir()) == ["labels.npy", "manifest.json"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["complete"] and manifest["shard_size"] == 4 and manifest["npz_bytes"] == reference.stat().st_size
    # the ADM evaluator's way of reading arr_0: the .npy header from inside the zip entry
    with zipfile.ZipFile(reference) as zf, zf.open("arr_0.npy") as f:
        assert np.lib.format.read_magic(f) == (1, 0)
        assert np.lib.format.read_array_header_1_0(f) == ((23, 4, 4, 3), False, np.dtype(np.uint8))


def test_a_killed_run_resumes_to_the_same_bytes(tmp_path, reference):
    out = tmp_path / "killed" / "samples.npz"
    with pytest.raises(KeyboardInterrupt):
        run(out, FakeSampler(stop_after=2))  # two shards written, killed in the third
    folder = shard_folder(out)
    assert sorted(p.name for p in folder.glob("shard_*.npy")) == ["shard_000000.npy", "shard_000001.npy"]
    (folder / ".shard_000002.npy.tmp-abc123").write_bytes(b"half a shard")  # what a SIGKILL mid-write leaves
    assert not out.exists()
    again = FakeSampler()
    result = run(out, again)
    assert again.calls == [5 + 8, 5 + 12, 5 + 16, 5 + 20]  # only the missing shards, from their first seed
    assert result["resumed"] == 8 and result["sampled"] == 15
    assert out.read_bytes() == reference.read_bytes()
    assert not list(folder.glob(".shard_*"))
    done = run(out, FakeSampler(stop_after=0))  # a rerun of a finished run samples nothing
    assert done["already_complete"] and out.read_bytes() == reference.read_bytes()


def test_other_settings_are_refused(tmp_path, reference):
    with pytest.raises(SampleRunError, match=r"seed: 5 before, 6 now.*Rerun with the settings"):
        run(reference, settings=dict(SETTINGS, seed=6))
    with pytest.raises(SampleRunError, match="shard_size: 4 before, 5 now"):
        run(reference, shard_size=5)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, arr_0=np.zeros((2, 4, 4, 3), np.uint8))
    with pytest.raises(SampleRunError, match="not written by a resumable run"):
        run(foreign)


def test_processes_split_the_shards_and_process_0_assembles(tmp_path, reference):
    """torchrun simulated with threads: each "process" runs sample_to_npz with its rank and a shared barrier."""

    def simulate(out, world, stop=None):
        barrier = threading.Barrier(world)
        samplers_, errors = [FakeSampler(stop) for _ in range(world)], []

        def proc(rank):
            try:
                run(out, samplers_[rank], rank=rank, world_size=world, barrier=barrier.wait)
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)
                barrier.abort()

        threads = [threading.Thread(target=proc, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return samplers_, errors

    out = tmp_path / "ddp" / "samples.npz"
    procs, errors = simulate(out, 3)
    assert not errors
    seeds = [s for p in procs for s in p.calls]
    assert sorted(seeds) == [5 + 4 * k for k in range(6)] and all(p.calls for p in procs)  # disjoint, complete
    assert out.read_bytes() == reference.read_bytes()
    # killed on 2 processes after one shard each, resumed on 3: still the same file
    out2 = tmp_path / "ddp2" / "samples.npz"
    _, errors = simulate(out2, 2, stop=1)
    assert errors and len(list(shard_folder(out2).glob("shard_*.npy"))) == 2
    _, errors = simulate(out2, 3)
    assert not errors and out2.read_bytes() == reference.read_bytes()


def test_a_full_disk_says_which_shard_and_how_to_resume(tmp_path, reference, monkeypatch):
    out = tmp_path / "full" / "samples.npz"
    real = shards.atomic_write

    def full_at_shard_3(path, write, *a, **k):
        if path.name == "shard_000003.npy":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, write, *a, **k)

    monkeypatch.setattr(shards, "atomic_write", full_at_shard_3)
    with pytest.raises(SampleRunError) as err:
        run(out)
    message = str(err.value)
    for part in ("disk is full", "shard 3", "shard_000003.npy", "bytes", "images 12..15", "3 shards finished",
                 "intact", "rerun the same command"):
        assert part in message, part
    assert f"{4 * 4 * 4 * 3 + 128:,} bytes" in message
    monkeypatch.setattr(shards, "atomic_write", real)
    assert run(out)["resumed"] == 12
    assert out.read_bytes() == reference.read_bytes()


def test_streamed_npz_equals_savez_and_is_deterministic(tmp_path):
    rng = np.random.default_rng(0)
    arr, labels = rng.integers(0, 256, (10, 5, 5, 3), dtype=np.uint8), np.arange(10)
    for name in ("a.npz", "b.npz"):
        with open(tmp_path / name, "wb") as f:
            assert files.write_npz_stream(f, [arr[:3], arr[3:9], arr[9:]], arr.shape, labels) == 10
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    np.savez(tmp_path / "c.npz", arr_0=arr, labels=labels)
    with np.load(tmp_path / "a.npz") as ours, np.load(tmp_path / "c.npz") as theirs:
        assert ours.files == theirs.files
        assert all(np.array_equal(ours[k], theirs[k]) and ours[k].dtype == theirs[k].dtype for k in ours.files)
    with open(tmp_path / "d.npz", "wb") as f, pytest.raises(ValueError, match="9 images written, 10 announced"):
        files.write_npz_stream(f, [arr[:9]], arr.shape)


# ----------------------------------------------------------------------------------------------------------
# dit-sample: a real model, interrupted and resumed; the official mode; no null class
# ----------------------------------------------------------------------------------------------------------


def _run_checkpoint(path, model, **config):
    torch.save({"model": model.state_dict(), "ema": model.state_dict(),
                "config": {"model_config": model.config(), "data_kind": "pixels", "classes": [str(i) for i in
                           range(model.num_classes)], "sample_sampler": "ddim", "sample_steps": 3,
                           "sample_cfg_scale": 2.0, **config}}, path)
    return path


CLI = ["--num-samples", "10", "--shard-size", "4", "--batch-size", "3", "--precision", "fp32", "--device", "cpu",
       "--no-progress", "--json"]


def test_dit_sample_resumes_an_interrupted_run_bit_identically(tmp_path, capsys, monkeypatch):
    import dit_core.sample as sample_pkg
    from dit_core.cli.sample import main

    ckpt = _run_checkpoint(tmp_path / "last.pt", tiny_dit())
    assert main(["--ckpt", str(ckpt), "--npz", str(tmp_path / "whole.npz"), *CLI]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["images_sampled"] == 10 and whole["labels"] == "uniform" and whole["shape"] == [8, 8, 1]

    real, calls = sample_pkg.generate, []

    def dies_in_the_second_shard(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sample_pkg, "generate", dies_in_the_second_shard)
    with pytest.raises(KeyboardInterrupt):
        main(["--ckpt", str(ckpt), "--npz", str(tmp_path / "cut.npz"), *CLI])
    monkeypatch.setattr(sample_pkg, "generate", real)
    capsys.readouterr()
    assert main(["--ckpt", str(ckpt), "--npz", str(tmp_path / "cut.npz"), *CLI]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["images_resumed"] == 4 and resumed["images_sampled"] == 6
    assert (tmp_path / "cut.npz").read_bytes() == (tmp_path / "whole.npz").read_bytes()
    # the images are generate()'s, sample i seeded seed + i
    with np.load(tmp_path / "whole.npz") as data:
        labels, arr = data["labels"], data["arr_0"]
    assert np.array_equal(labels, make_labels(10, 10, "uniform", 0))
    direct = generate(load_model(ckpt)[0], None, labels.tolist(), sampler="ddim", steps=3, cfg_scale=2.0, seed=0,
                      batch_size=3)
    assert np.array_equal(arr, to_uint8(direct))
    # another setting into the same file: refused, naming it
    assert main(["--ckpt", str(ckpt), "--npz", str(tmp_path / "whole.npz"), *CLI, "--labels", "balanced"]) == 1
    assert "labels: 'uniform' before, 'balanced' now" in capsys.readouterr().err


def test_official_checkpoint_says_which_settings_it_uses(tmp_path, capsys):
    diffusers = pytest.importorskip("diffusers")
    from dit_core.cli.sample import _settings, main

    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8),
                                  down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                                  layers_per_block=1, norm_num_groups=4, sample_size=16).eval()
    vae.save_pretrained(tmp_path / "vae")
    model = tiny_dit(in_channels=4)
    torch.save(model.state_dict(), tmp_path / "DiT-tiny.pt")  # a bare state dict, as the released checkpoints
    args = ["--ckpt", str(tmp_path / "DiT-tiny.pt"), "--vae", str(tmp_path / "vae"), "--steps", "2", "--device",
            "cpu", "--no-progress", "--json"]
    assert main([*args, "--classes", "1,2", "--per-class", "1", "--grid", str(tmp_path / "g.png")]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert (summary["sampler"], summary["cfg_scale"], summary["guidance_channels"]) == ("ddpm", 4.0, 3)
    assert "the official sample.py's settings" in captured.err and "add --official" in captured.err
    assert "overridden: --steps, --vae" in captured.err

    assert main([*args, "--official", "--num-samples", "4", "--npz", str(tmp_path / "o.npz")]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert (summary["sampler"], summary["cfg_scale"], summary["guidance_channels"], summary["labels"],
            summary["precision"]) == ("ddpm", 1.5, 3, "uniform", "fp32")
    assert "--official (the official sample_ddp.py's FID settings)" in captured.err
    with np.load(tmp_path / "o.npz") as data:
        assert data["arr_0"].shape == (4, 16, 16, 3)

    # without --vae, --official decodes with the ema VAE; by default 50,000 uniform samples
    from dit_core.cli.sample import _labels, build_parser

    ns = build_parser().parse_args(["--ckpt", "x", "--official", "--npz", "o.npz"])
    loaded, info = load_model(tmp_path / "DiT-tiny.pt")
    settings, _ = _settings(ns, info, loaded)
    assert settings["vae"] == "ema" and settings["steps"] == 250 and settings["precision"] == "fp32"
    labels, how = _labels(ns, loaded, info)
    assert how == dict(labels="uniform", classes=None, per_class=None, num_samples=50_000) and len(labels) == 50_000

    pixel = _run_checkpoint(tmp_path / "pixel.pt", tiny_dit())
    assert main(["--ckpt", str(pixel), "--official", "--npz", str(tmp_path / "p.npz"), "--device", "cpu"]) == 2
    assert "--official reproduces the official evaluation of latent DiTs" in capsys.readouterr().err


@pytest.fixture(scope="module")
def no_null_run(tmp_path_factory):
    """A tiny model trained with class_dropout_prob 0, whose end-of-training grid asks for guidance 2."""
    from dit_core.train import make_config, train

    out = tmp_path_factory.mktemp("nonull") / "run"
    cfg = make_config("digits", dict(out=str(out), class_dropout_prob=0.0, max_steps=3, batch_size=16, depth=2,
                                     hidden_size=32, num_heads=2, subset=64, sample_every=0, sample_at_end=True,
                                     sample_steps=2, sample_per_class=1, sample_cfg_scale=2.0, progress=False,
                                     tensorboard=False, log_every=1000, warmup_steps=0))
    with pytest.warns(UserWarning, match="class_dropout_prob 0 trains no null class"):
        summary = train(cfg)
    return out, summary


def test_a_model_without_null_class_samples_without_guidance(no_null_run, tmp_path, capsys):
    from dit_core.cli.sample import main

    out, summary = no_null_run
    assert summary["samples"] and (out / "samples" / "step_0000003.png").is_file()  # the grid, no IndexError
    model, info = load_model(out)
    assert model.num_classes == 10 and not has_null_class(model) and info["null_class"] is False
    images = generate(model, None, [0, 9], sampler="ddim", steps=2, seed=0)
    assert images.shape == (2, 1, 8, 8)
    with pytest.raises(ValueError, match=r"class_dropout_prob 0.*no null class.*cfg_scale 1 \(--cfg-scale 1\)"):
        generate(model, None, [0, 9], sampler="ddim", steps=2, cfg_scale=4.0)
    # dit-sample: the run's cfg 2 falls back to 1 with a note; an explicit guidance scale is the clear error
    base = ["--ckpt", str(out), "--steps", "2", "--device", "cpu", "--no-progress", "--json", "--per-class", "1",
            "--grid", str(tmp_path / "g.png")]
    assert main(base) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["cfg_scale"] == 1.0 and "no null class" in captured.err
    assert main([*base, "--cfg-scale", "3"]) == 2
    assert "has no null class" in capsys.readouterr().err


def test_torchrun_processes_sample_their_own_shards_into_the_same_file(tmp_path, capsys):
    """``torchrun --nproc_per_node 2`` on the CPU (gloo): two processes, one .npz, bit-identical to one process."""
    import subprocess
    import sys
    from pathlib import Path

    from dit_core.cli.sample import main

    repo = Path(__file__).resolve().parents[1]
    ckpt = _run_checkpoint(tmp_path / "last.pt", tiny_dit())
    args = ["--ckpt", str(ckpt), *CLI[:-2], "--num-samples", "14"]  # 4 shards of 4, 4, 4, 2
    env = dict(__import__("os").environ, OMP_NUM_THREADS="1", PYTHONPATH=str(repo))
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "dit_core.cli.sample", *args, "--npz", str(tmp_path / "two.npz")],
                         env=env, cwd=repo, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stdout + two.stderr
    assert main([*args, "--npz", str(tmp_path / "one.npz")]) == 0
    assert (tmp_path / "two.npz").read_bytes() == (tmp_path / "one.npz").read_bytes()
    # process 0 alone reports, and it sampled its part only: shards 0 and 2 (8 images), process 1 shards 1 and 3
    assert two.stdout.count("npz ->") == 1 and "8 images (ddim" in two.stdout
