"""Loading official-format checkpoints: safe unpickling, configuration inference, EMA preference, clear errors,
and outputs equal to an independent reference forward pass."""

from __future__ import annotations

import argparse
import os
import pickle

import pytest
import torch

from dit_core import load_dit
from dit_core.checkpoint import CheckpointError, atomic_save, infer_config

from official_layout import REFERENCE, official_shapes, published_layout, random_state_dict
from shared_reference import skip_reason
from reference_dit import reference_forward

SMALL = dict(hidden=64, depth=2, patch=2, in_channels=4, grid=4, num_classes=10)


def small_official(seed=0):
    return random_state_dict(official_shapes(**SMALL), seed=seed)


def _inputs(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, 8, 8, generator=g), torch.randint(0, 1000, (n,), generator=g), torch.tensor([0, 3, 10])


def test_bare_official_state_dict_gives_reference_outputs(tmp_path):
    sd = small_official()
    torch.save(sd, tmp_path / "DiT-small.pt")
    model = load_dit(tmp_path / "DiT-small.pt", num_heads=4)
    assert not model.training
    assert model.config() == dict(input_size=8, patch_size=2, in_channels=4, hidden_size=64, depth=2, num_heads=4,
                                  mlp_ratio=4.0, class_dropout_prob=0.1, num_classes=10, learn_sigma=True,
                                  block="adaln-zero")
    x, t, y = _inputs()
    ref = reference_forward(sd, x, t, y, num_heads=4, patch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x, t, y).double(), ref, rtol=1e-5, atol=1e-5)
    assert not model.pos_embed.requires_grad
    assert all(p.requires_grad for n, p in model.named_parameters() if n != "pos_embed")


def test_training_dict_prefers_ema_and_allows_official_args(tmp_path):
    model_sd, ema_sd = small_official(0), small_official(1)
    args = argparse.Namespace(model="DiT-small", image_size=64, num_classes=10, global_batch_size=256)
    torch.save({"model": model_sd, "ema": ema_sd, "opt": {"state": {}, "param_groups": []}, "args": args},
               tmp_path / "0400000.pt")
    x, t, y = _inputs()
    ema = load_dit(tmp_path / "0400000.pt", num_heads=4)
    raw = load_dit(tmp_path / "0400000.pt", num_heads=4, prefer_ema=False)
    with torch.no_grad():
        torch.testing.assert_close(ema(x, t, y).double(), reference_forward(ema_sd, x, t, y, 4, 2), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(raw(x, t, y).double(), reference_forward(model_sd, x, t, y, 4, 2), rtol=1e-5, atol=1e-5)
    assert ema.checkpoint_meta["weights"] == "ema" and ema.checkpoint_meta["global_batch_size"] == 256


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/dit_core_pwned",))


def test_arbitrary_pickles_are_refused(tmp_path):
    marker = "/tmp/dit_core_pwned"
    if os.path.exists(marker):
        os.unlink(marker)
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"model": small_official(), "payload": _Exploit()}, f)
    with pytest.raises(CheckpointError, match="safely"):
        load_dit(path)
    assert not os.path.exists(marker)


def test_wrong_size_names_the_mismatch(tmp_path):
    torch.save(small_official(), tmp_path / "ckpt.pt")
    with pytest.raises(CheckpointError, match=r"y_embedder\.embedding_table\.weight: checkpoint \(11, 64\) vs model \(6, 64\)"):
        load_dit(tmp_path / "ckpt.pt", num_classes=5)
    with pytest.raises(CheckpointError, match=r"missing from the checkpoint, e\.g\. \['blocks\.2\."):
        load_dit(tmp_path / "ckpt.pt", depth=3)
    with pytest.raises(TypeError, match="unknown DiT argument"):
        load_dit(tmp_path / "ckpt.pt", hidden=3)


def test_not_a_dit_and_truncated_and_missing(tmp_path):
    torch.save({"weight": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a DiT state dict"):
        load_dit(tmp_path / "other.pt")
    torch.save(small_official(), tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_dit(tmp_path / "cut.pt")
    with pytest.raises(FileNotFoundError, match="DiT-XL-2-256x256.pt"):
        load_dit(tmp_path / "DiT-XL-2-256x256.pt")


def test_wrapper_prefixes_and_safetensors(tmp_path):
    from safetensors.torch import save_file

    sd = small_official()
    torch.save({"model": {"module._orig_mod." + k: v for k, v in sd.items()}}, tmp_path / "ddp.pt")
    save_file(sd, str(tmp_path / "w.safetensors"))
    x, t, y = _inputs()
    ref = reference_forward(sd, x, t, y, 4, 2)
    for name in ("ddp.pt", "w.safetensors"):
        with torch.no_grad():
            torch.testing.assert_close(load_dit(tmp_path / name, num_heads=4)(x, t, y).double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("entry,size", [("DiT-XL/2 256px", 32), ("DiT-XL/2 512px", 64)])
def test_infer_config_of_the_released_checkpoints(entry, size):
    layout = published_layout()
    if layout is None:
        pytest.skip(skip_reason(REFERENCE))
    keys = layout[entry]["keys_outside_blocks_and_block_0"]
    state = {k: torch.empty(v, device="meta") for k, v in keys.items() if not k.startswith("blocks.0.")}
    for i in range(28):
        state.update({k.replace("blocks.0.", f"blocks.{i}."): torch.empty(v, device="meta")
                      for k, v in keys.items() if k.startswith("blocks.0.")})
    assert infer_config(state) == dict(input_size=size, patch_size=2, in_channels=4, hidden_size=1152, depth=28,
                                       num_heads=16, mlp_ratio=4.0, class_dropout_prob=0.1, num_classes=1000,
                                       learn_sigma=True, block="adaln-zero")


def test_atomic_save_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    atomic_save({"step": 1}, path)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_save({"step": 2}, path)
    assert torch.load(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary left behind


def test_loaded_checkpoint_gives_reference_losses_and_samples(tmp_path):
    """Losses and samples of a loaded official-format checkpoint equal those of the independent reference
    forward pass driven through the same diffusion, to fp32 round-off."""
    from dit_core import create_diffusion

    sd = small_official(3)
    torch.save(sd, tmp_path / "ckpt.pt")
    model = load_dit(tmp_path / "ckpt.pt", num_heads=4)

    def reference(x, t, y):
        return reference_forward(sd, x, t, y, num_heads=4, patch=2).float()

    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(3, 4, 8, 8, generator=g)
    t = torch.tensor([0, 400, 999])
    y = torch.tensor([1, 2, 10])
    noise = torch.randn(3, 4, 8, 8, generator=g)
    diffusion = create_diffusion("")
    with torch.no_grad():
        ours = diffusion.training_losses(model, x0, t, dict(y=y), noise=noise)
        ref = diffusion.training_losses(reference, x0, t, dict(y=y), noise=noise)
    for key in ("loss", "mse", "vb"):
        torch.testing.assert_close(ours[key], ref[key], rtol=1e-5, atol=1e-6)

    for respacing, loop in (("10", "p_sample_loop"), ("ddim10", "ddim_sample_loop")):
        sampler = create_diffusion(respacing)
        outs = []
        for fn in (model, reference):
            torch.manual_seed(1)
            with torch.no_grad():
                outs.append(getattr(sampler, loop)(fn, noise.shape, noise=noise, model_kwargs=dict(y=y),
                                                   clip_denoised=False))
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    from dit_core.atomic import atomic_write, atomic_write_text

    path = atomic_write_text(tmp_path / "run" / "config.yaml", "old\n")

    def broken(f):
        f.write(b"half of the new")
        raise KeyboardInterrupt  # a kill in the middle of writing

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, broken)
    assert path.read_text() == "old\n" and sorted(p.name for p in path.parent.iterdir()) == ["config.yaml"]
