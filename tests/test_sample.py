"""Sampling: determinism, per-sample seeds, the npz format, latent decoding, the dit-sample CLI."""

import numpy as np
import pytest
import torch

from dit_core.diffusion import create_diffusion
from dit_core.models import DiT
from dit_core.sample import ddim_timesteps, generate, load_model, parse_classes, save_grid, save_npz
from dit_core.sample.samplers import _rebuild, guided


def tiny_dit(in_channels=1, num_classes=10, seed=0, input_size=8):
    """A small DiT with random (not adaLN-zero) weights, so that every part of it affects the output."""
    torch.manual_seed(seed)
    model = DiT(input_size=input_size, patch_size=2, in_channels=in_channels, hidden_size=32, depth=2, num_heads=2,
                num_classes=num_classes)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.normal_(0, 0.05)
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return tiny_dit()


@pytest.fixture(scope="module")
def diffusion():
    return create_diffusion("")


LABELS = [0, 3, 3, 7, 9]


def test_ddim_eta0_is_deterministic_and_matches_the_diffusion_loop(model, diffusion):
    a = generate(model, diffusion, LABELS, sampler="ddim", steps=10, cfg_scale=3.0, seed=5)
    b = generate(model, diffusion, LABELS, sampler="ddim", steps=10, cfg_scale=3.0, seed=5)
    assert torch.equal(a, b)
    c = generate(model, diffusion, LABELS, sampler="ddim", steps=10, cfg_scale=3.0, seed=6)
    assert (a - c).abs().max() > 0.1  # another seed, other images

    # The same trajectory through GaussianDiffusion.ddim_sample_loop, from the same per-sample noise.
    spaced = _rebuild(diffusion, ddim_timesteps(1000, 10))
    noise = torch.stack([torch.randn((1, 8, 8), generator=torch.Generator().manual_seed(5 + i)) for i in range(5)])
    ref = spaced.ddim_sample_loop(guided(model, 3.0, None), noise.shape, noise, clip_denoised=True,
                                  model_kwargs=dict(y=torch.tensor(LABELS)))
    assert torch.allclose(a, ref.clamp(-1, 1), atol=1e-5)


def test_ddim_steps_are_the_official_and_diffusers_ones():
    assert ddim_timesteps(1000, 25) == list(range(0, 1000, 40))  # the official "ddim25"
    assert len(ddim_timesteps(1000, 30)) == 30  # and every other count (diffusers' "leading" spacing)
    with pytest.raises(ValueError, match="1..1000"):
        ddim_timesteps(1000, 0)


@pytest.mark.parametrize("sampler,kwargs", [("ddpm", dict(steps=20)), ("ddim", dict(steps=10, eta=1.0)),
                                            ("dpm-solver++", dict(steps=8))])
def test_batch_size_does_not_change_samples(model, diffusion, sampler, kwargs):
    whole = generate(model, diffusion, LABELS, sampler=sampler, cfg_scale=2.0, seed=11, batch_size=5, **kwargs)
    pieces = generate(model, diffusion, LABELS, sampler=sampler, cfg_scale=2.0, seed=11, batch_size=2, **kwargs)
    assert torch.allclose(whole, pieces, atol=1e-5)
    # Image i is image 0 of the run seeded seed + i: regenerate one image alone.
    alone = generate(model, diffusion, LABELS[3:4], sampler=sampler, cfg_scale=2.0, seed=11 + 3, **kwargs)
    assert torch.allclose(whole[3:4], alone, atol=1e-5)
    assert whole.std() > 0.1 and whole.abs().max() <= 1.0


def test_stochastic_samplers_use_their_noise(model, diffusion):
    ddim0 = generate(model, diffusion, LABELS, sampler="ddim", steps=10, seed=1)
    ddim1 = generate(model, diffusion, LABELS, sampler="ddim", steps=10, eta=1.0, seed=1)
    assert (ddim0 - ddim1).abs().max() > 0.05


def test_guidance_scale_one_is_conditional_sampling_and_channels_matter(diffusion):
    m = tiny_dit(in_channels=4, seed=1)
    plain = generate(m, diffusion, LABELS, sampler="ddim", steps=5, seed=0, clip_denoised=False)
    one = generate(m, diffusion, LABELS, sampler="ddim", steps=5, seed=0, cfg_scale=1.0, clip_denoised=False)
    assert torch.equal(plain, one)
    all4 = generate(m, diffusion, LABELS, sampler="ddim", steps=5, seed=0, cfg_scale=4.0, clip_denoised=False)
    first3 = generate(m, diffusion, LABELS, sampler="ddim", steps=5, seed=0, cfg_scale=4.0, guidance_channels=3,
                      clip_denoised=False)
    # The official mode leaves noise channel 3 unguided, so that channel's samples change.
    assert (all4[:, 3] - first3[:, 3]).abs().max() > 1e-3
    assert (all4 - plain).abs().max() > 1e-3


def test_bf16_autocast_stays_close(model, diffusion):
    fp32 = generate(model, diffusion, LABELS, sampler="ddim", steps=10, seed=2)
    bf16 = generate(model, diffusion, LABELS, sampler="ddim", steps=10, seed=2, amp="bf16")
    assert bf16.dtype == torch.float32
    assert (fp32 - bf16).abs().mean() < 0.05


def test_callback_sees_every_step(model, diffusion):
    seen = []
    generate(model, diffusion, [1, 2], sampler="ddim", steps=6, seed=0,
             callback=lambda info: seen.append((info["step"], info["t"], info["x"].shape, info["batch_start"])))
    assert [s[0] for s in seen] == list(range(6))
    assert [s[1] for s in seen] == [1000 // 6 * k for k in range(5, -1, -1)]  # original timesteps, high to low
    assert seen[0][2] == (2, 1, 8, 8)


def test_latent_sampling_decodes_with_the_vae(diffusion):
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8),
                                  down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                                  layers_per_block=1, norm_num_groups=4, sample_size=16).eval()
    m = tiny_dit(in_channels=4)
    latents = generate(m, diffusion, [1, 2, 3], sampler="ddim", steps=4, seed=0, clip_denoised=False)
    images = generate(m, diffusion, [1, 2, 3], sampler="ddim", steps=4, seed=0, vae=vae, decode_batch_size=2)
    assert images.shape == (3, 3, 16, 16)  # the VAE doubles the side (two blocks)
    expected = vae.decode(latents / vae.config.scaling_factor).sample.clamp(-1, 1)
    assert torch.allclose(images, expected, atol=1e-5)


def test_bad_inputs_say_what_is_wrong(model, diffusion):
    with pytest.raises(ValueError, match="0..9"):
        generate(model, diffusion, [3, 10], steps=2)
    with pytest.raises(ValueError, match="sampler .euler. does not sample.*use one of ddpm"):
        generate(model, diffusion, [1], sampler="euler")
    with pytest.raises(ValueError, match="eta is a DDIM setting"):
        generate(model, diffusion, [1], sampler="ddpm", eta=0.5)
    with pytest.raises(ValueError, match="training diffusion"):
        generate(model, create_diffusion("50"), [1], sampler="ddim", steps=10)


def test_npz_has_the_fid_tooling_layout(tmp_path, model, diffusion):
    images = generate(model, diffusion, LABELS, sampler="ddim", steps=3, seed=0)
    path = save_npz(tmp_path / "s.npz", images, LABELS)
    with np.load(path) as data:
        assert sorted(data.files) == ["arr_0", "labels"]
        arr, labels = data["arr_0"], data["labels"]
    assert arr.dtype == np.uint8 and arr.shape == (5, 8, 8, 1)
    assert labels.dtype == np.int64 and labels.tolist() == LABELS
    # uint8 = round((x + 1) * 127.5): -1 -> 0, 1 -> 255
    expected = ((images.permute(0, 2, 3, 1) + 1) * 127.5).round().numpy()
    assert np.abs(arr.astype(float) - expected).max() == 0
    with pytest.raises(ValueError, match="5 images but 2 labels"):
        save_npz(tmp_path / "bad.npz", images, [1, 2])


def test_grid_is_one_row_per_class(tmp_path, model, diffusion):
    images = torch.zeros(6, 1, 8, 8)
    grid = save_grid(images, tmp_path / "g.png", nrow=3, labels=["a", "b", "c", "d", "e", "f"])
    assert (tmp_path / "g.png").is_file()
    assert grid.size == (3 * (64 + 2) + 2, 2 * (64 + 12 + 2) + 2)


def test_parse_classes():
    assert parse_classes("0-3,12, 7") == [0, 1, 2, 3, 12, 7]
    with pytest.raises(ValueError, match="out of range"):
        parse_classes("5-12", num_classes=10)
    with pytest.raises(ValueError, match="numbers and ranges"):
        parse_classes("cat")


def _training_checkpoint(path, model, **config):
    torch.save({"model": model.state_dict(), "ema": model.state_dict(),
                "config": {"model_config": model.config(), "data_kind": "pixels", "classes": [f"c{i}" for i in
                           range(model.num_classes)], "sample_sampler": "ddim", "sample_steps": 7,
                           "sample_cfg_scale": 2.5, **config}}, path)
    return path


def test_load_model_reads_the_run_settings(tmp_path, model):
    loaded, info = load_model(_training_checkpoint(tmp_path / "last.pt", model))
    assert info["space"] == "pixel" and info["label_names"][3] == "c3"
    assert (info["sampler"], info["steps"], info["cfg_scale"]) == ("ddim", 7, 2.5)
    torch.save(model.state_dict(), tmp_path / "bare.pt")
    _, bare = load_model(tmp_path / "bare.pt")
    assert bare["space"] == "pixel" and bare["sampler"] == "ddpm"
    with pytest.raises(FileNotFoundError, match="neither a dit_core run"):
        load_model(tmp_path)


def test_dit_sample_cli(tmp_path, model, capsys):
    from dit_core.cli.sample import main

    ckpt = _training_checkpoint(tmp_path / "last.pt", model)
    rc = main(["--ckpt", str(ckpt), "--classes", "2-3,7", "--per-class", "2", "--steps", "3", "--precision", "fp32",
               "--device", "cpu", "--grid", str(tmp_path / "g.png"), "--npz", str(tmp_path / "s.npz"), "--json",
               "--no-progress", "--batch-size", "4"])
    assert rc == 0
    import json

    summary = json.loads(capsys.readouterr().out)
    assert summary["sampler"] == "ddim" and summary["cfg_scale"] == 2.5 and summary["images"] == 6
    # both figures are rounded to 3 decimals: images/s is 6 images over the sampling seconds, within that rounding
    seconds, per_second = summary["seconds"], summary["images_per_second"]
    assert 6 / (seconds + 5e-4) - 1e-3 <= per_second <= 6 / max(seconds - 5e-4, 1e-9) + 1e-3
    with np.load(tmp_path / "s.npz") as data:
        assert data["labels"].tolist() == [2, 2, 3, 3, 7, 7] and data["arr_0"].shape == (6, 8, 8, 1)
    # the same images as the library call with the same settings
    images = generate(model, None, [2, 2, 3, 3, 7, 7], sampler="ddim", steps=3, cfg_scale=2.5, seed=0)
    with np.load(tmp_path / "s.npz") as data:
        assert np.array_equal(data["arr_0"], ((images.permute(0, 2, 3, 1) + 1) * 127.5).round().byte().numpy())
    assert main(["--ckpt", str(ckpt), "--classes", "12", "--npz", str(tmp_path / "x.npz")]) == 2
    assert "out of range" in capsys.readouterr().err
