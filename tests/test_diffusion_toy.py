"""The exact denoiser of chapter 04: a closed-form model checked against the sampling loops."""

import torch

from dit_core import create_diffusion
from dit_book.toy import ExactDenoiser


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


def test_learned_sigma_channels_choose_the_geometric_mean_variance():
    """The denoiser's zero variance channels mean v = 0.5 in Improved DDPM's eq. 15: log Sigma halfway between
    log beta_t and log beta_tilde_t, which is what a respaced learned-sigma sampler then uses."""
    point = torch.randn(1, 3, 4, 4)
    for respacing in ("", "50"):
        diffusion = create_diffusion(respacing)
        model = ExactDenoiser(point, create_diffusion("").alphas_cumprod, learn_sigma=True)
        t = torch.tensor([3, diffusion.num_timesteps // 2, diffusion.num_timesteps - 1])
        out = diffusion.p_mean_variance(model, torch.randn(3, 3, 4, 4), t, clip_denoised=False)
        betas, tilde = torch.tensor(diffusion.betas), torch.tensor(diffusion.posterior_log_variance_clipped)
        expected = (0.5 * (betas.log() + tilde))[t].float()
        torch.testing.assert_close(out["log_variance"], expected[:, None, None, None].expand(3, 3, 4, 4))
        # and its x_0 prediction is the one point, exactly enough to recover it
        torch.testing.assert_close(out["pred_xstart"], point.expand(3, -1, -1, -1), atol=1e-4, rtol=1e-4)
