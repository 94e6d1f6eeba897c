"""dit_core.latents and dit_core.vae: offline VAE loading, resumable extraction, verification, and the latent dataset.

Every test runs offline: a tiny AutoencoderKL (4 blocks, so the real 8x downsampling, but 8-16 channels)
is saved with save_pretrained and loaded back through the same load_vae() that takes a hub id.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

diffusers = pytest.importorskip("diffusers")

import dit_core.latents.extract as extraction  # noqa: E402
from dit_core.cli.extract_latents import main as dit_extract  # noqa: E402
from dit_core.data import ImageFolderDataset  # noqa: E402
from dit_core.data.check import plant_bad_files  # noqa: E402
from dit_core import vae as dit_vae  # noqa: E402
from dit_core.latents import LatentDataset, LatentFormatError, extract_latents, open_dataset, verify  # noqa: E402
from dit_core.vae import VAENotFoundError, encode_moments, load_vae  # noqa: E402

SIZE = 32  # pixels; latents are 4 x 4 x 4
KW = dict(image_size=SIZE, batch_size=4, shard_size=16, num_workers=0, progress=False, precision="fp32")


def tiny_vae():
    torch.manual_seed(0)
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1, norm_num_groups=4,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16), sample_size=SIZE,
    )


@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vae") / "tiny-vae"
    tiny_vae().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory) -> Path:
    """3 classes x 13 colourful 40x48 images: 39 images -> 3 shards of 16 (the last one partial)."""
    root = tmp_path_factory.mktemp("images") / "data"
    rng = np.random.default_rng(0)
    for c, name in enumerate(("apple", "banana", "cherry")):
        (root / "train" / name).mkdir(parents=True)
        for i in range(13):
            base = rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)
            img = Image.fromarray(base).resize((48, 40), Image.BICUBIC)
            img.save(root / "train" / name / f"{i:02d}.jpg", quality=95)
    return root


@pytest.fixture(scope="module")
def full_run(images_dir, vae_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("latents") / "full"
    result = extract_latents(images_dir, out, vae=str(vae_dir), **KW)
    assert result["complete"]
    return out


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix == ".npy"}


# ------------------------------------------------------------------------------------------ loading
def test_load_vae_from_saved_folder_matches_original(vae_dir):
    vae = load_vae(vae_dir)
    reference = tiny_vae()
    for (name, p), (_, q) in zip(vae.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(p, q), name
    assert not vae.training and not any(p.requires_grad for p in vae.parameters())
    assert dit_vae.downsample_factor(vae) == 8 and dit_vae.vae_scale(vae) == pytest.approx(0.18215)


def test_load_vae_from_pipeline_folder_uses_vae_subfolder(vae_dir, tmp_path):
    pipeline = tmp_path / "sd-pipeline"
    (pipeline / "unet").mkdir(parents=True)
    tiny_vae().save_pretrained(pipeline / "vae")
    vae = load_vae(pipeline)
    assert vae.config.latent_channels == 4


def test_missing_weights_offline_say_how_to_provide_them(tmp_path):
    with pytest.raises(VAENotFoundError) as err:
        load_vae("nobody/no-such-vae", local_files_only=True)
    message = str(err.value)
    assert "huggingface-cli download nobody/no-such-vae --local-dir" in message and "--vae" in message
    with pytest.raises(VAENotFoundError, match="config.json"):
        load_vae(tmp_path)  # an existing folder without a model
    with pytest.raises(VAENotFoundError, match="hub id"):
        load_vae(str(tmp_path / "not-there"))


# ------------------------------------------------------------------------------------------ extraction
def test_extraction_stores_moments_of_plain_and_flipped_images(full_run, images_dir, vae_dir):
    m = json.loads((full_run / "manifest.json").read_text())
    assert m["count"] == m["num_valid"] == 39 and m["latent_shape"] == [4, 4, 4]
    assert m["scale"] == pytest.approx(0.18215) and m["scaled"] is True and m["vae"] == str(vae_dir)
    assert m["classes"] == ["apple", "banana", "cherry"] and m["storage_dtype"] == "float16"
    assert len(m["shards"]) == 3 and len(m["dataset"]["fingerprint"]) == 64
    assert not (full_run / "state.json").exists()
    assert np.load(full_run / "labels.npy").tolist() == [0] * 13 + [1] * 13 + [2] * 13
    mean = np.load(full_run / "mean-00001.npy")
    std = np.load(full_run / "std-00001.npy")
    assert mean.shape == std.shape == (16, 2, 4, 4, 4) and mean.dtype == np.float16
    # image 20 (shard 1, row 4): the stored moments are the VAE's, times 0.18215, for both views
    vae = load_vae(vae_dir)
    x, _ = ImageFolderDataset(images_dir, SIZE, flip=False).load(20)
    ref_mean, ref_std = encode_moments(vae, torch.stack([x, x.flip(-1)]))
    np.testing.assert_allclose(mean[4], ref_mean.numpy(), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(std[4], ref_std.numpy(), rtol=2e-3, atol=1e-4)
    # the VAE is not mirror symmetric: the flipped image's latent is not the flipped latent
    assert not np.allclose(mean[4, 1], mean[4, 0][..., ::-1], atol=1e-2)


def test_interrupted_extraction_resumes_bit_for_bit(full_run, images_dir, vae_dir, tmp_path, monkeypatch):
    out = tmp_path / "resumed"
    # 1) stop after 3 batches (inside shard 0)
    first = extract_latents(images_dir, out, vae=str(vae_dir), max_batches=3, **KW)
    assert not first["complete"] and first["done"] == 12
    # 2) crash in the middle of shard 1 (an exception from the encoder, as a kill would leave it)
    calls = {"n": 0}
    real = extraction.encode_moments

    def crashing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("power cut (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(extraction, "encode_moments", crashing)
    with pytest.raises(RuntimeError, match="power cut"):
        extract_latents(images_dir, out, vae=str(vae_dir), **KW)
    monkeypatch.undo()
    state = json.loads((out / "state.json").read_text())
    assert state["done"] == 24 and [s["index"] for s in state["shards"]] == [0]
    assert (out / "mean-00001.npy.partial").exists() and not (out / "manifest.json").exists()
    with pytest.raises(LatentFormatError, match="unfinished"):
        LatentDataset(out)
    # 3) resume to the end: every file equals the uninterrupted run, byte for byte
    done = extract_latents(images_dir, out, vae=str(vae_dir), **KW)
    assert done["complete"]
    assert _files(out) == _files(full_run)
    full = json.loads((full_run / "manifest.json").read_text())
    assert done["shards"] == full["shards"]
    assert verify(out) == []
    # 4) running again is a no-op; other settings are refused unless --overwrite
    again = extract_latents(images_dir, out, vae=str(vae_dir), **KW)
    assert again["complete"] and again["finished"] == done["finished"]
    with pytest.raises(LatentFormatError, match="other settings"):
        extract_latents(images_dir, out, vae=str(vae_dir), **{**KW, "image_size": 16})


def test_crash_between_shard_rename_and_state_write_resumes(full_run, images_dir, vae_dir, tmp_path, monkeypatch):
    out = tmp_path / "renamed"
    real = extraction._finish_shard

    def finish_then_die(out_dir, shard):
        real(out_dir, shard)  # the shard is renamed into place ...
        raise KeyboardInterrupt  # ... and the process dies before state.json records it

    monkeypatch.setattr(extraction, "_finish_shard", finish_then_die)
    with pytest.raises(KeyboardInterrupt):
        extract_latents(images_dir, out, vae=str(vae_dir), **KW)
    monkeypatch.undo()
    assert (out / "mean-00000.npy").exists() and json.loads((out / "state.json").read_text())["shards"] == []
    assert extract_latents(images_dir, out, vae=str(vae_dir), **KW)["complete"]
    assert _files(out) == _files(full_run)


def test_resume_follows_a_moved_dataset_but_refuses_a_changed_one(images_dir, vae_dir, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(images_dir, data)
    out = tmp_path / "lat"
    assert not extract_latents(data, out, vae=str(vae_dir), max_batches=2, **KW)["complete"]
    moved = tmp_path / "moved"
    data.rename(moved)
    assert not extract_latents(moved, out, vae=str(vae_dir), max_batches=1, **KW)["complete"]
    shutil.copy(moved / "train" / "apple" / "00.jpg", moved / "train" / "apple" / "99.jpg")
    with pytest.raises(LatentFormatError, match="fingerprint"):
        extract_latents(moved, out, vae=str(vae_dir), **KW)


def test_verify_catches_a_corrupted_shard(full_run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(full_run, copy)
    assert verify(copy) == []
    shard = copy / "mean-00001.npy"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the data
    shard.write_bytes(bytes(data))
    problems = verify(copy)
    assert len(problems) == 1 and "mean-00001.npy" in problems[0] and "checksum" in problems[0]
    # a truncated shard is caught even without checksums
    std = copy / "std-00002.npy"
    std.write_bytes(std.read_bytes()[:-100])
    assert any("std-00002.npy" in p for p in verify(copy, checksums=False))
    (copy / "labels.npy").unlink()
    assert any("labels.npy is missing" in p for p in verify(copy))
    assert "no latents" in verify(tmp_path / "nothing")[0]


def test_extraction_skips_undecodable_images(images_dir, vae_dir, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(images_dir, data)
    planted = plant_bad_files(data, size=SIZE)
    out = tmp_path / "lat"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = extract_latents(data, out, vae=str(vae_dir), **KW)
    with pytest.warns(UserWarning, match="zero-byte"):
        images = ImageFolderDataset(data, SIZE)
    broken = {p for p, k in planted.items() if k in ("truncated", "not-an-image")}
    assert {images.samples[i][0] for i in m["skipped"]} == broken
    assert m["num_valid"] == m["count"] - 2 == len(images) - 2
    ds = LatentDataset(out)
    assert len(ds) == m["num_valid"] and verify(out) == []


# ------------------------------------------------------------------------------------------ reading
def test_latent_dataset_draws_fresh_latents_and_random_flips(full_run):
    ds = LatentDataset(full_run)
    assert len(ds) == 39 and ds.num_classes == 3 and ds.classes == ["apple", "banana", "cherry"]
    assert ds.latent_shape == ds.sample_shape == (4, 4, 4) and ds.scale == pytest.approx(0.18215)
    mean0, std0 = ds.moments(20, 0)
    mean1, _ = ds.moments(20, 1)
    # mean only, no flip: exactly the stored plain mean
    z, y = LatentDataset(full_run, flip=False, sample=False)[20]
    assert torch.equal(z, mean0) and y == 1 and z.dtype == torch.float32
    # a fresh draw every access, distributed as mean + std * N(0, 1)
    fixed = LatentDataset(full_run, flip=False)
    draws = torch.stack([fixed[20][0] for _ in range(400)])
    assert not torch.equal(draws[0], draws[1])
    assert torch.allclose(draws.mean(0), mean0, atol=5 * std0.max().item() / 20 + 1e-3)
    assert torch.allclose(draws.std(0), std0, rtol=0.2)
    # random flips pick the plain or the mirrored image's moments
    flipping = LatentDataset(full_run, sample=False)
    views = []
    for _ in range(30):
        z = flipping[20][0]
        views.append(0 if torch.equal(z, mean0) else 1 if torch.equal(z, mean1) else -1)
    assert set(views) == {0, 1}


def test_latent_dataset_in_dataloader_workers(full_run):
    loader = torch.utils.data.DataLoader(LatentDataset(full_run), batch_size=8, shuffle=True, num_workers=2)
    labels = []
    for z, y in loader:
        assert z.shape[1:] == (4, 4, 4) and torch.isfinite(z).all()
        labels += y.tolist()
    assert sorted(labels) == [0] * 13 + [1] * 13 + [2] * 13


def test_open_dataset_picks_latents_or_pixels(full_run, images_dir):
    assert isinstance(open_dataset(full_run), LatentDataset)
    pixels = open_dataset(images_dir, image_size=SIZE)
    assert isinstance(pixels, ImageFolderDataset) and pixels.sample_shape == (3, SIZE, SIZE)
    with pytest.raises(ValueError, match="image_size"):
        open_dataset(images_dir)
    with pytest.raises(LatentFormatError, match="dit-extract-latents"):
        LatentDataset(images_dir)


def test_reduced_precision_encoding_error_is_small(vae_dir, images_dir):
    vae = load_vae(vae_dir)
    ds = ImageFolderDataset(images_dir, SIZE, flip=False)
    x = torch.stack([ds.load(i)[0] for i in range(0, 39, 3)])
    errors = dit_vae.compare_precisions(vae, x)
    assert errors["fp16"]["rel_rms"] < 0.01 and errors["bf16"]["rel_rms"] < 0.05
    assert errors["fp16"]["rel_rms"] < errors["bf16"]["rel_rms"]  # 10 vs 7 mantissa bits


# ------------------------------------------------------------------------------------------ the command
def test_dit_extract_latents_cli(images_dir, vae_dir, tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["--data-path", str(images_dir), "--features-path", str(out), "--vae", str(vae_dir),
            "--image-size", str(SIZE), "--batch-size", "8", "--num-workers", "0", "--precision", "bf16"]
    assert dit_extract(argv + ["--max-batches", "2"]) == 0
    assert "resume" in capsys.readouterr().out
    assert dit_extract(argv + ["--verify"]) == 0
    printed = capsys.readouterr().out
    assert "latents of 39 images" in printed and "is sound" in printed
    assert json.loads((out / "manifest.json").read_text())["precision"] == "bf16"
    shard = out / "std-00000.npy"
    shard.write_bytes(shard.read_bytes()[:-8] + b"\x00" * 8)
    assert dit_extract(["--out", str(out), "--verify"]) == 1
    assert "std-00000.npy" in capsys.readouterr().err


def test_dtype_is_an_alias_of_precision(images_dir, vae_dir, tmp_path):
    kw = {**KW, "precision": None}
    state = extract_latents(images_dir, tmp_path / "a", vae=str(vae_dir), dtype=torch.bfloat16, max_batches=1, **kw)
    assert state["precision"] == "bf16" and not state["complete"]
    with pytest.raises(ValueError, match="dtype"):
        extract_latents(images_dir, tmp_path / "b", vae=str(vae_dir), dtype=torch.int8, **kw)
