"""The faster-converging options end to end on CPU: DiT's default step unchanged bit for bit; every option trains,
resumes exactly, samples, is scored, and is exported or refused; teacher features beside latents."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dit_core import load_dit
from dit_core.checkpoint import CheckpointError
from dit_core.diffusion import create_diffusion, create_process
from dit_core.train import ConfigError, make_config, train
from dit_core.train.batches import micro_slice, step_draws
from dit_core.train.ema import create_ema, update_ema
from dit_core.train.step import StepOptions, TrainStep

TINY = dict(model="DiT-S/2", depth=3, hidden_size=32, num_heads=2, image_size=8, channels=1, flip=False,
            batch_size=8, num_workers=0, tensorboard=False, progress=False, sample_at_end=False, log_every=1000,
            lr=1e-3, ema_decay=0.9, diffusion_steps=100, mixed_precision="fp32")

OPTIONS = {
    "flow": dict(objective="flow", learn_sigma=False),
    "logit_normal": dict(timestep_sampling="logit_normal", logit_mean=-0.5),
    "min_snr": dict(loss_weighting="min_snr", min_snr_gamma=2.0),
    "flow_repa": dict(objective="flow", learn_sigma=False, timestep_sampling="logit_normal",
                      repa_weight=0.5, repa_depth=1, repa_projector_dim=16),
    "flow_min_snr": dict(objective="flow", learn_sigma=False, loss_weighting="min_snr",
                         timestep_sampling="logit_normal"),
    "mask": dict(mask_ratio=0.5, mask_decoder_depth=1, mask_finetune_steps=2),
    "repa": dict(repa_weight=0.5, repa_depth=1, repa_projector_dim=16),
    "all": dict(objective="flow", learn_sigma=False, timestep_sampling="logit_normal", loss_weighting="min_snr",
                mask_ratio=0.25, repa_weight=0.5, repa_depth=2, repa_projector_dim=16),
}


class Blobs(torch.utils.data.Dataset):
    """32 deterministic 1x8x8 images in 3 classes: a bright square whose position is the class."""

    num_classes = 3
    sample_shape = (1, 8, 8)
    flip = False

    def __init__(self, n=32):
        g = torch.Generator().manual_seed(0)
        self.x = (0.3 * torch.randn(n, 1, 8, 8, generator=g) - 0.8).clamp(-1, 1)
        self.y = torch.arange(n) % 3
        for i in range(n):
            c = int(self.y[i]) * 2 + 1
            self.x[i, 0, c : c + 3, c : c + 3] = 0.9

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def state(out, name="last.pt"):
    return torch.load(Path(out) / "checkpoints" / name, map_location="cpu", weights_only=True)


def assert_same_run(a: dict, b: dict):
    assert a["step"] == b["step"] and a["data"] == b["data"]
    for key in ("model", "ema", "extras"):
        assert (key in a) == (key in b), key
        for name, value in a.get(key, {}).items():
            assert torch.equal(b[key][name], value), f"{key}.{name}"
    for pid, s in a["opt"]["state"].items():
        for name, value in s.items():
            assert torch.equal(b["opt"]["state"][pid][name], value), f"optimizer {pid}.{name}"


# ----------------------------------------------------------------------------------------------------------
# DiT's recipe is untouched
# ----------------------------------------------------------------------------------------------------------


def test_the_default_step_is_dits_step_bit_for_bit():
    """TrainStep with every new option off against the step written out from the entry points it had before
    them (step_draws, training_losses, AdamW, clip, EMA): the same losses and the same weights, bit for bit."""
    from dit_core.models import DiT

    def build():
        torch.manual_seed(0)
        model = DiT(input_size=8, patch_size=2, in_channels=1, hidden_size=32, depth=2, num_heads=2,
                    num_classes=3).eval()
        return model, create_ema(model), torch.optim.AdamW(model.parameters(), lr=1e-3)

    data = Blobs()
    diffusion = create_diffusion("", diffusion_steps=100)
    model, ema, opt = build()
    step = TrainStep(model, diffusion, opt, ema, StepOptions(grad_accum=2, ema_decay=0.9), batch_size=8, seed=3)
    assert step.objective is None
    ref_model, ref_ema, ref_opt = build()
    for k in range(3):
        batch = [(data.x[i : i + 4], data.y[i : i + 4]) for i in ((8 * k) % 32, (8 * k + 4) % 32)]
        result = step(k, iter(batch))
        # the reference: the step as it was written before the options existed
        draws = step_draws(3, k, 8, (1, 8, 8), diffusion.num_timesteps, ref_model.class_dropout_prob)
        total = torch.zeros(())
        for micro, (x, y) in enumerate(batch):
            d = draws.slice(micro_slice(8, 2, 1, 0, micro))
            y = torch.where(d.drop, torch.full_like(y, 3), y)
            loss = diffusion.training_losses(lambda xt, t, y: ref_model(xt, t, y).float(), x, d.t,
                                             model_kwargs=dict(y=y), noise=d.noise)["loss"].mean()
            (loss / 2).backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(list(ref_model.parameters()), float("inf"))
        ref_opt.step()
        update_ema(ref_ema, ref_model, 0.9)
        ref_opt.zero_grad(set_to_none=True)
        assert torch.equal(result.loss, total / 2)
    for (name, p), q in zip(model.state_dict().items(), ref_model.state_dict().values()):
        assert torch.equal(p, q), name
    for p, q in zip(ema.parameters(), ref_ema.parameters()):
        assert torch.equal(p, q)


def test_option_keys_are_validated_and_off_by_default():
    cfg = make_config(None, {})
    assert (cfg.objective, cfg.timestep_sampling, cfg.loss_weighting, cfg.mask_ratio, cfg.repa_weight) == \
        ("ddpm", "uniform", "none", 0.0, 0.0)
    for overrides, message in [
        (dict(objective="flow"), "learns no variance: add --learn-sigma false"),
        (dict(objective="flow", learn_sigma=False, sample_sampler="ddpm"), "sample_sampler.*does not sample a model trained with objective 'flow'.*euler"),
        (dict(sample_sampler="heun"), "sample_sampler.*'heun' does not sample.*'ddpm'.*ddpm, ddim, dpm-solver\\+\\+"),
        (dict(mask_ratio=1.0), "mask_ratio must be in \\[0, 1\\)"),
        (dict(logit_std=0), "logit_std .* must be > 0"),
        (dict(repa_weight=-1), "repa_weight must be >= 0"),
        (dict(objective="sit"), "objective must be one of ddpm, flow"),
    ]:
        with pytest.raises(ConfigError, match=message):
            make_config(None, overrides)
    # a flow run may keep a profile's "ddim" grids: for the interpolant, DDIM is the Euler step
    assert make_config("digits", dict(objective="flow", learn_sigma=False)).sample_sampler == "ddim"


def test_model_dependent_limits_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="mask_decoder_depth must be in 1..2"):
        train(make_config(None, {**TINY, "out": str(tmp_path / "a"), "mask_ratio": 0.5, "mask_decoder_depth": 3,
                                 "max_steps": 1}), dataset=Blobs())
    with pytest.raises(ConfigError, match="repa_depth 8 aligns the tokens after block 8, but depth is 3"):
        make_config(None, {**TINY, "out": str(tmp_path / "b"), "repa_weight": 0.5, "repa_depth": 8, "max_steps": 1})
    with pytest.raises(ValueError, match="repa_depth must be in 1..12"):  # a named model's depth: the objective says
        train(make_config(None, {**TINY, "depth": None, "out": str(tmp_path / "c"), "repa_weight": 0.5,
                                 "repa_depth": 13, "max_steps": 1}), dataset=Blobs())


# ----------------------------------------------------------------------------------------------------------
# Every option: trains, resumes exactly
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(OPTIONS))
def test_each_option_trains_and_resumes_exactly(tmp_path, name):
    """Train 4 steps; restart a copy of the run from its step-2 checkpoint: the same model, EMA, training-only
    parameters and optimizer state, bit for bit."""
    kw = {**TINY, **OPTIONS[name], "max_steps": 4, "ckpt_every": 2, "keep_every": 2}
    full = tmp_path / "full"
    summary = train(make_config(None, {**kw, "out": str(full)}), dataset=Blobs())
    end = state(full)
    assert summary["skipped_steps"] == 0 and all(torch.isfinite(v).all() for v in end["model"].values())
    assert not torch.equal(end["model"]["final_layer.linear.weight"], torch.zeros_like(end["model"]["final_layer.linear.weight"]))
    assert end["config"]["objective"] == kw.get("objective", "ddpm")
    assert ("extras" in end) == (kw.get("mask_ratio", 0) > 0 or kw.get("repa_weight", 0) > 0)
    records = (full / "metrics.jsonl").read_text()
    for term in (["mae"] if kw.get("mask_ratio") else []) + (["repa"] if kw.get("repa_weight") else []):
        assert f'"{term}"' in records

    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copy(full / "checkpoints" / "step_0000002.pt", resumed / "checkpoints" / "last.pt")
    if (full / "teacher.pt").exists():  # the fitted teacher is part of the run
        shutil.copy(full / "teacher.pt", resumed / "teacher.pt")
    train(make_config(None, {**kw, "out": str(resumed), "resume": "true"}), dataset=Blobs())
    assert_same_run(end, state(resumed))


def test_resume_refuses_another_objective(tmp_path):
    out = tmp_path / "run"
    train(make_config(None, {**TINY, **OPTIONS["repa"], "out": str(out), "max_steps": 1}), dataset=Blobs())
    with pytest.raises(CheckpointError, match="trained with the training-only parameters.*this run does not use them"):
        train(make_config(None, {**TINY, "out": str(out), "max_steps": 2, "resume": "true"}), dataset=Blobs())
    flow = tmp_path / "flow"
    train(make_config(None, {**TINY, **OPTIONS["flow"], "out": str(flow), "max_steps": 1}), dataset=Blobs())
    with pytest.raises(ConfigError, match="trained with objective flow, this run asks for ddpm"):
        train(make_config(None, {**TINY, "learn_sigma": False, "out": str(flow), "max_steps": 2, "resume": "true"}),
              dataset=Blobs())


def test_the_pixel_teacher_is_fitted_once_and_knows_the_classes(tmp_path, capsys):
    out = tmp_path / "repa"
    train(make_config(None, {**TINY, **OPTIONS["repa"], "out": str(out), "max_steps": 1}), dataset=Blobs())
    saved = torch.load(out / "teacher.pt", weights_only=True)
    assert saved["num_classes"] == 3 and saved["train_accuracy"] == 1.0  # the classes differ by position
    assert "REPA teacher: a small CNN fitted on the" in capsys.readouterr().out  # said once, when fitted
    before = (out / "teacher.pt").stat().st_mtime_ns
    train(make_config(None, {**TINY, **OPTIONS["repa"], "out": str(out), "max_steps": 2, "resume": "true"}),
          dataset=Blobs())
    assert (out / "teacher.pt").stat().st_mtime_ns == before  # a resumed run aligns to the same teacher
    assert "REPA teacher" not in capsys.readouterr().out


def test_repa_deeper_than_the_model_is_a_config_error_naming_both_fixes():
    with pytest.raises(ConfigError, match="--repa-depth 2, or --repa-weight 0"):
        make_config("small-images", {"depth": 4, "repa_depth": 5})
    with pytest.raises(ConfigError, match="--repa-depth 1, or --repa-weight 0"):
        make_config("small-images", {"depth": 1})  # the profile aligns after block 2
    assert make_config("small-images", {"depth": 1, "repa_weight": 0}).repa_depth == 2  # REPA off: no conflict


# ----------------------------------------------------------------------------------------------------------
# Sampling, scoring, exporting
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flow_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("flow") / "run"
    train(make_config(None, {**TINY, **OPTIONS["flow"], "out": str(out), "max_steps": 3, "sample_at_end": True,
                             "sample_steps": 4}), dataset=Blobs())
    return out


def test_a_flow_model_is_sampled_with_its_own_samplers(flow_run, tmp_path, capsys):
    from dit_core.cli.sample import main as dit_sample
    from dit_core.sample import generate, load_model

    assert (flow_run / "samples" / "step_0000003.png").exists()  # the run's grid (its "ddim" is Euler)
    model, info = load_model(flow_run)
    assert info["objective"] == "flow" and not model.learn_sigma
    process = create_process("flow", learn_sigma=False)
    euler = generate(model, process, [0, 1, 2], sampler="euler", steps=5, cfg_scale=2.0)
    assert torch.equal(generate(model, process, [0, 1, 2], sampler="ddim", steps=5, cfg_scale=2.0), euler)
    sde = generate(model, process, [0, 1, 2], sampler="euler-maruyama", steps=5)
    assert euler.shape == sde.shape == (3, 1, 8, 8) and torch.isfinite(sde).all()
    with pytest.raises(ValueError, match="does not sample a model trained with objective 'flow'.*euler, heun"):
        generate(model, process, [0], sampler="ddpm")
    assert dit_sample(["--ckpt", str(flow_run), "--grid", str(tmp_path / "g.png"), "--npz", str(tmp_path / "s.npz"),
                       "--sampler", "heun", "--steps", "3", "--classes", "0-2", "--per-class", "2",
                       "--no-progress"]) == 0
    assert np.load(tmp_path / "s.npz")["arr_0"].shape == (6, 8, 8, 1)
    assert dit_sample(["--ckpt", str(flow_run), "--grid", str(tmp_path / "h.png"), "--sampler", "ddpm",
                       "--no-progress"]) == 2
    assert "objective 'flow'" in capsys.readouterr().err


def test_a_flow_model_is_scored_like_any_other(flow_run):
    from dit_core.eval.classwise import digits_judge, sample_and_score
    from dit_core.sample import load_model

    model, info = load_model(flow_run)
    result = sample_and_score(model, create_process("flow", learn_sigma=False), digits_judge(),
                              class_names=["0", "1", "2"], per_class=4, sampler="euler", steps=4)
    assert result["num_samples"] == 12 and 0.0 <= result["class_accuracy"] <= 1.0
    assert np.isfinite(result["frechet_distance"])


def test_export_refuses_a_flow_model_and_takes_the_others(flow_run, tmp_path):
    pytest.importorskip("diffusers")
    from dit_core.interop import InteropError, export_diffusers

    with pytest.raises(InteropError, match="objective 'flow'.*velocity.*DDPM noise"):
        export_diffusers(load_dit(flow_run / "checkpoints" / "last.pt"), tmp_path / "flow")
    assert not (tmp_path / "flow").exists()
    masked = tmp_path / "masked"
    train(make_config(None, {**TINY, **OPTIONS["mask"], **OPTIONS["repa"], "out": str(masked), "max_steps": 1}),
          dataset=Blobs())
    model = load_dit(masked / "checkpoints" / "last.pt")  # the training-only heads are not part of the DiT
    assert model.checkpoint_meta["objective"] == "ddpm"
    assert (export_diffusers(model, tmp_path / "exported") / "transformer" / "config.json").is_file()


# ----------------------------------------------------------------------------------------------------------
# Teacher features beside latents
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def latents_with_features(tmp_path_factory):
    diffusers = pytest.importorskip("diffusers")
    from PIL import Image

    from dit_core.latents import extract_latents
    from dit_core.latents.features import extract_features

    root = tmp_path_factory.mktemp("images") / "data"
    rng = np.random.default_rng(0)
    for name in ("apple", "banana", "cherry"):
        (root / name).mkdir(parents=True)
        for i in range(7):
            Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
                                  norm_num_groups=4, down_block_types=("DownEncoderBlock2D",) * 4,
                                  up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 8, 16, 16))
    latents = tmp_path_factory.mktemp("latents") / "z"
    extract_latents(root, latents, vae=vae, vae_name="tiny", image_size=32, batch_size=4, num_workers=0,
                    progress=False, precision="fp32")
    from dit_core.teachers import DinoV2

    torch.manual_seed(1)
    teacher = DinoV2(dim=64, depth=2, heads=1, patch_size=14, pos_grid=5, image_size=56).eval()
    for p in teacher.parameters():
        p.data.normal_(0, 0.1)
    result = extract_features(latents, teacher, name="tiny-dino", batch_size=4, shard_size=8, progress=False)
    assert result["complete"] and result["count"] == 21 and result["grid"] == 4 and len(result["shards"]) == 3
    return latents, teacher


def test_features_are_stored_verified_and_resumed_identically(latents_with_features, tmp_path):
    from dit_core.latents.features import extract_features, verify_features

    latents, teacher = latents_with_features
    folder = latents / "teachers" / "tiny-dino"
    assert verify_features(folder) == []
    # an interrupted extraction continues to the same bytes
    copy = tmp_path / "z"
    shutil.copytree(latents, copy, ignore=shutil.ignore_patterns("teachers"))
    partial = extract_features(copy, teacher, name="tiny-dino", batch_size=4, shard_size=8, max_batches=3,
                               progress=False)
    assert not partial["complete"] and partial["done"] == 8 + 4
    extract_features(copy, teacher, name="tiny-dino", batch_size=4, shard_size=8, progress=False)
    for f in sorted(folder.glob("feat-*.npy")):
        assert (copy / "teachers" / "tiny-dino" / f.name).read_bytes() == f.read_bytes(), f.name
    damaged = np.load(folder / "feat-00001.npy")
    damaged[0, 0, 0, 0] += 1
    np.save(copy / "teachers" / "tiny-dino" / "feat-00001.npy", damaged)
    assert verify_features(copy / "teachers" / "tiny-dino") == ["feat-00001.npy: checksum mismatch"]


def test_the_dataset_serves_the_features_of_the_latents_view(latents_with_features):
    from dit_core.data import ImageFolderDataset
    from dit_core.latents import LatentDataset
    from dit_core.latents.features import TeacherFeatureDataset, teacher_folder
    from dit_core.teachers import token_features

    latents, teacher = latents_with_features
    base = LatentDataset(latents, flip=True, sample=True)
    data = TeacherFeatureDataset(base, teacher_folder(latents, "auto"), grid=2)
    assert data.num_classes == 3 and data.sample_shape == (4, 4, 4) and data.teacher_dim == 64
    images = ImageFolderDataset(base.manifest["dataset"]["root"], 32, flip=False)
    x = images.load(5)[0][None]
    for view, image in ((0, x), (1, x.flip(-1))):
        expected = token_features(teacher.feature_map(image).float(), 2)[0]
        torch.testing.assert_close(data.features(5, view), expected, rtol=0, atol=2e-3)  # stored as float16
    torch.manual_seed(7)
    z, label, f = data[5]
    torch.manual_seed(7)
    z_base, label_base = base[5]
    assert torch.equal(z, z_base) and label == label_base  # the same latent draw as without features
    assert torch.equal(f, data.features(5, 0)) or torch.equal(f, data.features(5, 1))
    with pytest.raises(FileNotFoundError, match="no teacher features 'dinov2-vitb14'.*found: \\['tiny-dino'\\]"):
        teacher_folder(latents, "dinov2-vitb14")


def test_representation_alignment_trains_on_latents(latents_with_features, tmp_path):
    latents, _ = latents_with_features
    kw = {**TINY, "latents_path": str(latents), "image_size": 32, "channels": 3, "flip": True,
          "repa_weight": 0.5, "repa_depth": 1, "repa_projector_dim": 16, "max_steps": 2, "batch_size": 4}
    summary = train(make_config(None, {**kw, "out": str(tmp_path / "run")}))
    end = state(tmp_path / "run")
    assert summary["steps"] == 2 and end["extras"]["projector.4.weight"].shape == (64, 16)
    assert '"repa"' in (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(FileNotFoundError, match="no teacher features 'other'"):
        train(make_config(None, {**kw, "repa_teacher": "other", "out": str(tmp_path / "other")}))


def test_the_feature_command_reads_released_weights(latents_with_features, tmp_path, capsys):
    from dit_core.latents.features import main, verify_features

    latents, teacher = latents_with_features
    copy = tmp_path / "z"
    shutil.copytree(latents, copy, ignore=shutil.ignore_patterns("teachers"))
    torch.save(teacher.state_dict(), tmp_path / "dinov2_vitb14_pretrain.pth")  # the released layout, tiny
    assert main([str(copy), "--weights", str(tmp_path / "dinov2_vitb14_pretrain.pth"), "--batch-size", "8"]) == 0
    assert "21 images, 16x16 tokens of 64" in capsys.readouterr().out  # 224 px / patch 14
    assert verify_features(copy / "teachers" / "dinov2-vitb14") == []
