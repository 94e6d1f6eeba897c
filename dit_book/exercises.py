"""Checkers for the book's "implement it" exercises: the reader writes a piece of DiT, the checker compares it
with ``dit_core`` on random inputs and says which part differs.

* :func:`check_patchify` (chapter 3): patchify and unpatchify, against ``DiT.unpatchify`` and ``PatchEmbed``
  (the strided convolution is a linear layer applied to each patch);
* :func:`check_ddim_step` (chapter 4): one deterministic DDIM step (Song et al. 2021, eq. 12 with eta = 0),
  against ``GaussianDiffusion.ddim_sample``, step by step and over a whole 50-step loop;
* :func:`check_guidance` (chapter 7): the classifier-free guidance combination as a sampler's ``model_fn``
  (Ho & Salimans 2022; DiT Sec. 4), against ``DiT.forward_with_cfg``.

Each returns a one-line summary when everything matches and raises ``AssertionError`` naming the first check
that failed (with torch's report of the largest difference) otherwise. Example::

    from dit_book.exercises import check_guidance

    def my_guided(model, cfg_scale):
        ...
    print(check_guidance(my_guided))
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.testing import assert_close

#: fp32 round-off of a few small matrix products and of the DDIM update.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def _small_dit(input_size: int, patch_size: int, channels: int, learn_sigma: bool, seed: int):
    """A small DiT with random (non-zero) adaLN and final layers, so that its outputs carry information."""
    from dit_core.models import DiT

    torch.manual_seed(seed)
    model = DiT(input_size=input_size, patch_size=patch_size, in_channels=channels, hidden_size=32, depth=2,
                num_heads=2, num_classes=10, learn_sigma=learn_sigma).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adaLN" in name or "final_layer.linear" in name:
                p.normal_(0, 0.02)
    return model


def _expect(check: str, hint: str, actual, expected):
    try:
        assert_close(actual, expected, **TOLERANCE)
    except AssertionError as err:
        raise AssertionError(f"{check}: {hint}\n{err}") from None


def check_patchify(patchify: Callable, unpatchify: Callable, *, seed: int = 0) -> str:
    """Check ``patchify(x, p) -> (N, T, p*p*C)`` and ``unpatchify(tokens, p, channels) -> (N, C, H, W)``.

    The token order is DiT's: tokens row by row over the ``(H/p) x (W/p)`` grid, and inside a token the patch's
    values row by row, each pixel's ``C`` channels together (the ``(p, q, c)`` order of ``DiT.unpatchify``).
    """
    cases = ((2, 1, 8, 2), (3, 4, 8, 2), (2, 3, 16, 4))  # (batch, channels, size, patch)
    for n, c, size, p in cases:
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(n, c, size, size, generator=gen)
        model = _small_dit(size, p, c, learn_sigma=False, seed=seed)
        tokens = patchify(x, p)
        where = f"x of shape {tuple(x.shape)}, p = {p}"
        want = (n, (size // p) ** 2, p * p * c)
        if tuple(tokens.shape) != want:
            raise AssertionError(f"patchify({where}) has shape {tuple(tokens.shape)}; expected {want}: "
                                 "(N, tokens, values per token)")
        _expect(f"DiT.unpatchify(patchify(x)) == x ({where})",
                "the tokens are not in DiT's order: grid row by row, then within a patch (row, column, channel)",
                model.unpatchify(tokens), x)
        back = unpatchify(tokens, p, c)
        _expect(f"unpatchify(patchify(x)) == x ({where})", "your unpatchify does not invert your patchify", back, x)
        random_tokens = torch.randn(want, generator=gen)
        _expect(f"unpatchify == DiT.unpatchify on random tokens ({where})",
                "your unpatchify puts the values elsewhere than DiT's", unpatchify(random_tokens, p, c),
                model.unpatchify(random_tokens))
        with torch.no_grad():
            w = model.x_embedder.proj.weight  # (D, C, p, p): the convolution's kernel
            as_linear = tokens @ w.permute(0, 2, 3, 1).reshape(w.shape[0], -1).T + model.x_embedder.proj.bias
            _expect(f"PatchEmbed(x) == linear layer on patchify(x) ({where})",
                    "the strided convolution should be a linear map of your patches", as_linear,
                    model.x_embedder(x))
    return (f"patchify and unpatchify match dit_core on {len(cases)} shapes: DiT.unpatchify inverts your tokens, "
            "and PatchEmbed is a linear layer on them")


def check_ddim_step(ddim_step: Callable, *, steps: int = 50, seed: int = 0) -> str:
    """Check ``ddim_step(x_t, eps, alpha_bar_t, alpha_bar_prev) -> x_prev``: one DDIM step with eta = 0.

    ``eps`` is the model's noise prediction at ``x_t``; ``alpha_bar_t`` and ``alpha_bar_prev`` are the
    cumulative products of the (respaced) process at this step and at the one it goes to (1.0 after the last
    step), as Python floats. Compared with ``GaussianDiffusion.ddim_sample`` of ``create_diffusion("ddim50")``
    at every step, then over the whole loop against ``ddim_sample_loop``.
    """
    from dit_core.diffusion import create_diffusion

    process = create_diffusion(f"ddim{steps}", learn_sigma=False)
    model = _small_dit(8, 2, 4, learn_sigma=False, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    y = torch.tensor([1, 5, 7])
    kwargs = dict(clip_denoised=False, model_kwargs=dict(y=y))
    noise = torch.randn(3, 4, 8, 8, generator=gen)
    ab, ab_prev = process.alphas_cumprod, process.alphas_cumprod_prev
    with torch.no_grad():
        for k in sorted({steps - 1, steps // 2, 1, 0}, reverse=True):
            x = noise if k == steps - 1 else torch.randn(3, 4, 8, 8, generator=gen)
            original = process.timestep_map[k]
            eps = model(x, torch.full((3,), original), y)
            mine = ddim_step(x, eps, float(ab[k]), float(ab_prev[k]))
            _expect(f"one step at t = {original + 1} (code index {original}, step {k} of {steps})",
                    "x0_hat = (x_t - sqrt(1 - alpha_bar_t) eps) / sqrt(alpha_bar_t), then "
                    "x_prev = sqrt(alpha_bar_prev) x0_hat + sqrt(1 - alpha_bar_prev) eps",
                    mine, process.ddim_sample(model, x, torch.full((3,), k), **kwargs)["sample"])
        x = noise
        for k in reversed(range(steps)):
            x = ddim_step(x, model(x, torch.full((3,), process.timestep_map[k]), y), float(ab[k]), float(ab_prev[k]))
        library = process.ddim_sample_loop(model, noise.shape, noise=noise, **kwargs)
        _expect(f"{steps} steps from the same noise", "the loop drifts from ddim_sample_loop", x, library)
    return f"your DDIM step matches ddim_sample at every step checked and ddim_sample_loop over {steps} steps"


def check_guidance(guided: Callable, *, scales=(1.0, 1.5, 4.0), seed: int = 0) -> str:
    """Check ``guided(model, cfg_scale) -> model_fn``, where ``model_fn(x, t, y)`` returns the guided output.

    On the noise channels (the first ``model.in_channels``): ``eps_null + s (eps_y - eps_null)``, with the null
    class at index ``model.num_classes``; on the learned-variance channels: the conditional prediction, unguided.
    Compared with the first half of ``DiT.forward_with_cfg`` (the official batch layout) at each scale.
    """
    model = _small_dit(8, 2, 4, learn_sigma=True, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, 8, 8, generator=gen)
    t, y = torch.tensor([10, 500, 990]), torch.tensor([1, 2, 3])
    null = torch.full_like(y, model.num_classes)
    with torch.no_grad():
        for s in scales:
            mine = guided(model, s)(x, t, y)
            reference = model.forward_with_cfg(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]), s)[:3]
            if tuple(mine.shape) != tuple(reference.shape):
                raise AssertionError(f"model_fn(x, t, y) has shape {tuple(mine.shape)}; expected "
                                     f"{tuple(reference.shape)}: the noise channels, then the variance channels")
            c = model.in_channels
            _expect(f"noise channels at scale {s}", "eps_null + s (eps_y - eps_null), null class = num_classes",
                    mine[:, :c], reference[:, :c])
            _expect(f"variance channels at scale {s}", "these come from the conditional pass, unguided",
                    mine[:, c:], reference[:, c:])
    return f"your guidance matches DiT.forward_with_cfg at scales {', '.join(f'{s:g}' for s in scales)}"
