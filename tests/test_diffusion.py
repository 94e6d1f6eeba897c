"""Tests for dit_core.diffusion.

Expected values are derived here independently of the library: schedules from their defining formulas in
Python floats, posteriors from Bayes' rule for two Gaussians, KLs and likelihoods from math.erf, and
samplers checked against toy models whose optimal answers are known in closed form.
"""

import math

import pytest
import torch

from dit_core.diffusion import (
    GaussianDiffusion,
    LossType,
    ModelMeanType,
    ModelVarType,
    create_diffusion,
    get_named_beta_schedule,
    space_timesteps,
)
from dit_core.diffusion.losses import (
    approx_standard_normal_cdf,
    discretized_gaussian_log_likelihood,
    mean_flat,
    normal_kl,
)

# ----------------------------------------------------------------------------- independent references


def linear_beta(i, T=1000):
    """Ho et al. 2020: 1e-4 .. 0.02 over 1000 steps, end points scaled by 1000 / T."""
    lo, hi = 1e-4 * 1000 / T, 0.02 * 1000 / T
    return lo + (hi - lo) * i / (T - 1)


def alpha_bar(t, T=1000):
    """prod_{i<=t} (1 - beta_i) by a direct loop in Python floats."""
    p = 1.0
    for i in range(t + 1):
        p *= 1.0 - linear_beta(i, T)
    return p


ALPHA_BAR = [alpha_bar(t) for t in range(1000)]  # one pass would be faster; this is the definition


def bayes_posterior(x0, xt, a, a_prev):
    """q(x_{t-1} | x_t, x_0) by Bayes' rule, for one step from alpha_bar a_prev to a.

    Prior x_{t-1} ~ N(sqrt(a_prev) x0, 1 - a_prev); likelihood x_t | x_{t-1} ~ N(sqrt(alpha) x_{t-1}, beta)
    with alpha = a / a_prev, beta = 1 - alpha. Returns (mean, variance); works on floats and tensors.
    """
    alpha = a / a_prev
    beta = 1.0 - alpha
    if a_prev == 1.0:  # first step: x_{t-1} = x_0 exactly
        return x0, 0.0
    precision = 1.0 / (1.0 - a_prev) + alpha / beta
    var = 1.0 / precision
    mean = var * (math.sqrt(a_prev) * x0 / (1.0 - a_prev) + math.sqrt(alpha) * xt / beta)
    return mean, var


def kl_gauss(m1, v1, m2, v2):
    """KL(N(m1, v1) || N(m2, v2)) for scalars."""
    return 0.5 * math.log(v2 / v1) + (v1 + (m1 - m2) ** 2) / (2 * v2) - 0.5


def normal_cdf(x):
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


class GaussianDataOracle:
    """The exact optimal eps-predictor when the data is x0 ~ N(mu, s^2) in every dimension.

    x_t = sqrt(a) x0 + sqrt(1 - a) eps is jointly Gaussian with eps, so
    E[eps | x_t] = sqrt(1 - a) (x_t - sqrt(a) mu) / (a s^2 + 1 - a), with a = alpha_bar of the ORIGINAL step t.
    With learn_sigma the second half of the channels is the constant ``v``. Records every t it sees.
    """

    def __init__(self, mu, s, learn_sigma=True, v=0.0):
        self.mu, self.s, self.learn_sigma, self.v = mu, s, learn_sigma, v
        self.acp = torch.tensor(ALPHA_BAR, dtype=torch.float64)
        self.seen = []

    def eps(self, x, t):
        a = self.acp[t].to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))
        return (1 - a).sqrt() * (x - a.sqrt() * self.mu) / (a * self.s**2 + 1 - a)

    def __call__(self, x, t):
        self.seen.append(t[:4].tolist())
        eps = self.eps(x, t)
        if self.learn_sigma:
            return torch.cat([eps, torch.full_like(eps, self.v)], dim=1)
        return eps


# ----------------------------------------------------------------------------- schedules


def test_linear_schedule_matches_definition():
    d = create_diffusion("")
    assert d.betas.dtype.name == "float64" and d.alphas_cumprod.dtype.name == "float64"
    assert d.num_timesteps == 1000
    assert d.betas[0] == pytest.approx(1e-4, rel=1e-12) and d.betas[-1] == pytest.approx(0.02, rel=1e-12)
    for t in (0, 1, 10, 500, 999):
        assert d.betas[t] == pytest.approx(linear_beta(t), rel=1e-12)
        assert d.alphas_cumprod[t] == pytest.approx(ALPHA_BAR[t], rel=1e-10)
        assert d.alphas_cumprod_prev[t] == pytest.approx(ALPHA_BAR[t - 1] if t else 1.0, rel=1e-10)
    assert ALPHA_BAR[999] == pytest.approx(4.0358e-5, rel=1e-3)  # nearly pure noise at the end


def test_linear_schedule_scales_with_step_count():
    betas = get_named_beta_schedule("linear", 100)
    assert len(betas) == 100
    assert betas[0] == pytest.approx(0.001) and betas[-1] == pytest.approx(0.2)
    assert betas[37] == pytest.approx(linear_beta(37, T=100))


def test_cosine_schedule_follows_alpha_bar():
    T = 1000
    betas = get_named_beta_schedule("squaredcos_cap_v2", T)
    f = lambda u: math.cos((u + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
    acp = 1.0
    for t in range(T - 1):  # the last beta is capped at 0.999
        acp *= 1.0 - betas[t]
        assert acp == pytest.approx(f((t + 1) / T) / f(0.0), rel=1e-8, abs=1e-12)
    assert betas.max() <= 0.999 and betas[-1] == pytest.approx(0.999)
    assert get_named_beta_schedule("cosine", 10).tolist() == get_named_beta_schedule("squaredcos_cap_v2", 10).tolist()


def test_full_respacing_is_identity():
    full = create_diffusion("")
    for other in (create_diffusion(None), create_diffusion("1000"), create_diffusion(1000)):
        assert other.timestep_map == list(range(1000))
        assert (other.betas == full.betas).all()
    base = GaussianDiffusion(
        betas=get_named_beta_schedule("linear", 1000), model_mean_type=ModelMeanType.EPSILON,
        model_var_type=ModelVarType.LEARNED_RANGE, loss_type=LossType.MSE,
    )
    assert abs(base.posterior_variance - full.posterior_variance).max() < 1e-15


# ----------------------------------------------------------------------------- respacing


def test_space_timesteps_250_follows_the_even_spacing_rule():
    kept = sorted(space_timesteps(1000, "250"))
    # Step j is round(j * 999 / 249): evenly spaced with both ends kept. (999 / 249 has no exact halves.)
    assert kept == [round(j * 999 / 249) for j in range(250)]
    assert kept[:5] == [0, 4, 8, 12, 16] and kept[-1] == 999
    assert {b - a for a, b in zip(kept, kept[1:])} == {4, 5}
    # range(0, 1000, 4) -- 0, 4, ..., 996 -- is the DDIM stride "ddim250", a different set.
    assert sorted(space_timesteps(1000, "ddim250")) == list(range(0, 1000, 4))


def test_space_timesteps_small_cases_and_sections():
    assert sorted(space_timesteps(10, "5")) == [0, 2, 4, 7, 9]  # 0, 2.25, 4.5 (half to even), 6.75, 9
    assert sorted(space_timesteps(1000, "ddim25")) == list(range(0, 1000, 40))
    assert sorted(space_timesteps(1000, "ddim50")) == list(range(0, 1000, 20))
    kept = sorted(space_timesteps(300, "10,15,20"))
    assert len(kept) == 45
    assert sum(k < 100 for k in kept) == 10 and sum(100 <= k < 200 for k in kept) == 15
    assert sum(k >= 200 for k in kept) == 20
    assert kept[:2] == [0, 11] and kept[9] == 99 and kept[10] == 100 and kept[-1] == 299
    assert sorted(space_timesteps(10, [2, 3])) == [0, 4, 5, 7, 9]


def test_respaced_schedule_keeps_cumulative_products():
    d = create_diffusion("ddim25")
    assert d.num_timesteps == 25 and d.original_num_steps == 1000
    for i, k in enumerate(d.timestep_map):
        assert d.alphas_cumprod[i] == pytest.approx(ALPHA_BAR[k], rel=1e-10)
        prev = ALPHA_BAR[d.timestep_map[i - 1]] if i else 1.0
        assert d.betas[i] == pytest.approx(1 - ALPHA_BAR[k] / prev, rel=1e-9)


def test_respaced_model_sees_original_timesteps():
    d = create_diffusion("ddim25")
    oracle = GaussianDataOracle(0.0, 1.0)
    d.ddim_sample_loop(oracle, (2, 1, 2, 2), clip_denoised=False)
    assert [ts[0] for ts in oracle.seen] == list(range(960, -1, -40))
    assert all(ts[0] == ts[1] for ts in oracle.seen)

    d = create_diffusion("250")
    oracle = GaussianDataOracle(0.0, 1.0)
    d.p_sample_loop(oracle, (1, 1, 2, 2), clip_denoised=False)
    assert [ts[0] for ts in oracle.seen] == sorted(space_timesteps(1000, "250"), reverse=True)

    d = create_diffusion("ddim25")
    oracle = GaussianDataOracle(0.0, 1.0)
    d.training_losses(oracle, torch.zeros(3, 1, 2, 2), torch.tensor([0, 1, 24]))
    assert oracle.seen[0] == [0, 40, 960]


# ----------------------------------------------------------------------------- forward process and posterior


def test_q_sample_statistics():
    d = create_diffusion("")
    torch.manual_seed(0)
    x0 = torch.tensor([-0.8, 0.3, 0.9]).reshape(1, 3, 1, 1).expand(100_000, 3, 1, 1)
    for t in (50, 500):
        xt = d.q_sample(x0, torch.full((x0.shape[0],), t, dtype=torch.long))
        a = ALPHA_BAR[t]
        mean, var = xt.mean(dim=0).flatten(), xt.var(dim=0).flatten()
        assert torch.allclose(mean, math.sqrt(a) * x0[0].flatten(), atol=0.01)
        assert torch.allclose(var, torch.full((3,), 1 - a), rtol=0.02)


def test_q_sample_with_given_noise_is_exact():
    d = create_diffusion("")
    x0, noise = torch.randn(4, 2, 3, 3, dtype=torch.float64), torch.randn(4, 2, 3, 3, dtype=torch.float64)
    t = torch.tensor([0, 7, 300, 999])
    xt = d.q_sample(x0, t, noise=noise)
    for n in range(4):
        a = ALPHA_BAR[int(t[n])]
        assert torch.allclose(xt[n], math.sqrt(a) * x0[n] + math.sqrt(1 - a) * noise[n], atol=1e-12)


def test_posterior_matches_bayes_rule():
    d = create_diffusion("")
    x0 = torch.randn(4, 2, 3, 3, dtype=torch.float64)
    xt = torch.randn(4, 2, 3, 3, dtype=torch.float64)
    t = torch.tensor([1, 10, 500, 999])
    mean, var, log_var = d.q_posterior_mean_variance(x0, xt, t)
    assert mean.shape == var.shape == log_var.shape == x0.shape
    for n, step in enumerate(t.tolist()):
        want_mean, want_var = bayes_posterior(x0[n], xt[n], ALPHA_BAR[step], ALPHA_BAR[step - 1])
        assert torch.allclose(mean[n], want_mean, atol=1e-10)
        assert torch.allclose(var[n], torch.full_like(var[n], want_var), rtol=1e-9)
        assert torch.allclose(log_var[n], torch.full_like(var[n], math.log(want_var)), atol=1e-9)

    # t = 0: x_{t-1} is x_0 itself; the log-variance is clipped to the value of step 1.
    mean, var, log_var = d.q_posterior_mean_variance(x0[:1], xt[:1], torch.tensor([0]))
    assert torch.allclose(mean, x0[:1], atol=1e-12) and (var == 0).all()
    assert torch.allclose(log_var, torch.full_like(log_var, math.log(bayes_posterior(0, 0, ALPHA_BAR[1], ALPHA_BAR[0])[1])))


def test_schedule_constants_keep_float32_inputs_float32():
    d = create_diffusion("")
    x0 = torch.randn(2, 4, 8, 8)
    t = torch.tensor([3, 900])
    assert d.q_sample(x0, t).dtype == torch.float32
    assert all(v.dtype == torch.float32 for v in d.q_posterior_mean_variance(x0, x0, t))
    assert d.training_losses(GaussianDataOracle(0.0, 1.0), x0, t)["loss"].dtype == torch.float32
    # A bf16 model output (autocast) still gives a float32 loss close to the float32 one.
    noise = torch.randn_like(x0)
    model = GaussianDataOracle(0.0, 1.0, v=0.3)
    ref = d.training_losses(model, x0, t, noise=noise)["loss"]
    low = d.training_losses(lambda x, ts: model(x, ts).bfloat16(), x0, t, noise=noise)["loss"]
    assert low.dtype == torch.float32 and torch.allclose(low, ref, rtol=0.05, atol=1e-3)


# ----------------------------------------------------------------------------- KL and likelihood


def test_normal_kl_closed_form():
    cases = [(0.0, 1.0, 0.0, 1.0), (0.3, 0.5, -0.2, 2.0), (1.5, 3.0, 0.0, 0.1), (-2.0, 0.01, -1.9, 0.02)]
    for m1, v1, m2, v2 in cases:
        got = normal_kl(torch.tensor(m1, dtype=torch.float64), math.log(v1), torch.tensor(m2, dtype=torch.float64), math.log(v2))
        assert got.item() == pytest.approx(kl_gauss(m1, v1, m2, v2), rel=1e-10, abs=1e-14)
    with pytest.raises(ValueError, match="Tensor"):
        normal_kl(0.0, 0.0, 1.0, 0.0)


def test_approx_normal_cdf_error_is_small():
    x = torch.linspace(-8, 8, 4001, dtype=torch.float64)
    exact = torch.tensor([normal_cdf(v) for v in x.tolist()], dtype=torch.float64)
    assert (approx_standard_normal_cdf(x) - exact).abs().max() < 2e-4


def test_discretized_gaussian_log_likelihood_matches_cdf_difference():
    # (pixel, mean, scale); the edge bins -1 and 1 reach to -inf and +inf.
    cases = [(-1.0, -0.8, 0.3), (-0.5, -0.4, 0.3), (0.0, 0.1, 0.3), (3 / 255, 0.0, 0.02), (0.6, 0.1, 0.5), (1.0, 0.9, 0.1)]
    x, means, scales = (torch.tensor(c, dtype=torch.float64) for c in zip(*cases))
    got = discretized_gaussian_log_likelihood(x, means=means, log_scales=scales.log())
    for (value, mean, scale), lp in zip(cases, got.tolist()):
        upper = normal_cdf((value + 1 / 255 - mean) / scale)
        lower = normal_cdf((value - 1 / 255 - mean) / scale)
        if value == -1.0:
            prob = upper
        elif value == 1.0:
            prob = 1 - lower
        else:
            prob = upper - lower
        # The tanh approximation of the CDF (error < 2e-4) moves these log-probabilities by < 1%.
        assert lp == pytest.approx(math.log(prob), abs=0.01), value
    # A far-away pixel gets a large finite penalty, not -inf.
    far = discretized_gaussian_log_likelihood(
        torch.tensor([0.9]), means=torch.tensor([-0.9]), log_scales=torch.tensor([math.log(0.01)])
    )
    assert torch.isfinite(far).all() and far.item() == pytest.approx(math.log(1e-12), rel=1e-3)


# ----------------------------------------------------------------------------- p_mean_variance


def test_variance_choices():
    x = torch.randn(3, 1, 2, 2, dtype=torch.float64)
    t = torch.tensor([0, 5, 999])
    beta = [linear_beta(k) for k in t.tolist()]
    post = [bayes_posterior(0.0, 0.0, ALPHA_BAR[k], ALPHA_BAR[k - 1])[1] if k else 0.0 for k in t.tolist()]
    post1 = bayes_posterior(0.0, 0.0, ALPHA_BAR[1], ALPHA_BAR[0])[1]

    def var_of(diffusion, model):
        return diffusion.p_mean_variance(model, x, t)["variance"][:, 0, 0, 0].tolist()

    eps_only = GaussianDataOracle(0.0, 1.0, learn_sigma=False)
    # fixed large: beta_t, but beta_tilde_1 at t = 0
    assert var_of(create_diffusion("", learn_sigma=False), eps_only) == pytest.approx([post1] + beta[1:], rel=1e-9)
    # fixed small: beta_tilde_t (0 at t = 0)
    assert var_of(create_diffusion("", learn_sigma=False, sigma_small=True), eps_only) == pytest.approx(post, rel=1e-9, abs=1e-20)
    # learned range: v = 1 gives beta_t, v = -1 the clipped beta_tilde_t, v = 0 their geometric mean
    d = create_diffusion("")
    assert var_of(d, GaussianDataOracle(0.0, 1.0, v=1.0)) == pytest.approx(beta, rel=1e-9)
    clipped = [post1] + post[1:]
    assert var_of(d, GaussianDataOracle(0.0, 1.0, v=-1.0)) == pytest.approx(clipped, rel=1e-9)
    geo = [math.sqrt(b * p) for b, p in zip(beta, clipped)]
    assert var_of(d, GaussianDataOracle(0.0, 1.0, v=0.0)) == pytest.approx(geo, rel=1e-9)


def test_p_mean_variance_predictions():
    d = create_diffusion("")
    x0 = torch.rand(2, 3, 4, 4, dtype=torch.float64) * 2 - 1
    noise = torch.randn_like(x0)
    t = torch.tensor([20, 700])
    xt = d.q_sample(x0, t, noise=noise)

    def true_eps(x, ts):
        return torch.cat([noise, torch.zeros_like(noise)], dim=1), {"note": 1}

    out = d.p_mean_variance(true_eps, xt, t, clip_denoised=False)
    assert set(out) >= {"mean", "variance", "log_variance", "pred_xstart"}
    assert out["extra"] == {"note": 1}
    assert torch.allclose(out["pred_xstart"], x0, atol=1e-9)
    for n, k in enumerate(t.tolist()):
        want, _ = bayes_posterior(x0[n], xt[n], ALPHA_BAR[k], ALPHA_BAR[k - 1])
        assert torch.allclose(out["mean"][n], want, atol=1e-9)

    # predict_xstart: the model's output is x_0 itself; clip_denoised clamps it to [-1, 1].
    dx = create_diffusion("", predict_xstart=True, learn_sigma=False)
    out = dx.p_mean_variance(lambda x, ts: 3 * torch.ones_like(x), xt, t)
    assert (out["pred_xstart"] == 1).all()
    out = dx.p_mean_variance(lambda x, ts: 3 * torch.ones_like(x), xt, t, clip_denoised=False,
                             denoised_fn=lambda z: z / 2)
    assert torch.allclose(out["pred_xstart"], torch.full_like(xt, 1.5))


# ----------------------------------------------------------------------------- training losses


def test_training_losses_oracle_gives_zero_mse():
    d = create_diffusion("")
    x0 = torch.randint(0, 256, (4, 2, 4, 4)).float() / 127.5 - 1
    noise = torch.randn_like(x0)
    t = torch.tensor([0, 1, 400, 999])
    # Exact noise and v = -1 (Sigma = beta_tilde): p equals the posterior, so every KL term vanishes.
    oracle = lambda x, ts: torch.cat([noise, -torch.ones_like(noise)], dim=1)  # noqa: E731
    terms = d.training_losses(oracle, x0, t, noise=noise)
    assert set(terms) == {"loss", "mse", "vb"} and all(v.shape == (4,) for v in terms.values())
    assert torch.allclose(terms["mse"], torch.zeros(4), atol=1e-10)
    assert torch.allclose(terms["vb"][1:], torch.zeros(3), atol=1e-4)
    assert terms["vb"][0] > 0  # t = 0 is the decoder NLL, always positive
    assert torch.allclose(terms["loss"], terms["mse"] + terms["vb"])


def test_training_losses_match_hand_computation():
    """loss = mean((eps - eps_pred)^2) + KL(posterior || model) / log 2, for a small linear model."""
    d = create_diffusion("")
    torch.manual_seed(1)
    x0 = torch.randint(0, 256, (4, 1, 2, 2)).double() / 127.5 - 1
    noise = torch.randn_like(x0)
    t = torch.tensor([0, 3, 250, 998])

    def model(x, ts):
        return torch.cat([0.7 * x + 0.1, torch.tanh(x)], dim=1)

    terms = d.training_losses(model, x0, t, noise=noise)
    for n, k in enumerate(t.tolist()):
        a = ALPHA_BAR[k]
        x_t = [math.sqrt(a) * u + math.sqrt(1 - a) * e for u, e in zip(x0[n].flatten().tolist(), noise[n].flatten().tolist())]
        eps_pred = [0.7 * v + 0.1 for v in x_t]
        frac = [(math.tanh(v) + 1) / 2 for v in x_t]
        mse = sum((e - p) ** 2 for e, p in zip(noise[n].flatten().tolist(), eps_pred)) / 4
        assert terms["mse"][n].item() == pytest.approx(mse, rel=1e-9)
        a_prev = ALPHA_BAR[k - 1] if k else 1.0
        b = linear_beta(k)
        clipped = bayes_posterior(0.0, 0.0, ALPHA_BAR[1], ALPHA_BAR[0])[1] if k == 0 else None
        vb = 0.0
        for u, v, p, f in zip(x0[n].flatten().tolist(), x_t, eps_pred, frac):
            x0_pred = (v - math.sqrt(1 - a) * p) / math.sqrt(a)
            model_mean, post_var = bayes_posterior(x0_pred, v, a, a_prev)
            true_mean, _ = bayes_posterior(u, v, a, a_prev)
            model_var = math.exp(f * math.log(b) + (1 - f) * math.log(clipped or post_var))
            if k == 0:  # decoder NLL: the probability of x0's 8-bit bin (exact CDF; the library uses tanh)
                sd = math.sqrt(model_var)
                hi = 1.0 if u > 0.999 else normal_cdf((u + 1 / 255 - model_mean) / sd)
                lo = 0.0 if u < -0.999 else normal_cdf((u - 1 / 255 - model_mean) / sd)
                vb += -math.log(max(hi - lo, 1e-12))
            else:
                vb += kl_gauss(true_mean, post_var, model_mean, model_var)
        vb = vb / 4 / math.log(2)
        tol = 0.01 if k == 0 else 1e-9
        assert terms["vb"][n].item() == pytest.approx(vb, rel=tol), k
        assert terms["loss"][n].item() == pytest.approx(mse + vb, rel=tol)


def test_vb_term_trains_only_the_variance():
    d = create_diffusion("")
    eps_w = torch.tensor(0.5, requires_grad=True)
    var_w = torch.tensor(0.2, requires_grad=True)

    def model(x, ts):
        return torch.cat([eps_w * x, var_w * torch.ones_like(x)], dim=1)

    x0 = torch.rand(3, 2, 4, 4) * 2 - 1
    terms = d.training_losses(model, x0, torch.tensor([0, 10, 600]))
    g_eps, g_var = torch.autograd.grad(terms["vb"].sum(), [eps_w, var_w], retain_graph=True, allow_unused=True)
    assert g_eps is None or g_eps.item() == 0.0
    assert g_var is not None and abs(g_var.item()) > 1e-6
    g_eps, g_var = torch.autograd.grad(terms["mse"].sum(), [eps_w, var_w], allow_unused=True)
    assert abs(g_eps.item()) > 1e-6 and (g_var is None or g_var.item() == 0.0)


def test_kl_and_rescaled_loss_types():
    x0 = torch.rand(3, 2, 4, 4, dtype=torch.float64) * 2 - 1
    noise = torch.randn_like(x0)
    t = torch.tensor([0, 40, 200])

    def model(x, ts):
        return torch.cat([0.9 * x, 0.3 * torch.ones_like(x)], dim=1)

    hybrid = create_diffusion("250").training_losses(model, x0, t, noise=noise)
    kl = create_diffusion("250", use_kl=True).training_losses(model, x0, t, noise=noise)
    assert set(kl) == {"loss"}
    assert torch.allclose(kl["loss"], hybrid["vb"] * 250)  # RESCALED_KL: the bound's T terms
    rescaled = create_diffusion("250", rescale_learned_sigmas=True).training_losses(model, x0, t, noise=noise)
    assert torch.allclose(rescaled["vb"], hybrid["vb"] * 0.25)  # RESCALED_MSE: vb * T / 1000
    assert torch.allclose(rescaled["mse"], hybrid["mse"])

    fixed = create_diffusion("", learn_sigma=False).training_losses(lambda x, ts: noise, x0, t, noise=noise)
    assert set(fixed) == {"loss", "mse"} and torch.allclose(fixed["loss"], torch.zeros(3, dtype=torch.float64))
    xstart = create_diffusion("", predict_xstart=True).training_losses(
        lambda x, ts: torch.cat([x0, torch.zeros_like(x0)], 1), x0, t, noise=noise
    )
    assert torch.allclose(xstart["mse"], torch.zeros(3, dtype=torch.float64))


# ----------------------------------------------------------------------------- samplers


def test_ddpm_recovers_gaussian_data():
    torch.manual_seed(0)
    mu, s = 0.5, 0.25
    samples = create_diffusion("").p_sample_loop(GaussianDataOracle(mu, s), (10_000, 1, 1, 1), clip_denoised=False)
    assert samples.shape == (10_000, 1, 1, 1) and samples.dtype == torch.float32
    assert samples.mean().item() == pytest.approx(mu, abs=0.01)
    assert samples.std().item() == pytest.approx(s, abs=0.01)


def test_respaced_ddpm_matches_exact_linear_gaussian_recursion():
    """With a linear model every step is x_{k-1} = A x_k + B + sigma z, so the output law is known exactly."""
    mu, s = -0.3, 0.4
    d = create_diffusion("100")
    kept = d.timestep_map
    m, var = 0.0, 1.0
    for i in range(len(kept) - 1, -1, -1):
        a, a_prev = ALPHA_BAR[kept[i]], (ALPHA_BAR[kept[i - 1]] if i else 1.0)
        c = math.sqrt(1 - a) / (a * s * s + 1 - a)  # eps = c (x - sqrt(a) mu)

        def mean_of(x):
            x0_pred = (x - math.sqrt(1 - a) * c * (x - math.sqrt(a) * mu)) / math.sqrt(a)
            return bayes_posterior(x0_pred, x, a, a_prev)[0]

        B = mean_of(0.0)
        A = mean_of(1.0) - B
        beta = 1 - a / a_prev
        post = bayes_posterior(0.0, 0.0, a, a_prev)[1] if i else 0.0
        post_clipped = post if i else bayes_posterior(0.0, 0.0, ALPHA_BAR[kept[1]], ALPHA_BAR[kept[0]])[1]
        sigma2 = math.sqrt(beta * post_clipped) if i else 0.0  # v = 0: geometric mean; no noise at the end
        m, var = A * m + B, A * A * var + sigma2
    torch.manual_seed(0)
    samples = d.p_sample_loop(GaussianDataOracle(mu, s, v=0.0), (40_000, 1, 1, 1), clip_denoised=False)
    assert samples.mean().item() == pytest.approx(m, abs=4 * math.sqrt(var / 40_000))
    assert samples.std().item() == pytest.approx(math.sqrt(var), rel=0.01)
    assert abs(m - mu) < 0.01 and abs(math.sqrt(var) - s) < 0.03  # and 100 steps already land close to the data


def test_ddim_is_the_exact_deterministic_map():
    """DDIM with eta=0 (Song et al. 2021, eq. 12) applied by hand, step by step, to the same noise."""
    mu, s = 0.2, 0.3
    d = create_diffusion("ddim20")
    torch.manual_seed(3)
    noise = torch.randn(500, 1, 1, 1, dtype=torch.float64)
    out = d.ddim_sample_loop(GaussianDataOracle(mu, s), noise.shape, noise=noise, clip_denoised=False)
    x = noise.flatten().tolist()
    kept = d.timestep_map
    for i in range(len(kept) - 1, -1, -1):
        a, a_prev = ALPHA_BAR[kept[i]], (ALPHA_BAR[kept[i - 1]] if i else 1.0)
        new = []
        for v in x:
            eps = math.sqrt(1 - a) * (v - math.sqrt(a) * mu) / (a * s * s + 1 - a)
            x0 = (v - math.sqrt(1 - a) * eps) / math.sqrt(a)
            new.append(math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev) * eps)
        x = new
    assert torch.allclose(out.flatten(), torch.tensor(x, dtype=torch.float64), atol=1e-9)
    # Same noise, different RNG state: identical output. eta = 1 draws fresh noise each step.
    torch.manual_seed(99)
    again = d.ddim_sample_loop(GaussianDataOracle(mu, s), noise.shape, noise=noise, clip_denoised=False)
    assert torch.equal(out, again)
    noisy = d.ddim_sample_loop(GaussianDataOracle(mu, s), noise.shape, noise=noise, clip_denoised=False, eta=1.0)
    assert not torch.allclose(noisy, out, atol=1e-3)


def test_ddim_recovers_gaussian_data_with_enough_steps():
    torch.manual_seed(0)
    mu, s = 0.5, 0.25
    samples = create_diffusion("ddim250").ddim_sample_loop(
        GaussianDataOracle(mu, s), (20_000, 1, 1, 1), clip_denoised=False
    )
    assert samples.mean().item() == pytest.approx(mu, abs=0.01)
    assert samples.std().item() == pytest.approx(s, abs=0.01)


def test_point_mass_data_is_recovered_exactly():
    oracle = GaussianDataOracle(0.37, 0.0)
    for d in (create_diffusion("50"), create_diffusion("ddim10")):
        loop = d.ddim_sample_loop if d.num_timesteps == 10 else d.p_sample_loop
        out = loop(oracle, (8, 3, 2, 2), clip_denoised=False)
        assert torch.allclose(out, torch.full_like(out, 0.37), atol=1e-5)


def test_progressive_loops_yield_every_step():
    d = create_diffusion("ddim10")
    steps = list(d.ddim_sample_loop_progressive(GaussianDataOracle(0.1, 0.2), (2, 1, 2, 2), clip_denoised=False))
    assert len(steps) == 10 and all({"sample", "pred_xstart"} <= set(o) for o in steps)
    steps = list(create_diffusion("7").p_sample_loop_progressive(GaussianDataOracle(0.1, 0.2), (2, 1, 2, 2)))
    assert len(steps) == 7 and steps[-1]["sample"].shape == (2, 1, 2, 2)


def test_progress_bar_is_shown(capsys):
    d = create_diffusion("ddim10")
    d.ddim_sample_loop(GaussianDataOracle(0.0, 1.0), (1, 1, 2, 2), progress=True)
    d.p_sample_loop(GaussianDataOracle(0.0, 1.0), (1, 1, 2, 2), progress=False)
    err = capsys.readouterr().err
    assert "10/10" in err and err.count("10/10") == 1


def test_sampler_uses_the_device_of_a_bound_method():
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def forward_with_cfg(self, x, t, y=None):
            return torch.cat([x * self.w, torch.zeros_like(x)], dim=1)

    m = Tiny()
    out = create_diffusion("ddim5").ddim_sample_loop(m.forward_with_cfg, (2, 1, 2, 2), model_kwargs={"y": None})
    assert out.device == m.w.device and out.shape == (2, 1, 2, 2)


def test_mean_flat():
    x = torch.arange(24.0).reshape(2, 3, 4)
    assert mean_flat(x).tolist() == [5.5, 17.5]


def test_lazy_export():
    import dit_core

    assert dit_core.create_diffusion is create_diffusion


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(timestep_respacing="ddim300"), "ddim250' or 'ddim334"),
        (dict(timestep_respacing="ddimx"), "step count"),
        (dict(timestep_respacing="2000"), "cannot take 2000 steps"),
        (dict(timestep_respacing="abc"), "timestep_respacing"),
        (dict(timestep_respacing="0"), "positive"),
        (dict(timestep_respacing="", noise_schedule="cosinus"), "unknown noise_schedule 'cosinus'"),
        (dict(timestep_respacing="", diffusion_steps=0), "diffusion_steps"),
        (dict(timestep_respacing="", diffusion_steps=10), "linear schedule needs diffusion_steps >= 21"),
    ],
)
def test_bad_configuration_is_explained(kwargs, match):
    with pytest.raises(ValueError, match=match):
        create_diffusion(**kwargs)


def test_bad_timesteps_are_explained():
    d = create_diffusion("")
    x = torch.zeros(2, 1, 2, 2)
    with pytest.raises(ValueError, match=r"out of range.*0\.\.999"):
        d.q_sample(x, torch.tensor([0, 1000]))
    with pytest.raises(ValueError, match="out of range"):
        d.training_losses(GaussianDataOracle(0.0, 1.0), x, torch.tensor([-1, 3]))
    with pytest.raises(ValueError, match="integer"):
        d.q_sample(x, torch.tensor([0.5, 0.2]))
    with pytest.raises(ValueError, match=r"shape \(N,\)"):
        d.q_sample(x, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"0\.\.249"):
        create_diffusion("250").p_mean_variance(GaussianDataOracle(0.0, 1.0), x, torch.tensor([250, 0]))


def test_wrong_model_output_channels_are_explained():
    x = torch.zeros(2, 4, 2, 2)
    t = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="2\\*C channels"):
        create_diffusion("").training_losses(lambda x_, t_: x_, x, t)
    with pytest.raises(ValueError, match="learn_sigma=False"):
        create_diffusion("", learn_sigma=False).p_mean_variance(lambda x_, t_: torch.cat([x_, x_], 1), x, t)
    with pytest.raises(ValueError, match="noise has shape"):
        create_diffusion("ddim5").ddim_sample_loop(lambda x_, t_: x_, (2, 4, 2, 2), noise=torch.zeros(1, 4, 2, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    d = create_diffusion("")
    x0 = torch.rand(4, 2, 4, 4) * 2 - 1
    noise = torch.randn_like(x0)
    t = torch.tensor([0, 5, 500, 999])

    def model(x, ts):
        return torch.cat([0.8 * x, torch.tanh(x)], dim=1)

    cpu = d.training_losses(model, x0, t, noise=noise)["loss"]
    gpu = d.training_losses(model, x0.cuda(), t.cuda(), noise=noise.cuda())["loss"]
    assert gpu.device.type == "cuda" and torch.allclose(gpu.cpu(), cpu, rtol=1e-4, atol=1e-5)
    oracle = GaussianDataOracle(0.1, 0.3)
    oracle.acp = oracle.acp.cuda()
    z = torch.randn(8, 2, 4, 4)
    out_gpu = create_diffusion("ddim10").ddim_sample_loop(oracle, z.shape, noise=z.cuda(), clip_denoised=False)
    oracle.acp = oracle.acp.cpu()
    out_cpu = create_diffusion("ddim10").ddim_sample_loop(oracle, z.shape, noise=z, clip_denoised=False)
    assert torch.allclose(out_gpu.cpu(), out_cpu, atol=1e-4)
