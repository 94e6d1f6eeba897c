"""Gaussian diffusion: the forward process, the learned reverse process, its loss and its samplers.

Notation follows Ho et al. 2020 ("DDPM") and Nichol & Dhariwal 2021 ("Improved DDPM"):

* forward process  q(x_t | x_{t-1}) = N(sqrt(1 - beta_t) x_{t-1}, beta_t I)                 (DDPM eq. 2)
* in closed form   q(x_t | x_0) = N(sqrt(alpha_bar_t) x_0, (1 - alpha_bar_t) I)              (DDPM eq. 4)
* posterior        q(x_{t-1} | x_t, x_0) = N(mu_tilde_t, beta_tilde_t I)                      (DDPM eqs. 6-7)
* reverse process  p(x_{t-1} | x_t) = N(mu_theta(x_t, t), Sigma_theta(x_t, t))               (DDPM eq. 1)

Time indices are 0-based as in the official code: t = 0 is the first noising step and t = T - 1 the
last, so ``alphas_cumprod[t]`` is the paper's alpha_bar_{t+1}.

DiT (Peebles & Xie 2023, Sec. 3.1) trains the network to predict the noise eps (DDPM eq. 14) and the
variance (Improved DDPM Sec. 3.1, "learned range"), with the hybrid loss L_simple + L_vlb in which
L_vlb sees the predicted mean only through a stopped gradient (Improved DDPM Sec. 3.1).

The interface (class, method and argument names, the dicts returned) matches the official DiT code so
that training and sampling scripts written for it run unchanged.
"""

import enum
import math

import numpy as np
import torch

from .losses import discretized_gaussian_log_likelihood, mean_flat, normal_kl


class ModelMeanType(enum.Enum):
    """What the network's first C output channels predict."""

    PREVIOUS_X = enum.auto()  # the mean of x_{t-1} directly
    START_X = enum.auto()  # the clean sample x_0
    EPSILON = enum.auto()  # the noise eps (DDPM eq. 11-14; DiT's choice)


class ModelVarType(enum.Enum):
    """How the reverse-process variance Sigma_theta is chosen."""

    LEARNED = enum.auto()  # the network outputs log-variance directly
    FIXED_SMALL = enum.auto()  # beta_tilde_t, the posterior variance (DDPM Sec. 3.2)
    FIXED_LARGE = enum.auto()  # beta_t (DDPM Sec. 3.2)
    LEARNED_RANGE = enum.auto()  # interpolate log beta_t and log beta_tilde_t (Improved DDPM eq. 15; DiT)


class LossType(enum.Enum):
    MSE = enum.auto()  # L_simple on the mean prediction, + L_vlb when the variance is learned (hybrid)
    RESCALED_MSE = enum.auto()  # as MSE, with L_vlb scaled by T / 1000
    KL = enum.auto()  # the variational bound L_vlb alone
    RESCALED_KL = enum.auto()  # L_vlb times T: an estimate of the full bound

    def is_vb(self):
        return self in (LossType.KL, LossType.RESCALED_KL)


def _extract_into_tensor(arr, timesteps, like):
    """Look up ``arr[t]`` for each example's timestep, shaped (N, 1, ..., 1) to broadcast against ``like``.

    The schedule is stored in float64 numpy; the values come back on ``timesteps.device`` as float32
    (float64 when ``like`` is float64), the precision the official code uses, so results agree with it
    to float32 round-off for fp32 and bf16 inputs alike.
    """
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    # Cast on the CPU first: some accelerators (Apple MPS) have no float64.
    values = torch.from_numpy(arr).to(dtype).to(timesteps.device)[timesteps]
    return values.reshape(-1, *([1] * (like.dim() - 1)))


def _full(values, like):
    """Broadcast per-example values to the full shape of ``like`` (for returned variances)."""
    return values.expand(like.shape).contiguous()


def _check_model_output(output, x, channels, what):
    expected = (x.shape[0], channels, *x.shape[2:])
    if tuple(output.shape) != expected:
        raise ValueError(
            f"the model returned shape {tuple(output.shape)} but {what} needs {expected}. "
            "With learn_sigma=True the model must output 2*C channels (noise, then variance values); "
            "create the diffusion with the learn_sigma setting the model was built with."
        )


class GaussianDiffusion:
    """A discrete-time Gaussian diffusion with T = ``len(betas)`` steps.

    :param betas: the float64 variances beta_t of the forward process, one per step.
    :param model_mean_type: a :class:`ModelMeanType`, what the network predicts.
    :param model_var_type: a :class:`ModelVarType`, how the reverse variance is chosen.
    :param loss_type: a :class:`LossType`.

    Models are called as ``model(x_t, t, **model_kwargs)`` with ``t`` a long tensor of shape (N,).
    """

    def __init__(self, *, betas, model_mean_type, model_var_type, loss_type):
        self.model_mean_type = model_mean_type
        self.model_var_type = model_var_type
        self.loss_type = loss_type

        betas = np.asarray(betas, dtype=np.float64)
        if betas.ndim != 1 or len(betas) == 0:
            raise ValueError(f"betas must be a non-empty 1-D array, got shape {betas.shape}.")
        if not ((betas > 0).all() and (betas < 1).all()):
            raise ValueError("every beta must lie strictly between 0 and 1; check the noise schedule.")
        self.betas = betas
        self.num_timesteps = len(betas)

        # alpha_t = 1 - beta_t and alpha_bar_t = prod_{s<=t} alpha_s (DDPM, above eq. 4).
        alphas = 1.0 - betas
        self.alphas_cumprod = np.cumprod(alphas)
        self.alphas_cumprod_prev = np.append(1.0, self.alphas_cumprod[:-1])
        self.alphas_cumprod_next = np.append(self.alphas_cumprod[1:], 0.0)

        # For q(x_t | x_0) (DDPM eq. 4) and for turning a noise prediction into an x_0 prediction.
        self.sqrt_alphas_cumprod = np.sqrt(self.alphas_cumprod)
        self.sqrt_one_minus_alphas_cumprod = np.sqrt(1.0 - self.alphas_cumprod)
        self.log_one_minus_alphas_cumprod = np.log(1.0 - self.alphas_cumprod)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod - 1)

        # For the posterior q(x_{t-1} | x_t, x_0) (DDPM eqs. 6-7):
        # beta_tilde_t = (1 - alpha_bar_{t-1}) / (1 - alpha_bar_t) * beta_t and
        # mu_tilde_t = coef1 * x_0 + coef2 * x_t.
        self.posterior_variance = betas * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        # beta_tilde is 0 at the first step, so its log is clipped: step 0 borrows the value of step 1
        # (with a single step there is no step 1, and beta_0 stands in).
        first = self.posterior_variance[1] if self.num_timesteps > 1 else betas[0]
        self.posterior_log_variance_clipped = np.log(np.append(first, self.posterior_variance[1:]))
        self.posterior_mean_coef1 = betas * np.sqrt(self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_mean_coef2 = (1.0 - self.alphas_cumprod_prev) * np.sqrt(alphas) / (1.0 - self.alphas_cumprod)

    # ------------------------------------------------------------------ helpers

    def _wrap_model(self, model):
        """Hook for :class:`~dit_core.diffusion.respace.SpacedDiffusion`, which maps timesteps."""
        return model

    def _check_timesteps(self, t, x):
        """Clear errors for the usual mistakes with ``t`` (float times, wrong shape, out of range)."""
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"t must be a torch tensor of timestep indices, got {type(t).__name__}.")
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(
                f"t must hold integer timestep indices 0..{self.num_timesteps - 1}, got dtype {t.dtype}; "
                "draw it with torch.randint(0, diffusion.num_timesteps, (N,))."
            )
        if t.dim() != 1 or t.shape[0] != x.shape[0]:
            raise ValueError(
                f"t must have shape (N,) = ({x.shape[0]},), one timestep per example; got {tuple(t.shape)}."
            )
        if t.device != x.device:
            raise ValueError(f"t is on {t.device} but x is on {x.device}; put both on the same device.")
        if ((t < 0) | (t >= self.num_timesteps)).any():
            raise ValueError(
                f"timestep out of range: this diffusion has {self.num_timesteps} steps, so t must lie in "
                f"0..{self.num_timesteps - 1}; got values from {int(t.min())} to {int(t.max())}."
            )

    def _predict_xstart_from_eps(self, x_t, t, eps):
        """x_0 = (x_t - sqrt(1 - alpha_bar_t) eps) / sqrt(alpha_bar_t), DDPM eq. 4 solved for x_0."""
        return (
            _extract_into_tensor(self.sqrt_recip_alphas_cumprod, t, x_t) * x_t
            - _extract_into_tensor(self.sqrt_recipm1_alphas_cumprod, t, x_t) * eps
        )

    def _predict_eps_from_xstart(self, x_t, t, pred_xstart):
        """The inverse of :meth:`_predict_xstart_from_eps`."""
        return (
            _extract_into_tensor(self.sqrt_recip_alphas_cumprod, t, x_t) * x_t - pred_xstart
        ) / _extract_into_tensor(self.sqrt_recipm1_alphas_cumprod, t, x_t)

    def _predict_xstart_from_xprev(self, x_t, t, xprev):
        """Solve mu_tilde_t = coef1 x_0 + coef2 x_t (DDPM eq. 7) for x_0, given the mean of x_{t-1}."""
        return (
            xprev - _extract_into_tensor(self.posterior_mean_coef2, t, x_t) * x_t
        ) / _extract_into_tensor(self.posterior_mean_coef1, t, x_t)

    # ------------------------------------------------------------------ forward process

    def q_mean_variance(self, x_start, t):
        """Mean, variance and log-variance of q(x_t | x_0) (DDPM eq. 4)."""
        self._check_timesteps(t, x_start)
        mean = _extract_into_tensor(self.sqrt_alphas_cumprod, t, x_start) * x_start
        variance = _full(_extract_into_tensor(1.0 - self.alphas_cumprod, t, x_start), x_start)
        log_variance = _full(_extract_into_tensor(self.log_one_minus_alphas_cumprod, t, x_start), x_start)
        return mean, variance, log_variance

    def q_sample(self, x_start, t, noise=None):
        """Draw x_t ~ q(x_t | x_0): x_t = sqrt(alpha_bar_t) x_0 + sqrt(1 - alpha_bar_t) eps (DDPM eq. 4)."""
        self._check_timesteps(t, x_start)
        if noise is None:
            noise = torch.randn_like(x_start)
        if noise.shape != x_start.shape:
            raise ValueError(f"noise has shape {tuple(noise.shape)} but x_start has {tuple(x_start.shape)}.")
        return (
            _extract_into_tensor(self.sqrt_alphas_cumprod, t, x_start) * x_start
            + _extract_into_tensor(self.sqrt_one_minus_alphas_cumprod, t, x_start) * noise
        )

    def q_posterior_mean_variance(self, x_start, x_t, t):
        """Mean, variance and clipped log-variance of q(x_{t-1} | x_t, x_0) (DDPM eqs. 6-7)."""
        if x_start.shape != x_t.shape:
            raise ValueError(f"x_start {tuple(x_start.shape)} and x_t {tuple(x_t.shape)} must have the same shape.")
        mean = (
            _extract_into_tensor(self.posterior_mean_coef1, t, x_t) * x_start
            + _extract_into_tensor(self.posterior_mean_coef2, t, x_t) * x_t
        )
        variance = _full(_extract_into_tensor(self.posterior_variance, t, x_t), x_t)
        log_variance_clipped = _full(_extract_into_tensor(self.posterior_log_variance_clipped, t, x_t), x_t)
        return mean, variance, log_variance_clipped

    # ------------------------------------------------------------------ reverse process

    def p_mean_variance(self, model, x, t, clip_denoised=True, denoised_fn=None, model_kwargs=None):
        """Apply the model to get p(x_{t-1} | x_t) and a prediction of x_0.

        :param model: called as ``model(x, t, **model_kwargs)``.
        :param clip_denoised: clamp the predicted x_0 to [-1, 1] (right for images, not for VAE latents:
            DiT's sampler passes ``clip_denoised=False``).
        :param denoised_fn: optional function applied to the predicted x_0 before clipping.
        :return: dict with ``mean``, ``variance``, ``log_variance``, ``pred_xstart`` and ``extra``
            (anything the model returned after its output in a tuple, else None).
        """
        model = self._wrap_model(model)
        self._check_timesteps(t, x)
        model_kwargs = {} if model_kwargs is None else model_kwargs
        C = x.shape[1]
        model_output = model(x, t, **model_kwargs)
        extra = None
        if isinstance(model_output, tuple):
            model_output, extra = model_output

        if self.model_var_type in (ModelVarType.LEARNED, ModelVarType.LEARNED_RANGE):
            _check_model_output(model_output, x, 2 * C, "learned variance (learn_sigma=True)")
            model_output, model_var_values = torch.split(model_output, C, dim=1)
            if self.model_var_type == ModelVarType.LEARNED:
                model_log_variance = model_var_values
            else:
                # Improved DDPM eq. 15: Sigma = exp(v log beta_t + (1 - v) log beta_tilde_t) with the
                # network's output mapped from [-1, 1] to v in [0, 1].
                min_log = _extract_into_tensor(self.posterior_log_variance_clipped, t, x)
                max_log = _extract_into_tensor(np.log(self.betas), t, x)
                frac = (model_var_values + 1) / 2
                model_log_variance = frac * max_log + (1 - frac) * min_log
            model_variance = torch.exp(model_log_variance)
        else:
            _check_model_output(model_output, x, C, "a fixed variance (learn_sigma=False)")
            if self.model_var_type == ModelVarType.FIXED_LARGE:
                # sigma_t^2 = beta_t (DDPM Sec. 3.2), except that step 0 borrows beta_tilde of step 1, as the
                # official code does, for a better decoder log-likelihood.
                variance = self.betas.copy()
                if self.num_timesteps > 1:
                    variance[0] = self.posterior_variance[1]
                log_variance = np.log(variance)
            else:
                variance, log_variance = self.posterior_variance, self.posterior_log_variance_clipped
            model_variance = _full(_extract_into_tensor(variance, t, x), x)
            model_log_variance = _full(_extract_into_tensor(log_variance, t, x), x)

        def process_xstart(x0):
            if denoised_fn is not None:
                x0 = denoised_fn(x0)
            return x0.clamp(-1, 1) if clip_denoised else x0

        if self.model_mean_type == ModelMeanType.PREVIOUS_X:
            pred_xstart = process_xstart(self._predict_xstart_from_xprev(x, t, model_output))
            model_mean = model_output
        else:
            if self.model_mean_type == ModelMeanType.START_X:
                pred_xstart = process_xstart(model_output)
            else:
                pred_xstart = process_xstart(self._predict_xstart_from_eps(x, t, model_output))
            # The mean of p is the posterior mean with the predicted x_0 plugged in (DDPM eq. 7 / 11).
            model_mean, _, _ = self.q_posterior_mean_variance(pred_xstart, x, t)

        return {
            "mean": model_mean,
            "variance": model_variance,
            "log_variance": model_log_variance,
            "pred_xstart": pred_xstart,
            "extra": extra,
        }

    def condition_mean(self, cond_fn, p_mean_var, x, t, model_kwargs=None):
        """Classifier guidance on the mean: mu + Sigma * grad log p(y | x_t) (Dhariwal & Nichol 2021, Alg. 1).

        ``cond_fn(x, t, **model_kwargs)`` returns that gradient.
        """
        cond_fn = self._wrap_model(cond_fn)
        model_kwargs = {} if model_kwargs is None else model_kwargs
        gradient = cond_fn(x, t, **model_kwargs)
        return p_mean_var["mean"].float() + p_mean_var["variance"] * gradient.float()

    def condition_score(self, cond_fn, p_mean_var, x, t, model_kwargs=None):
        """Classifier guidance for DDIM: eps <- eps - sqrt(1 - alpha_bar_t) * grad (Dhariwal & Nichol 2021, Alg. 2).

        Returns a copy of ``p_mean_var`` with ``pred_xstart`` and ``mean`` recomputed from the shifted eps.
        """
        cond_fn = self._wrap_model(cond_fn)
        model_kwargs = {} if model_kwargs is None else model_kwargs
        alpha_bar = _extract_into_tensor(self.alphas_cumprod, t, x)
        eps = self._predict_eps_from_xstart(x, t, p_mean_var["pred_xstart"])
        eps = eps - (1 - alpha_bar).sqrt() * cond_fn(x, t, **model_kwargs)
        out = dict(p_mean_var)
        out["pred_xstart"] = self._predict_xstart_from_eps(x, t, eps)
        out["mean"], _, _ = self.q_posterior_mean_variance(out["pred_xstart"], x, t)
        return out

    # ------------------------------------------------------------------ ancestral (DDPM) sampling

    def p_sample(self, model, x, t, clip_denoised=True, denoised_fn=None, cond_fn=None, model_kwargs=None):
        """One ancestral step: x_{t-1} = mu_theta + sigma_t z, with no noise at t = 0 (DDPM Alg. 2).

        :return: dict with ``sample`` (x_{t-1}) and ``pred_xstart``.
        """
        out = self.p_mean_variance(model, x, t, clip_denoised, denoised_fn, model_kwargs)
        if cond_fn is not None:
            out["mean"] = self.condition_mean(cond_fn, out, x, t, model_kwargs)
        noise = torch.randn_like(x)
        nonzero_mask = (t != 0).to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))
        sample = out["mean"] + nonzero_mask * torch.exp(0.5 * out["log_variance"]) * noise
        return {"sample": sample, "pred_xstart": out["pred_xstart"]}

    def p_sample_loop(
        self, model, shape, noise=None, clip_denoised=True, denoised_fn=None, cond_fn=None,
        model_kwargs=None, device=None, progress=False,
    ):
        """Sample x_0 with DDPM Alg. 2, starting from ``noise`` (or fresh N(0, I) noise of ``shape``).

        Returns the final sample, a tensor of ``shape``. ``progress=True`` shows a tqdm bar.
        """
        final = None
        for final in self.p_sample_loop_progressive(
            model, shape, noise=noise, clip_denoised=clip_denoised, denoised_fn=denoised_fn,
            cond_fn=cond_fn, model_kwargs=model_kwargs, device=device, progress=progress,
        ):
            pass
        return final["sample"]

    def p_sample_loop_progressive(
        self, model, shape, noise=None, clip_denoised=True, denoised_fn=None, cond_fn=None,
        model_kwargs=None, device=None, progress=False,
    ):
        """Like :meth:`p_sample_loop` but yields the dict of every step (``sample``, ``pred_xstart``)."""
        yield from self._sample_loop_progressive(
            self.p_sample, model, shape, noise, device, progress,
            clip_denoised=clip_denoised, denoised_fn=denoised_fn, cond_fn=cond_fn, model_kwargs=model_kwargs,
        )

    # ------------------------------------------------------------------ DDIM sampling

    def ddim_sample(
        self, model, x, t, clip_denoised=True, denoised_fn=None, cond_fn=None, model_kwargs=None, eta=0.0,
    ):
        """One DDIM step (Song et al. 2021, eq. 12).

        x_{t-1} = sqrt(alpha_bar_{t-1}) x0_pred + sqrt(1 - alpha_bar_{t-1} - sigma^2) eps_pred + sigma z, with
        sigma = eta * sqrt((1 - alpha_bar_{t-1}) / (1 - alpha_bar_t)) * sqrt(1 - alpha_bar_t / alpha_bar_{t-1})
        (eq. 16). ``eta=0`` is deterministic; ``eta=1`` matches DDPM's posterior variance.
        """
        out = self.p_mean_variance(model, x, t, clip_denoised, denoised_fn, model_kwargs)
        if cond_fn is not None:
            out = self.condition_score(cond_fn, out, x, t, model_kwargs)
        # Re-derive eps from the (possibly clipped) x_0 prediction so the two stay consistent.
        eps = self._predict_eps_from_xstart(x, t, out["pred_xstart"])
        alpha_bar = _extract_into_tensor(self.alphas_cumprod, t, x)
        alpha_bar_prev = _extract_into_tensor(self.alphas_cumprod_prev, t, x)
        sigma = eta * torch.sqrt((1 - alpha_bar_prev) / (1 - alpha_bar)) * torch.sqrt(1 - alpha_bar / alpha_bar_prev)
        noise = torch.randn_like(x)
        mean_pred = out["pred_xstart"] * torch.sqrt(alpha_bar_prev) + torch.sqrt(1 - alpha_bar_prev - sigma**2) * eps
        nonzero_mask = (t != 0).to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))
        sample = mean_pred + nonzero_mask * sigma * noise
        return {"sample": sample, "pred_xstart": out["pred_xstart"]}

    def ddim_reverse_sample(
        self, model, x, t, clip_denoised=True, denoised_fn=None, cond_fn=None, model_kwargs=None, eta=0.0,
    ):
        """One deterministic DDIM step forward in time, x_t -> x_{t+1} (Song et al. 2021, eq. 13 run backwards).

        Used to encode an image into noise ("DDIM inversion"). Only ``eta=0`` is defined.
        """
        if eta != 0.0:
            raise ValueError(f"ddim_reverse_sample is only defined for eta=0 (deterministic), got eta={eta}.")
        out = self.p_mean_variance(model, x, t, clip_denoised, denoised_fn, model_kwargs)
        if cond_fn is not None:
            out = self.condition_score(cond_fn, out, x, t, model_kwargs)
        eps = self._predict_eps_from_xstart(x, t, out["pred_xstart"])
        alpha_bar_next = _extract_into_tensor(self.alphas_cumprod_next, t, x)
        mean_pred = out["pred_xstart"] * torch.sqrt(alpha_bar_next) + torch.sqrt(1 - alpha_bar_next) * eps
        return {"sample": mean_pred, "pred_xstart": out["pred_xstart"]}

    def ddim_sample_loop(
        self, model, shape, noise=None, clip_denoised=True, denoised_fn=None, cond_fn=None,
        model_kwargs=None, device=None, progress=False, eta=0.0,
    ):
        """Sample x_0 with DDIM; see :meth:`ddim_sample`. Returns the final sample."""
        final = None
        for final in self.ddim_sample_loop_progressive(
            model, shape, noise=noise, clip_denoised=clip_denoised, denoised_fn=denoised_fn,
            cond_fn=cond_fn, model_kwargs=model_kwargs, device=device, progress=progress, eta=eta,
        ):
            pass
        return final["sample"]

    def ddim_sample_loop_progressive(
        self, model, shape, noise=None, clip_denoised=True, denoised_fn=None, cond_fn=None,
        model_kwargs=None, device=None, progress=False, eta=0.0,
    ):
        """Like :meth:`ddim_sample_loop` but yields the dict of every step (``sample``, ``pred_xstart``)."""
        yield from self._sample_loop_progressive(
            self.ddim_sample, model, shape, noise, device, progress,
            clip_denoised=clip_denoised, denoised_fn=denoised_fn, cond_fn=cond_fn, model_kwargs=model_kwargs,
            eta=eta,
        )

    def _sample_loop_progressive(self, step, model, shape, noise, device, progress, **step_kwargs):
        """Run ``step`` from t = T-1 down to 0, yielding each step's output dict."""
        if not isinstance(shape, (tuple, list, torch.Size)):
            raise ValueError(f"shape must be a tuple such as (N, C, H, W), got {shape!r}.")
        if device is None:
            if noise is not None:
                device = noise.device
            elif isinstance(model, torch.nn.Module):
                device = next(model.parameters(), torch.empty(0)).device
            elif isinstance(getattr(model, "__self__", None), torch.nn.Module):  # a bound method like forward_with_cfg
                device = next(model.__self__.parameters(), torch.empty(0)).device
            else:
                device = torch.device("cpu")
        if noise is not None:
            if tuple(noise.shape) != tuple(shape):
                raise ValueError(f"noise has shape {tuple(noise.shape)} but shape is {tuple(shape)}.")
            img = noise.to(device)
        else:
            img = torch.randn(*shape, device=device)

        indices = range(self.num_timesteps - 1, -1, -1)
        if progress:
            from tqdm.auto import tqdm

            indices = tqdm(indices)
        for i in indices:
            t = torch.full((shape[0],), i, device=device, dtype=torch.long)
            with torch.no_grad():
                out = step(model, img, t, **step_kwargs)
            yield out
            img = out["sample"]

    # ------------------------------------------------------------------ losses

    def _vb_terms_bpd(self, model, x_start, x_t, t, clip_denoised=True, model_kwargs=None):
        """One term of the variational bound, in bits per dimension (DDPM eq. 5).

        L_{t-1} = KL(q(x_{t-1} | x_t, x_0) || p(x_{t-1} | x_t)) for t > 0, and the decoder negative
        log-likelihood L_0 = -log p(x_0 | x_1) at t = 0 (DDPM eq. 13).

        :return: dict with ``output`` (shape (N,)) and ``pred_xstart``.
        """
        true_mean, _, true_log_variance_clipped = self.q_posterior_mean_variance(x_start, x_t, t)
        out = self.p_mean_variance(model, x_t, t, clip_denoised=clip_denoised, model_kwargs=model_kwargs)
        kl = normal_kl(true_mean, true_log_variance_clipped, out["mean"], out["log_variance"])
        kl = mean_flat(kl) / math.log(2.0)
        decoder_nll = -discretized_gaussian_log_likelihood(
            x_start, means=out["mean"], log_scales=0.5 * out["log_variance"]
        )
        decoder_nll = mean_flat(decoder_nll) / math.log(2.0)
        output = torch.where(t == 0, decoder_nll, kl)
        return {"output": output, "pred_xstart": out["pred_xstart"]}

    def training_losses(self, model, x_start, t, model_kwargs=None, noise=None):
        """Training loss for each example of a batch, at the given timesteps.

        With DiT's settings (predict eps, learned-range variance, ``LossType.MSE``) this is the hybrid loss
        of Improved DDPM Sec. 3.1: ``mse`` = mean over pixels of (eps - eps_theta)^2 (L_simple, DDPM eq. 14),
        plus ``vb`` = L_vlb for the variance, computed with the predicted mean detached so that only
        L_simple trains the mean. ``LossType.RESCALED_MSE`` multiplies ``vb`` by T / 1000.

        :param model: called as ``model(x_t, t, **model_kwargs)``.
        :param x_start: clean data x_0, shape (N, C, ...).
        :param t: long tensor of shape (N,) with timestep indices in 0..T-1.
        :param noise: optional eps to use instead of fresh N(0, I) noise.
        :return: dict of tensors of shape (N,): ``loss`` and, for MSE losses, ``mse`` (and ``vb`` when the
            variance is learned).
        """
        model = self._wrap_model(model)
        model_kwargs = {} if model_kwargs is None else model_kwargs
        if noise is None:
            noise = torch.randn_like(x_start)
        x_t = self.q_sample(x_start, t, noise=noise)

        terms = {}
        if self.loss_type.is_vb():
            terms["loss"] = self._vb_terms_bpd(
                model, x_start, x_t, t, clip_denoised=False, model_kwargs=model_kwargs
            )["output"]
            if self.loss_type == LossType.RESCALED_KL:
                terms["loss"] = terms["loss"] * self.num_timesteps
            return terms

        model_output = model(x_t, t, **model_kwargs)
        if self.model_var_type in (ModelVarType.LEARNED, ModelVarType.LEARNED_RANGE):
            C = x_t.shape[1]
            _check_model_output(model_output, x_t, 2 * C, "learned variance (learn_sigma=True)")
            model_output, model_var_values = torch.split(model_output, C, dim=1)
            # Stop the gradient of L_vlb into the mean (Improved DDPM Sec. 3.1): the variance values keep
            # their graph, the mean prediction does not.
            frozen_out = torch.cat([model_output.detach(), model_var_values], dim=1)
            terms["vb"] = self._vb_terms_bpd(
                lambda *args, r=frozen_out: r, x_start, x_t, t, clip_denoised=False
            )["output"]
            if self.loss_type == LossType.RESCALED_MSE:
                # L_vlb is a sum over T terms, L_simple a mean: keep their balance when T != 1000.
                terms["vb"] = terms["vb"] * (self.num_timesteps / 1000.0)

        if self.model_mean_type == ModelMeanType.EPSILON:
            target = noise
        elif self.model_mean_type == ModelMeanType.START_X:
            target = x_start
        else:
            target = self.q_posterior_mean_variance(x_start, x_t, t)[0]
        _check_model_output(model_output, x_t, x_t.shape[1], "the mean prediction")
        terms["mse"] = mean_flat((target - model_output) ** 2)
        terms["loss"] = terms["mse"] + terms["vb"] if "vb" in terms else terms["mse"]
        return terms

    def _prior_bpd(self, x_start):
        """KL(q(x_T | x_0) || N(0, I)) in bits per dimension: the prior term L_T (DDPM eq. 5).

        It has no parameters, so it only matters for reporting the full bound.
        """
        t = torch.full((x_start.shape[0],), self.num_timesteps - 1, device=x_start.device, dtype=torch.long)
        qt_mean, _, qt_log_variance = self.q_mean_variance(x_start, t)
        return mean_flat(normal_kl(qt_mean, qt_log_variance, 0.0, 0.0)) / math.log(2.0)

    def calc_bpd_loop(self, model, x_start, clip_denoised=True, model_kwargs=None):
        """The full variational bound in bits per dimension, one term per timestep.

        :return: dict with ``total_bpd`` (N,), ``prior_bpd`` (N,), and (N, T) tensors ``vb``, ``xstart_mse``
            and ``mse`` (the noise-prediction error) whose column j belongs to timestep T-1-j.
        """
        vb, xstart_mse, mse = [], [], []
        for i in range(self.num_timesteps - 1, -1, -1):
            t = torch.full((x_start.shape[0],), i, device=x_start.device, dtype=torch.long)
            noise = torch.randn_like(x_start)
            x_t = self.q_sample(x_start, t, noise=noise)
            with torch.no_grad():
                out = self._vb_terms_bpd(model, x_start, x_t, t, clip_denoised=clip_denoised, model_kwargs=model_kwargs)
            vb.append(out["output"])
            xstart_mse.append(mean_flat((out["pred_xstart"] - x_start) ** 2))
            eps = self._predict_eps_from_xstart(x_t, t, out["pred_xstart"])
            mse.append(mean_flat((eps - noise) ** 2))
        # As in the official code, column j holds timestep T-1-j (the order of the loop).
        vb, xstart_mse, mse = (torch.stack(v, dim=1) for v in (vb, xstart_mse, mse))
        prior_bpd = self._prior_bpd(x_start)
        return {
            "total_bpd": vb.sum(dim=1) + prior_bpd,
            "prior_bpd": prior_bpd,
            "vb": vb,
            "xstart_mse": xstart_mse,
            "mse": mse,
        }
