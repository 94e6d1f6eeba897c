"""The exact denoiser of chapter 04: a closed-form model checked against the sampling loops."""

import torch

from dit_core import create_diffusion
from dit_core.diffusion.toy import ExactDenoiser


def test_single_point_is_recovered_exactly():
    point = torch.randn(1, 1, 4, 4)
    base = create_diffusion("")
    model = ExactDenoiser(point, base.alphas_cumprod)
    x0 = point.expand(3, -1, -1, -1)
    t = torch.tensor([10, 500, 990])
    noise = torch.randn_like(x0)
    xt = base.q_sample(x0, t, noise)
    # with one data point the posterior is certain, so the predicted noise is the true noise
    torch.testing.assert_close(model(xt, t), noise, rtol=1e-4, atol=1e-4)


def test_conditional_sampling_returns_points_of_the_class():
    g = torch.Generator().manual_seed(0)
    points = torch.rand(6, 1, 4, 4, generator=g) * 2 - 1
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    diffusion = create_diffusion("ddim50", learn_sigma=False)
    model = ExactDenoiser(points, create_diffusion("").alphas_cumprod, labels=labels, num_classes=3)
    y = torch.tensor([0, 1, 2, 1])
    noise = torch.randn(4, 1, 4, 4, generator=g)
    out = diffusion.ddim_sample_loop(model, noise.shape, noise=noise, model_kwargs=dict(y=y), clip_denoised=False)
    nearest = torch.cdist(out.flatten(1), points.flatten(1)).argmin(dim=1)
    assert torch.equal(labels[nearest], y)
    assert torch.cdist(out.flatten(1), points.flatten(1)).min(dim=1).values.max() < 0.05


def test_learned_sigma_output_has_2c_channels():
    base = create_diffusion("")
    model = ExactDenoiser(torch.zeros(2, 3, 4, 4), base.alphas_cumprod, learn_sigma=True)
    x = torch.randn(2, 3, 4, 4)
    out = model(x, torch.tensor([3, 4]))
    assert out.shape == (2, 6, 4, 4) and torch.count_nonzero(out[:, 3:]) == 0
    losses = base.training_losses(model, torch.zeros(2, 3, 4, 4), torch.tensor([3, 900]))
    torch.testing.assert_close(losses["mse"], torch.zeros(2), atol=1e-8, rtol=0)
