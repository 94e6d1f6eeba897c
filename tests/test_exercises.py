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


# ------------------------------------------------------------------------------------------------------------
# Chapter 3: DiT's parts. The right solutions are chapter 3's, kept in dit_book.my_dit; each wrong one below is a
# small change of them, and the checker must name the part that is wrong.
# ------------------------------------------------------------------------------------------------------------


from torch import nn  # noqa: E402

from dit_book import my_dit  # noqa: E402
from dit_book.exercises import (check_dit, check_dit_block, check_final_layer, check_label_embedder,  # noqa: E402
                                check_newton_schulz, check_q_sample, check_simple_loss, check_timestep_embedder,
                                check_training_step)


def test_chapter_3_solutions_pass():
    assert "matches dit_core's" in check_timestep_embedder(my_dit.timestep_embedding, my_dit.TimestepEmbedder)
    assert "null class at index 10" in check_label_embedder(my_dit.LabelEmbedder)
    assert "identity at initialisation" in check_dit_block(my_dit.DiTBlock)
    assert "zero at initialisation" in check_final_layer(my_dit.FinalLayer)
    summary = check_dit(my_dit.DiT)
    assert "largest difference 0.0e+00" in summary and "675,129,632 numbers" in summary


def test_timestep_frequencies_written_as_a_power_pass():
    def as_power(t, dim=256):  # another right way of writing w_k: ~1e-4 apart in float32 at t = 999
        half = dim // 2
        angles = t[:, None].float() * 10000 ** (-torch.arange(half) / half)[None]
        return torch.cat([angles.cos(), angles.sin()], dim=1)

    class Embedder(my_dit.TimestepEmbedder):
        def forward(self, t):
            return self.mlp(as_power(t, self.frequencies))

    assert "matches" in check_timestep_embedder(as_power, Embedder)


def test_timestep_embedding_mistakes_are_caught():
    def sines_first(t, dim=256):
        emb = my_dit.timestep_embedding(t, dim)
        return torch.cat([emb[:, dim // 2:], emb[:, : dim // 2]], dim=1)

    with pytest.raises(AssertionError, match="DiT puts the cosines first"):
        check_timestep_embedder(sines_first, my_dit.TimestepEmbedder)

    def other_frequencies(t, dim=256):  # k / (half - 1): the last frequency is exactly 1 / 10000
        half = dim // 2
        angles = t[:, None].float() * torch.exp(-math.log(10000) * torch.arange(half) / (half - 1))[None]
        return torch.cat([angles.cos(), angles.sin()], dim=1)

    with pytest.raises(AssertionError, match=r"w_k = 10000\^\(-k / 128\)"):
        check_timestep_embedder(other_frequencies, my_dit.TimestepEmbedder)


def test_timestep_mlp_mistakes_are_caught():
    class Renamed(nn.Module):
        def __init__(self, hidden_size):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(256, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)

        def forward(self, t):
            return self.fc2(self.act(self.fc1(my_dit.timestep_embedding(t))))

    with pytest.raises(AssertionError, match=r"(?s)not dit_core's.*missing: mlp\.0\.weight"):
        check_timestep_embedder(my_dit.timestep_embedding, Renamed)

    class Gelu(my_dit.TimestepEmbedder):
        def __init__(self, hidden_size):
            super().__init__(hidden_size)
            self.mlp[1] = nn.GELU()

    with pytest.raises(AssertionError, match=r"TimestepEmbedder\(32\)\(t\): the 256 sinusoidal features"):
        check_timestep_embedder(my_dit.timestep_embedding, Gelu)


def test_label_embedding_mistakes_are_caught():
    class NoNullClass(my_dit.LabelEmbedder):
        def __init__(self, num_classes, hidden_size, dropout_prob):
            super().__init__(num_classes, hidden_size, dropout_prob)
            self.embedding_table = nn.Embedding(num_classes, hidden_size)

    with pytest.raises(AssertionError, match=r"(?s)num_classes \+ 1.*embedding_table\.weight: yours \(10, 16\)"):
        check_label_embedder(NoNullClass)

    class DropsToZero(my_dit.LabelEmbedder):
        def forward(self, y, drop=None):
            return self.embedding_table(torch.where(drop, 0, y) if drop is not None else y)

    with pytest.raises(AssertionError, match="eval mode with drop: where drop is True the label becomes the null"):
        check_label_embedder(DropsToZero)

    class DropsWhenSampling(my_dit.LabelEmbedder):
        def forward(self, y, drop=None):
            if drop is None:
                drop = torch.rand(y.shape) < self.dropout_prob
            return super().forward(y, drop)

    with pytest.raises(AssertionError, match="in eval mode .* of the labels were dropped"):
        check_label_embedder(DropsWhenSampling)

    class NeverDrops(my_dit.LabelEmbedder):
        def forward(self, y, drop=None):
            return super().forward(y, drop if drop is not None else torch.zeros_like(y, dtype=torch.bool))

    with pytest.raises(AssertionError, match=r"in training mode 0\.0% of 20,000 labels"):
        check_label_embedder(NeverDrops)


class _Block(my_dit.DiTBlock):
    """The chapter's block with one of its lines changed by ``kind``."""

    kind = ""

    def forward(self, x, c):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=1)
        if self.kind == "scale, shift, gate":
            scale1, shift1, scale2, shift2 = shift1, scale1, shift2, scale2
        mod = (lambda h, s, k: h * k[:, None] + s[:, None]) if self.kind == "no 1 +" else my_dit.modulate
        x = x + gate1[:, None] * self.attn(mod(self.norm1(x), shift1, scale1))
        if self.kind == "attention's modulation twice":
            shift2, scale2 = shift1, scale1
        mlp_in = mod(self.norm2(x), shift2, scale2)
        return x + (1 if self.kind == "no MLP gate" else gate2[:, None]) * self.mlp(mlp_in)


@pytest.mark.parametrize("kind, where", [("scale, shift, gate", "the attention branch"),
                                         ("no 1 +", "the attention branch"),
                                         ("attention's modulation twice", "the whole block"),
                                         ("no MLP gate", "at initialisation")])
def test_block_mistakes_are_caught(kind, where):
    block = type("Wrong", (_Block,), {"kind": kind})
    with pytest.raises(AssertionError, match=where):
        check_dit_block(block)


def test_a_block_that_does_not_start_at_zero_is_caught():
    class NotZero(my_dit.DiTBlock):
        def __init__(self, hidden_size, num_heads):
            super().__init__(hidden_size, num_heads)
            nn.init.normal_(self.adaLN_modulation[1].weight, std=0.02)

    with pytest.raises(AssertionError, match=r"adaLN_modulation\.1\.weight should start at zero; adaLN-Zero"):
        check_dit_block(NotZero)


def test_final_layer_mistakes_are_caught():
    class RandomStart(my_dit.FinalLayer):
        def __init__(self, *args):
            super().__init__(*args)
            nn.init.xavier_uniform_(self.linear.weight)

    with pytest.raises(AssertionError, match=r"linear\.weight should start at zero"):
        check_final_layer(RandomStart)

    class Swapped(my_dit.FinalLayer):
        def forward(self, x, c):
            scale, shift = self.adaLN_modulation(c).chunk(2, dim=1)
            return self.linear(my_dit.modulate(self.norm_final(x), shift, scale))

    with pytest.raises(AssertionError, match="the final layer: linear"):
        check_final_layer(Swapped)


def test_layer_norms_with_pytorchs_default_eps_are_caught_and_named():
    """DiT's layer norms use eps = 1e-6; PyTorch's default, 1e-5, passes every check on tokens of unit variance and
    shows on tokens of small variance, which the block's and the final layer's checkers try."""
    class DefaultEpsBlock(my_dit.DiTBlock):
        def __init__(self, hidden_size, num_heads, mlp_ratio=4.0):
            super().__init__(hidden_size, num_heads, mlp_ratio)
            self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False)
            self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False)

    with pytest.raises(AssertionError, match=r"tokens of variance 1e-06: norm1 has eps=1e-05, norm2 has eps=1e-05: "
                                             r"DiT's layer norms are nn\.LayerNorm\(hidden_size, "
                                             r"elementwise_affine=False, eps=1e-06\)"):
        check_dit_block(DefaultEpsBlock)

    class DefaultEpsFinal(my_dit.FinalLayer):
        def __init__(self, hidden_size, patch_size, out_channels):
            super().__init__(hidden_size, patch_size, out_channels)
            self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False)

    with pytest.raises(AssertionError, match=r"tokens of variance 1e-06: norm_final has eps=1e-05"):
        check_final_layer(DefaultEpsFinal)

    class FunctionalEps(my_dit.FinalLayer):  # no module to read the eps from: the hint still names it
        def forward(self, x, c):
            shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
            normed = nn.functional.layer_norm(x, x.shape[-1:])
            return self.linear(my_dit.modulate(normed, shift, scale))

    with pytest.raises(AssertionError, match=r"tokens of variance 1e-06: DiT's layer norms are .* eps=1e-06"):
        check_final_layer(FunctionalEps)

    class DefaultEpsDiT(my_dit.DiT):  # the assembled model with both: its message names the eps too
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            for module in self.modules():
                if isinstance(module, nn.LayerNorm):
                    module.eps = 1e-5

    with pytest.raises(AssertionError, match=r"with dit_core's weights: blocks\.0\.norm1 has eps=1e-05"):
        check_dit(DefaultEpsDiT)


def test_model_mistakes_are_caught():
    class NoPositions(my_dit.DiT):
        def forward(self, x, t, y):
            tokens = self.x_embedder(x)  # pos_embed forgotten
            c = self.t_embedder(t) + self.y_embedder(y)
            for block in self.blocks:
                tokens = block(tokens, c)
            return my_dit.unpatchify(self.final_layer(tokens, c), self.patch_size, self.out_channels)

    with pytest.raises(AssertionError, match=r"with dit_core's weights: tokens = x_embedder\(x\) \+ pos_embed"):
        check_dit(NoPositions)

    class PositionsAsBuffer(my_dit.DiT):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            table = self.pos_embed.data
            del self.pos_embed
            self.register_buffer("positions", table)

        def forward(self, x, t, y):
            self.pos_embed = self.positions
            return super().forward(x, t, y)

    with pytest.raises(AssertionError, match=r"(?s)missing: pos_embed.*not in dit_core: positions"):
        check_dit(PositionsAsBuffer)

    class RandomFinalLayer(my_dit.DiT):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            nn.init.normal_(self.final_layer.linear.weight, std=0.02)

    with pytest.raises(AssertionError, match="a new model predicts .* not zero"):
        check_dit(RandomFinalLayer)


# ------------------------------------------------------------------------------------------------------------
# Chapter 4: q_sample and L_simple, as the chapter's solution writes them
# ------------------------------------------------------------------------------------------------------------


def q_sample(x0, t, noise, alpha_bar):
    a = alpha_bar[t].reshape(-1, 1, 1, 1)
    return (a.sqrt() * x0 + (1 - a).sqrt() * noise).float()


def simple_loss(model, x0, y, t, noise, alpha_bar):
    eps = model(q_sample(x0, t, noise, alpha_bar), t, y)[:, : x0.shape[1]]
    return ((noise - eps) ** 2).mean()


def test_chapter_4_solutions_pass():
    assert "linear and the cosine schedule" in check_q_sample(q_sample)
    assert "value and gradient" in check_simple_loss(simple_loss)


@pytest.mark.parametrize("wrong, message", [
    (lambda x0, t, noise, ab: q_sample(x0, t - 1, noise, ab), r"used alpha_bar\[t - 1\]"),
    (lambda x0, t, noise, ab: q_sample(x0, t + 1, noise, ab), r"indexed outside alpha_bar .* take alpha_bar\[t\]"),
    (lambda x0, t, noise, ab: q_sample(x0, (t + 1).clamp(max=999), noise, ab), r"used alpha_bar\[t \+ 1\]"),
    (lambda x0, t, noise, ab: (ab[t].reshape(-1, 1, 1, 1) * x0 + (1 - ab[t].reshape(-1, 1, 1, 1)) * noise).float(),
     "those are the variances"),
    (lambda x0, t, noise, ab: (ab[t].sqrt() * x0 + (1 - ab[t]).sqrt() * noise).float(), r"shaped \(N, 1, 1, 1\)"),
])
def test_q_sample_mistakes_are_caught(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_q_sample(wrong)


def test_simple_loss_mistakes_are_caught():
    def all_channels(model, x0, y, t, noise, ab):  # the variance channels in the regression
        out = model(q_sample(x0, t, noise, ab), t, y)
        return ((torch.cat([noise, noise], dim=1)[:, : out.shape[1]] - out) ** 2).mean()

    with pytest.raises(AssertionError, match=r"L_simple \(learned variance\).*variance values"):
        check_simple_loss(all_channels)
    with pytest.raises(AssertionError, match="has no gradient"):
        check_simple_loss(lambda *args: simple_loss(*args).detach())
    with pytest.raises(AssertionError, match="return one number"):
        check_simple_loss(lambda model, x0, *rest: simple_loss(model, x0, *rest) * torch.ones(len(x0)))
    with pytest.raises(AssertionError, match=r"L_simple \(learned variance\)"):
        check_simple_loss(lambda *args: simple_loss(*args) * 64)  # a sum over the pixels, not the mean


# ------------------------------------------------------------------------------------------------------------
# Chapter 5: the training step (the chapter's, and its L_simple exercise) and Newton-Schulz
# ------------------------------------------------------------------------------------------------------------

from dit_core.diffusion.losses import discretized_gaussian_log_likelihood, mean_flat, normal_kl  # noqa: E402


def training_step(model, ema, opt, diffusion, x0, y, g, ema_decay, label_dropout=0.1, *, mistake=""):
    if mistake == "noise drawn before t":
        noise = torch.randn(x0.shape, generator=g)
        t = torch.randint(0, diffusion.num_timesteps, (len(x0),), generator=g)
    else:
        t = torch.randint(0, diffusion.num_timesteps, (len(x0),), generator=g)
        noise = torch.randn(x0.shape, generator=g)
    if mistake == "noise first":
        noise, t = torch.randn(x0.shape, generator=g), t
    drop = torch.rand(len(x0), generator=g) < label_dropout
    if mistake != "no dropout":
        y = torch.where(drop, torch.full_like(y, model.num_classes), y)
    x_t = diffusion.q_sample(x0, t, noise)
    eps, v = model(x_t, t, y).chunk(2, dim=1)
    mse = mean_flat((noise - eps) ** 2)
    frozen = torch.cat([eps if mistake == "no stop-gradient" else eps.detach(), v], dim=1)
    p = diffusion.p_mean_variance(lambda *_: frozen, x_t, t, clip_denoised=False)
    mean, _, log_var = diffusion.q_posterior_mean_variance(x0, x_t, t)
    kl = mean_flat(normal_kl(mean, log_var, p["mean"], p["log_variance"]))
    nll = -mean_flat(discretized_gaussian_log_likelihood(x0, means=p["mean"], log_scales=p["log_variance"] / 2))
    vb = kl if mistake == "KL at t = 0" else torch.where(t == 0, nll, kl)
    loss = (mse + vb / (1.0 if mistake == "nats" else math.log(2))).mean()
    if mistake == "L_simple alone":
        loss = mse.mean()
    if mistake != "no zero_grad":
        opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if mistake == "two updates":
        opt.step()
    with torch.no_grad():
        for e, w in zip(ema.parameters(), model.parameters()):
            e.lerp_(w, ema_decay if mistake == "ema swapped" else 1 - ema_decay)
    return loss.detach()


def simple_step(model, ema, opt, diffusion, x0, y, g, ema_decay):
    t = torch.randint(0, diffusion.num_timesteps, (len(x0),), generator=g)
    noise = torch.randn(x0.shape, generator=g)
    drop = torch.rand(len(x0), generator=g) < 0.1
    y = torch.where(drop, torch.full_like(y, model.num_classes), y)
    loss = ((noise - model(diffusion.q_sample(x0, t, noise), t, y)) ** 2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    with torch.no_grad():
        for e, w in zip(ema.parameters(), model.parameters()):
            e.lerp_(w, 1 - ema_decay)
    return loss.detach()


def newton_schulz(g, steps=5, a=3.4445, b=-4.7750, c=2.0315):
    x = g / g.norm()
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x


def test_chapter_5_solutions_pass():
    assert "bit for bit over 3 steps" in check_training_step(training_step, my_dit.DiT)
    assert "bit for bit" in check_training_step(training_step)  # dit_core's own DiT
    assert "(L_simple)" in check_training_step(simple_step, my_dit.DiT, learn_sigma=False)
    assert "wide, tall and square" in check_newton_schulz(newton_schulz)


@pytest.mark.parametrize("mistake, message", [("no dropout", "the loss of step 0: labels not dropped"),
                                              ("noise first", "the loss of step 0"),
                                              ("no zero_grad", r"the weights after step 1 .*opt\.zero_grad"),
                                              ("ema swapped", r"the EMA after step 0 .*lerp_")])
def test_training_step_mistakes_are_caught(mistake, message):
    def wrong(*args):
        return training_step(*args, mistake=mistake)

    with pytest.raises(AssertionError, match=message):
        check_training_step(wrong, my_dit.DiT)


def test_training_a_model_that_is_not_dit_cores_is_refused():
    class Wider(my_dit.DiT):
        def __init__(self, **kwargs):
            super().__init__(**{**kwargs, "hidden_size": 64})

    with pytest.raises(AssertionError, match="your DiT: its parameters are not dit_core's"):
        check_training_step(training_step, Wider)


def test_newton_schulz_mistakes_are_caught():
    with pytest.raises(AssertionError, match="newton_schulz of a 64 x 256 matrix: x = g / g.norm"):
        check_newton_schulz(lambda g: newton_schulz(g, steps=4))

    def spectral(g, steps=5, a=3.4445, b=-4.7750, c=2.0315):  # scaled by the largest singular value instead
        x = g / torch.linalg.matrix_norm(g, ord=2)
        for _ in range(steps):
            A = x @ x.T
            x = a * x + (b * A + c * A @ A) @ x
        return x

    with pytest.raises(AssertionError, match="newton_schulz of a 64 x 256 matrix"):
        check_newton_schulz(spectral)


# ------------------------------------------------------------------------------------------------------------
# What the checkers must catch beyond a wrong formula: drops given in training mode and other dropout rates, a
# trained position table, the decoder term at t = 0, a model called at the wrong t or label, a misplaced gate or
# stop-gradient, a float64 result; and a right float64 DDIM step must pass. Each message names the slip.
# ------------------------------------------------------------------------------------------------------------

from dit_book import exercises  # noqa: E402


def test_the_checkers_test_models_react_to_t_and_y():
    model = exercises._small_dit(8, 2, 4, learn_sigma=True, seed=0)
    by_t, by_y = exercises._reaction(model, torch.randn(3, 4, 8, 8), torch.tensor([5, 400, 900]),
                                     torch.tensor([2, 3, 4]))
    assert by_t > exercises.REACTION and by_y > exercises.REACTION
    from dit_core.models import DiT

    torch.manual_seed(0)  # dit_core's initialisation, with the old test models' N(0, 0.02) adaLN: nearly blind to t
    blind = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=2, num_heads=2, num_classes=10).eval()
    with torch.no_grad():
        for name, p in blind.named_parameters():
            if "adaLN" in name or "final_layer.linear" in name:
                p.normal_(0, 0.02)
    assert exercises._reaction(blind, torch.randn(3, 4, 8, 8), torch.tensor([5, 400, 900]),
                               torch.tensor([2, 3, 4]))[0] < exercises.REACTION


def test_label_embedders_that_ignore_drop_in_training_or_fix_the_rate_are_caught():
    class IgnoresDropInTraining(my_dit.LabelEmbedder):
        def forward(self, y, drop=None):
            if self.training:  # draws its own drops even when the step passes them
                drop = torch.rand(y.shape) < self.dropout_prob
            return super().forward(y, drop)

    with pytest.raises(AssertionError, match="training mode with drop given .* when drop is given it decides"):
        check_label_embedder(IgnoresDropInTraining)

    class AlwaysTenPercent(my_dit.LabelEmbedder):
        def forward(self, y, drop=None):
            if drop is None and self.training:
                drop = torch.rand(y.shape) < 0.1
            return super().forward(y, drop)

    with pytest.raises(AssertionError, match=r"with dropout_prob 0\.25; expected 25%.*\(not a fixed 0\.1\)"):
        check_label_embedder(AlwaysTenPercent)


def test_a_trained_or_wrong_position_table_is_caught():
    class TrainedPositions(my_dit.DiT):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.pos_embed.requires_grad_(True)

    with pytest.raises(AssertionError, match=r"pos_embed is trained \(requires_grad=True\)"):
        check_dit(TrainedPositions)

    class ZeroPositions(my_dit.DiT):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            torch.nn.init.zeros_(self.pos_embed)

    with pytest.raises(AssertionError, match=r"pos_embed of a new model: the table of sincos_2d"):
        check_dit(ZeroPositions)


def test_a_dit_that_forgets_the_label_is_caught():
    class NoLabel(my_dit.DiT):
        def forward(self, x, t, y):
            tokens = self.x_embedder(x) + self.pos_embed
            c = self.t_embedder(t)  # y_embedder forgotten
            for block in self.blocks:
                tokens = block(tokens, c)
            return my_dit.unpatchify(self.final_layer(tokens, c), self.patch_size, self.out_channels)

    with pytest.raises(AssertionError, match=r"with dit_core's weights: .*c = t_embedder\(t\) \+ y_embedder\(y\)"):
        check_dit(NoLabel)


def test_a_block_without_a_gate_is_named_as_such():
    for kind, branch in (("no MLP gate", "the MLP branch"),):
        block = type("Wrong", (_Block,), {"kind": kind})
        with pytest.raises(AssertionError, match=f"at initialisation: adaLN_modulation starts at zero.*{branch} is "
                                                 "added without its gate"):
            check_dit_block(block)


def test_a_float64_q_sample_is_caught_and_a_float64_ddim_step_passes():
    def float64(x0, t, noise, ab):  # right values, the schedule's float64
        a = ab[t].reshape(-1, 1, 1, 1)
        return a.sqrt() * x0 + (1 - a).sqrt() * noise

    with pytest.raises(AssertionError, match="returned float64 for float32 images: .*return x0's dtype"):
        check_q_sample(float64)

    def in_float64(x_t, eps, alpha_bar_t, alpha_bar_prev):
        return ddim_step(x_t.double(), eps.double(), alpha_bar_t, alpha_bar_prev)

    assert "returns float64, compared as float32" in check_ddim_step(in_float64)


def test_a_loss_that_calls_the_model_at_the_wrong_step_or_label_is_named():
    def later_step(model, x0, y, t, noise, ab):
        eps = model(q_sample(x0, t, noise, ab), (t + 1).clamp(max=999), y)[:, : x0.shape[1]]
        return ((noise - eps) ** 2).mean()

    with pytest.raises(AssertionError, match=r"L_simple \(learned variance\): the model was called with t = "
                                             r"\[6, 251, 601, 999\], not the t it was given"):
        check_simple_loss(later_step)

    def first_class(model, x0, y, t, noise, ab):
        eps = model(q_sample(x0, t, noise, ab), t, torch.zeros_like(y))[:, : x0.shape[1]]
        return ((noise - eps) ** 2).mean()

    with pytest.raises(AssertionError, match=r"the model was called with the labels \[\[0, 0, 0, 0\]\], never with y"):
        check_simple_loss(first_class)


def test_guidance_with_the_wrong_null_class_or_step_is_named():
    def class_zero_as_null(model, s):
        def fn(x, t, y):
            cond, uncond = model(x, t, y), model(x, t, torch.zeros_like(y))
            c = model.in_channels
            return torch.cat([uncond[:, :c] + s * (cond[:, :c] - uncond[:, :c]), cond[:, c:]], dim=1)
        return fn

    with pytest.raises(AssertionError, match=r"scale 1\.5: no model call had the null class: .*\[0, 0, 0\]"):
        check_guidance(class_zero_as_null)

    def one_step_late(model, s):
        fn = guided(model, s)
        return lambda x, t, y: fn(x, t + 1, y)

    with pytest.raises(AssertionError, match=r"scale 1\.0: the model was called with t = \[11, 501, 991\]"):
        check_guidance(one_step_late)


@pytest.mark.parametrize("mistake, message", [
    ("KL at t = 0", r"the loss of step 88 \(it draws t = 0 .*\): at t = 0 \(code index 0\) the bound's term is the "
                    "decoder's negative log-likelihood"),
    ("nats", r"the loss of step 0: the bound in nats"),
    ("L_simple alone", r"the loss of step 0: L_vlb left out"),
    ("noise drawn before t", r"the loss of step 0: the draws in another order"),
    ("no stop-gradient", r"the weights after step 0 .*: the bound's gradient reached the noise prediction: .*detach"),
    ("two updates", r"the weights after step 0 .*: your gradients are right, the update made with them is not"),
])
def test_training_step_slips_are_named(mistake, message):
    def wrong(*args):
        return training_step(*args, mistake=mistake)

    with pytest.raises(AssertionError, match=message):
        check_training_step(wrong, my_dit.DiT)
