"""The checkers of the book's "implement it" exercises (dit_book.exercises) accept a right solution and
name the part of a wrong one. The right solutions here are the ones chapters 3, 4 and 7 show."""

from __future__ import annotations

import math

import pytest
import torch

from dit_book.exercises import check_ddim_step, check_guidance, check_patchify


def patchify(x, p):
    n, c, h, w = x.shape
    x = x.reshape(n, c, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(n, (h // p) * (w // p), p * p * c)


def unpatchify(tokens, p, c):
    n, t, _ = tokens.shape
    g = math.isqrt(t)
    x = tokens.reshape(n, g, g, p, p, c)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(n, c, g * p, g * p)


def ddim_step(x_t, eps, alpha_bar_t, alpha_bar_prev):
    x0 = (x_t - math.sqrt(1 - alpha_bar_t) * eps) / math.sqrt(alpha_bar_t)
    return math.sqrt(alpha_bar_prev) * x0 + math.sqrt(1 - alpha_bar_prev) * eps


def guided(model, cfg_scale):
    def model_fn(x, t, y):
        cond = model(x, t, y)
        uncond = model(x, t, torch.full_like(y, model.num_classes))
        c = model.in_channels
        eps = uncond[:, :c] + cfg_scale * (cond[:, :c] - uncond[:, :c])
        return torch.cat([eps, cond[:, c:]], dim=1)
    return model_fn


def test_right_solutions_pass():
    assert "match dit_core" in check_patchify(patchify, unpatchify)
    assert "ddim_sample_loop over 50 steps" in check_ddim_step(ddim_step)
    assert "forward_with_cfg" in check_guidance(guided)


def test_patchify_in_channel_first_order_is_caught():
    def channel_first(x, p):  # (c, p, q) inside a token: the convolution's order, not DiT's
        n, c, h, w = x.shape
        return x.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(n, -1, c * p * p)

    with pytest.raises(AssertionError, match="not in DiT's order"):
        check_patchify(channel_first, unpatchify)


def test_a_wrong_shape_and_a_wrong_unpatchify_are_caught():
    with pytest.raises(AssertionError, match="has shape"):
        check_patchify(lambda x, p: x.flatten(1), unpatchify)
    with pytest.raises(AssertionError, match="does not invert"):
        check_patchify(patchify, lambda tokens, p, c: unpatchify(tokens, p, c).transpose(2, 3))


def test_ddim_step_with_the_wrong_alpha_is_caught():
    def off_by_one(x_t, eps, alpha_bar_t, alpha_bar_prev):  # uses alpha_bar_prev for the x0 estimate
        return ddim_step(x_t, eps, alpha_bar_prev if alpha_bar_prev < 1 else alpha_bar_t, alpha_bar_prev)

    with pytest.raises(AssertionError, match=r"one step at t = 981 \(code index 980"):
        check_ddim_step(off_by_one)


def test_ddim_step_with_noise_is_caught():
    def ddpm_like(x_t, eps, alpha_bar_t, alpha_bar_prev):
        return ddim_step(x_t, eps, alpha_bar_t, alpha_bar_prev) + 0.01 * torch.randn_like(x_t)

    with pytest.raises(AssertionError, match="one step"):
        check_ddim_step(ddpm_like)


def test_guidance_mistakes_are_caught():
    def reversed_rule(model, s):  # eps_y + s (eps_y - eps_null)
        fn = guided(model, s)
        return lambda x, t, y: 2 * model(x, t, y) - fn(x, t, y) if s != 1.0 else fn(x, t, y)

    with pytest.raises(AssertionError, match="noise channels at scale 1.5"):
        check_guidance(reversed_rule)

    def guides_variance(model, s):
        def fn(x, t, y):
            cond, uncond = model(x, t, y), model(x, t, torch.full_like(y, model.num_classes))
            return uncond + s * (cond - uncond)
        return fn

    with pytest.raises(AssertionError, match="variance channels at scale 1.5"):
        check_guidance(guides_variance)
    with pytest.raises(AssertionError, match="has shape"):
        check_guidance(lambda model, s: (lambda x, t, y: guided(model, s)(x, t, y)[:, :4]))
