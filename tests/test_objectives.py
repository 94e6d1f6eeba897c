"""The pieces of the faster-converging objectives, one at a time: the linear interpolant and its samplers, the
timestep draws, min-SNR weights, the masked and token-capturing forward pass, the loss terms, the teachers."""

from __future__ import annotations

import math

import pytest
import torch

from dit_core.alignment import TrainingHeads, TrainingModel, patchify
from dit_core.diffusion import SAMPLERS, create_diffusion, create_process, sampler_objective
from dit_core.diffusion.flow import FLOW_SAMPLERS, LinearInterpolant, sample_flow
from dit_core.models import DiT
from dit_core.teachers import DinoV2, dinov2_config, load_dinov2, TeacherNotFoundError, token_features
from dit_core.train.objectives import (ObjectiveOptions, alignment_loss, ddpm_steps, kept_tokens,
                                       mae_loss, min_snr_weight, objective_draws)


def tiny_dit(**kw):
    torch.manual_seed(0)
    model = DiT(**{**dict(input_size=8, patch_size=2, in_channels=1, hidden_size=32, depth=3, num_heads=2,
                          num_classes=3), **kw})
    for p in model.parameters():  # adaLN-Zero starts every block as the identity: perturb it to test something
        p.data.add_(0.05 * torch.randn_like(p))
    return model.eval()  # as the trainer holds it: labels are dropped by the step, not by the model


# ----------------------------------------------------------------------------------------------------------
# The linear interpolant and its samplers
# ----------------------------------------------------------------------------------------------------------


def test_the_path_its_velocity_and_both_ends():
    flow = LinearInterpolant()
    x0, eps = torch.randn(5, 2, 3, 3), torch.randn(5, 2, 3, 3)
    t = torch.rand(5)
    x_t = flow.path(x0, eps, t)
    v = flow.velocity_target(x0, eps)
    tt = t.reshape(-1, 1, 1, 1)
    torch.testing.assert_close(x_t - tt * v, x0)  # x_0 = x_t - t v
    torch.testing.assert_close(x_t + (1 - tt) * v, eps)  # eps = x_t + (1 - t) v
    h = 1e-3  # the target is the time derivative of the path
    torch.testing.assert_close((flow.path(x0, eps, t + h) - flow.path(x0, eps, t - h)) / (2 * h), v, atol=1e-3, rtol=0)
    assert torch.equal(flow.path(x0, eps, torch.zeros(5)), x0) and torch.equal(flow.path(x0, eps, torch.ones(5)), eps)
    assert torch.equal(flow.model_time(torch.tensor([0.25])), torch.tensor([250.0]))


@pytest.mark.parametrize("sampler", FLOW_SAMPLERS)
def test_a_network_that_always_answers_one_image_is_sampled_to_that_image(sampler):
    """Every sampler follows the velocity towards one image, (x_t - x_0) / t, to that image (the last interval
    lands on it)."""
    image = torch.randn(3, 2, 4, 4)
    x = torch.randn(3, 2, 4, 4)
    out = sample_flow(lambda xx, t: (xx - image) / t.reshape(-1, 1, 1, 1), x, sampler=sampler, steps=7)
    torch.testing.assert_close(out, image, atol=1e-5, rtol=0)


def gaussian_velocity(mu: float, sigma: float):
    """The exact velocity E[eps - x0 | x_t] when the data are N(mu, sigma^2) (scalars, any shape)."""

    def v(x, t):
        t = t.reshape(-1, *([1] * (x.dim() - 1)))
        var = (1 - t) ** 2 * sigma**2 + t**2
        centred = x - (1 - t) * mu
        return t / var * centred - (mu + (1 - t) * sigma**2 / var * centred)

    return v


@pytest.mark.parametrize("sampler, steps", [("euler", 200), ("heun", 20), ("euler-maruyama", 400)])
def test_every_sampler_turns_noise_into_the_data_distribution(sampler, steps):
    """With the exact velocity of Gaussian data, the ODE and SDE samplers land on that Gaussian (samples of 256
    numbers)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 256, generator=g)
    out = sample_flow(gaussian_velocity(1.5, 0.5), x, sampler=sampler, steps=steps,
                      noise=lambda shape: torch.randn((80, *shape), generator=g))
    assert out.mean().item() == pytest.approx(1.5, abs=0.02)
    assert out.std().item() == pytest.approx(0.5, abs=0.02)


def test_euler_is_ddim_and_ddpm_samplers_are_refused():
    """One Euler step predicts x0 and eps from v and re-noises to the next time: DDIM's step for this path."""
    velocity = lambda x, t: 0.3 * x + 0.1  # noqa: E731 - any velocity
    x = torch.randn(4, 2)
    seen = []
    assert sampler_objective("ddim", "flow") == "euler"
    out = sample_flow(velocity, x.clone(), sampler="euler", steps=4, callback=seen.append)
    y = x.clone()
    for t, s in zip([1.0, 0.75, 0.5, 0.25], [0.75, 0.5, 0.25, 0.0]):
        tt = torch.full((4,), t)
        v = velocity(y, tt)
        y = (1 - s) * (y - t * v) + s * (y + (1 - t) * v)  # x_0 and eps from v, re-noised to s
    torch.testing.assert_close(out, y)
    assert [i["t"] for i in seen] == [0.75, 0.5, 0.25, 0.0]
    assert set(FLOW_SAMPLERS) == {name for name, (kind, _) in SAMPLERS.items() if kind == "flow"}
    for name in ("ddpm", "dpm-solver++"):
        with pytest.raises(ValueError, match="objective 'flow': use one of ddim, euler, heun, euler-maruyama"):
            sampler_objective(name, "flow")
        with pytest.raises(ValueError, match="not a sampler of the linear interpolant.*euler, heun"):
            sample_flow(velocity, x, sampler=name)
    with pytest.raises(ValueError, match="learn_sigma=False"):
        create_process("flow", learn_sigma=True)
    assert isinstance(create_process("flow", learn_sigma=False), LinearInterpolant)


# ----------------------------------------------------------------------------------------------------------
# Timesteps and weights
# ----------------------------------------------------------------------------------------------------------


def test_timestep_draws_are_logit_normal_and_map_to_ddpm_steps():
    options = ObjectiveOptions(timestep_sampling="logit_normal", logit_mean=0.5, logit_std=0.8)
    u = objective_draws(0, 3, 50000, 16, options).u
    n = torch.log(u / (1 - u))
    assert n.mean().item() == pytest.approx(0.5, abs=0.02) and n.std().item() == pytest.approx(0.8, abs=0.02)
    assert torch.equal(u, objective_draws(0, 3, 50000, 16, options).u)  # a function of (seed, step)
    assert not torch.equal(u, objective_draws(0, 4, 50000, 16, options).u)
    uniform = objective_draws(0, 3, 50000, 16, ObjectiveOptions()).u
    steps = ddpm_steps(uniform, 1000)
    assert steps.min() == 0 and steps.max() == 999 and steps.float().mean().item() == pytest.approx(499.5, abs=5)
    assert torch.equal(ddpm_steps(torch.tensor([0.0, 0.0015, 0.9999, 1.0]), 1000), torch.tensor([0, 1, 999, 999]))


def test_masks_keep_a_random_subset_per_example():
    d = objective_draws(1, 0, 64, 16, ObjectiveOptions(mask_ratio=0.5))
    assert d.keep.shape == (64, 8) and kept_tokens(16, 0.75) == 4 and kept_tokens(4, 0.9) == 1
    assert all(len(set(row.tolist())) == 8 and row.tolist() == sorted(row.tolist()) for row in d.keep)
    assert len({tuple(row.tolist()) for row in d.keep}) > 50  # different per example
    assert objective_draws(1, 0, 64, 16, ObjectiveOptions(mask_ratio=0.5), masked=False).keep is None


def test_min_snr_weights():
    snr = torch.tensor([0.01, 1.0, 5.0, 20.0, 1e4])
    torch.testing.assert_close(min_snr_weight(snr, 5.0, "eps"), torch.tensor([1.0, 1.0, 1.0, 0.25, 5e-4]))
    # velocity of the linear interpolant: the x0-weight min(SNR, g) times t^2
    t = torch.tensor([0.05, 0.2, 0.5, 0.8, 0.99])
    flow_snr = LinearInterpolant.snr(t)
    torch.testing.assert_close(min_snr_weight(flow_snr, 5.0, "velocity"), torch.clamp(flow_snr, max=5.0) * t**2)
    with pytest.raises(ValueError, match="eps.*velocity"):
        min_snr_weight(snr, 5.0, "x0")


# ----------------------------------------------------------------------------------------------------------
# The forward pass with masking and token capture
# ----------------------------------------------------------------------------------------------------------


def test_capturing_tokens_leaves_the_dits_output_bit_for_bit():
    model = tiny_dit()
    x, t, y = torch.randn(4, 1, 8, 8), torch.tensor([1, 50, 500, 999]), torch.tensor([0, 1, 2, 3])
    plain = model(x, t, y)
    model.set_grad_checkpointing(True)
    out, captured = model(x, t, y, capture=2)
    assert torch.equal(out, plain) and captured.shape == (4, 16, 32)
    tokens = model.x_embedder(x) + model.pos_embed  # the tokens after block 2, by hand
    c = model.t_embedder(t) + model.y_embedder(y, False)
    torch.testing.assert_close(captured, model.blocks[1](model.blocks[0](tokens, c), c), rtol=0, atol=1e-6)
    heads = TrainingHeads(32, mask=True)
    every = torch.arange(16).expand(4, -1)  # keeping every token: the mask tokens are never used
    torch.testing.assert_close(TrainingModel(model, heads, decoder_depth=1)(x, t, y, keep=every)[0], model(x, t, y),
                               rtol=0, atol=1e-6)


def test_masked_encoder_never_sees_the_dropped_patches():
    model = tiny_dit()
    heads = TrainingHeads(32, mask=True)
    net = TrainingModel(model, heads, decoder_depth=1)
    x, t, y = torch.randn(2, 1, 8, 8), torch.tensor([10, 700]), torch.tensor([1, 2])
    keep = torch.tensor([[0, 3, 5, 6, 9, 10, 12, 15], [1, 2, 4, 7, 8, 11, 13, 14]])
    out, captured = net(x, t, y, keep=keep, capture=1)
    assert captured is None  # no projector: nothing to return
    dropped = torch.ones(2, 16).scatter_(1, keep, 0.0)
    tokens = patchify(x, 2)
    changed = torch.where(dropped.bool()[..., None], torch.randn_like(tokens), tokens)
    x2 = tiny_dit(learn_sigma=False).unpatchify(changed)  # C_out = C_in: unpatchify inverts patchify
    assert torch.equal(patchify(x2, 2), changed)
    assert torch.equal(net(x2, t, y, keep=keep)[0], out)  # the dropped pixels changed, the output did not
    assert not torch.equal(model(x2, t, y), model(x, t, y))  # (they do matter unmasked)


def test_patchify_inverts_unpatchify_and_token_losses():
    model = tiny_dit(learn_sigma=False)
    tokens = torch.randn(3, 16, 4)
    assert torch.equal(patchify(model.unpatchify(tokens), 2), tokens)
    a = torch.randn(3, 10, 7)
    assert torch.allclose(alignment_loss(a, 2 * a), torch.full((3,), -1.0))
    assert torch.allclose(alignment_loss(a, -a), torch.full((3,), 1.0))
    # MaskDiT's reconstruction loss counts the masked tokens only, against per-patch normalised targets
    x, pred = torch.randn(2, 1, 8, 8), torch.randn(2, 1, 8, 8)
    masked = torch.zeros(2, 16)
    masked[:, :3] = 1
    target = patchify(x, 2)
    target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6).sqrt()
    expected = (patchify(pred, 2)[:, :3] - target[:, :3]).square().mean(dim=(1, 2))
    torch.testing.assert_close(mae_loss(pred, x, 2, masked), expected)


def test_dits_hybrid_loss_over_the_kept_tokens():
    """The masked objective reduces DiT's own loss maps over the kept tokens: with every token kept it is DiT's
    loss; with some, the mean of the per-token values of those."""
    from dit_core.train.objectives import token_mean

    diffusion = create_diffusion("", diffusion_steps=100)
    x0, noise = torch.rand(6, 1, 8, 8) * 2 - 1, torch.randn(6, 1, 8, 8)
    steps = torch.tensor([0, 1, 10, 50, 98, 99])
    output = torch.randn(6, 2, 8, 8)
    reference = diffusion.training_losses(lambda x, t: output, x0, steps, noise=noise)
    every = diffusion.training_losses(lambda x, t: output, x0, steps, noise=noise,
                                      reduce=lambda m: token_mean(m, 2, torch.ones(6, 16)))
    torch.testing.assert_close(every["mse"], reference["mse"], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(every["vb"], reference["vb"], rtol=1e-5, atol=1e-6)
    weights = torch.zeros(6, 16)
    weights[:, :4] = 1  # the first four tokens: the top-left 2 x 8 pixels are tokens 0-3
    some = diffusion.training_losses(lambda x, t: output, x0, steps, noise=noise,
                                     reduce=lambda m: token_mean(m, 2, weights))
    err = (noise - output[:, :1]) ** 2
    torch.testing.assert_close(some["mse"], err[:, :, :2, :].mean(dim=(1, 2, 3)))


# ----------------------------------------------------------------------------------------------------------
# Teachers
# ----------------------------------------------------------------------------------------------------------


def tiny_dinov2():
    """A randomly initialised DINOv2 ViT of width 64 (one head), patch 14, a 5 x 5 position grid."""
    torch.manual_seed(1)
    model = DinoV2(dim=64, depth=2, heads=1, patch_size=14, pos_grid=5, image_size=56)
    for p in model.parameters():
        p.data.normal_(0, 0.1)
    return model.eval()


def test_dinov2_loads_a_released_layout_state_dict(tmp_path):
    original = tiny_dinov2()
    state = original.state_dict()
    assert {"cls_token", "pos_embed", "mask_token", "patch_embed.proj.weight", "blocks.1.attn.qkv.bias",
            "blocks.1.ls1.gamma", "blocks.1.mlp.fc2.weight", "norm.bias"} <= set(state)  # the released names
    torch.save(state, tmp_path / "dinov2_tiny.pth")
    assert dinov2_config(state) == dict(dim=64, depth=2, heads=1, patch_size=14, pos_grid=5, channels=3)
    model = load_dinov2(tmp_path / "dinov2_tiny.pth", image_size=56)
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    fmap = model.feature_map(images)
    assert fmap.shape == (2, 64, 4, 4) and torch.isfinite(fmap).all()
    assert torch.equal(fmap, original.feature_map(images))
    # the class token and patch tokens come after the final LayerNorm (x_norm_*tokens)
    cls, patches = model.forward_features(model.prepare(images))
    assert patches.shape == (2, 16, 64) and cls.shape == (2, 64)
    assert token_features(fmap, 2).shape == (2, 4, 64) and token_features(fmap, 8).shape == (2, 64, 64)
    torch.testing.assert_close(token_features(fmap, 2)[:, 0], fmap[:, :, :2, :2].mean(dim=(2, 3)))
    bad = dict(state)
    bad["register_tokens"] = torch.zeros(1, 4, 64)
    with pytest.raises(ValueError, match="registers"):
        dinov2_config(bad)


def test_dinov2_by_name_offline_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    with pytest.raises(TeacherNotFoundError, match=r"download=True.*dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/"
                                                   r"dinov2_vitb14_pretrain.pth"):
        load_dinov2("dinov2-vitb14")
    with pytest.raises(TeacherNotFoundError, match="neither a file nor one of"):
        load_dinov2("dino-b")


def test_min_snr_velocity_weight_is_the_x0_rule():
    """The docstring's derivation: on the x0 error, min-SNR weights min(SNR, gamma) whatever the parameterisation."""
    t = torch.tensor([0.1, 0.3, 0.7])
    flow = LinearInterpolant()
    x0, eps = torch.randn(3, 5), torch.randn(3, 5)
    v_err = torch.randn(3, 5)
    x_t = flow.path(x0, eps, t)
    v = flow.velocity_target(x0, eps)
    x0_err = (x_t - t[:, None] * (v + v_err)) - x0  # x_0 = x_t - t v
    weighted = min_snr_weight(flow.snr(t), 5.0, "velocity") * v_err.square().mean(1)
    torch.testing.assert_close(weighted, torch.clamp(flow.snr(t), max=5.0) * x0_err.square().mean(1))
    assert math.isclose(float(min_snr_weight(torch.tensor(4.0), 5.0, "velocity")), 4.0 / 9.0, rel_tol=1e-6)
