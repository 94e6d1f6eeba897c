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
    """What the network's first C output channels predict (the official code's third choice, the mean of
    x_{t-1}, cannot be asked for through ``create_diffusion`` and is left out)."""

    START_X = enum.auto()  # the clean sample x_0
    EPSILON = enum.auto()  # the noise eps (DDPM eq. 11-14; DiT's choice)


class ModelVarType(enum.Enum):
    """How the reverse-process variance Sigma_theta is chosen (as with :class:`ModelMeanType`, only the choices
    ``create_diffusion`` reaches)."""

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


def schedule_arrays(betas) -> dict[str, np.ndarray]:
    """Every per-step number of the process, computed once from the betas in float64 (names as in the papers).

    ``alpha_bar[t]`` is the cumulative product of ``1 - beta`` (DDPM, above eq. 4), ``alpha_bar_prev`` and
    ``alpha_bar_next`` the same shifted by one step (1 before the first, 0 after the last); the posterior
    q(x_{t-1} | x_t, x_0) has variance ``posterior_var`` (beta_tilde_t) and mean
    ``posterior_coef_x0 * x_0 + posterior_coef_xt * x_t`` (DDPM eqs. 6-7).
    """
    betas = np.asarray(betas, dtype=np.float64)
    if betas.ndim != 1 or len(betas) == 0:
        raise ValueError(f"betas must be a non-empty 1-D array, got shape {betas.shape}.")
    if not ((betas > 0).all() and (betas < 1).all()):
        raise ValueError("every beta must lie strictly between 0 and 1; check the noise schedule.")
    alphas = 1.0 - betas
    alpha_bar = np.cumprod(alphas)
    alpha_bar_prev = np.append(1.0, alpha_bar[:-1])
    posterior_var = betas * (1.0 - alpha_bar_prev) / (1.0 - alpha_bar)
    # beta_tilde is 0 at the first step, so its log is clipped: step 0 borrows the value of step 1 (with a
    # single step there is no step 1, and beta_0 stands in).
    first = posterior_var[1] if len(betas) > 1 else betas[0]
    posterior_log_var = np.log(np.append(first, posterior_var[1:]))
    # The fixed "large" variance sigma_t^2 = beta_t (DDPM Sec. 3.2), except that step 0 borrows beta_tilde of
    # step 1, as the official code does, for a better decoder log-likelihood.
    large_var = betas.copy()
    if len(betas) > 1:
        large_var[0] = posterior_var[1]
    return {
        "beta": betas,
        "log_beta": np.log(betas),
        "alpha_bar": alpha_bar,
        "alpha_bar_prev": alpha_bar_prev,
        "alpha_bar_next": np.append(alpha_bar[1:], 0.0),
        "one_minus_alpha_bar": 1.0 - alpha_bar,
        # q(x_t | x_0) (DDPM eq. 4), and turning a noise prediction into an x_0 prediction
        "sqrt_alpha_bar": np.sqrt(alpha_bar),
        "sqrt_one_minus_alpha_bar": np.sqrt(1.0 - alpha_bar),
        "sqrt_recip_alpha_bar": np.sqrt(1.0 / alpha_bar),
        "sqrt_recipm1_alpha_bar": np.sqrt(1.0 / alpha_bar - 1),
        # the posterior q(x_{t-1} | x_t, x_0) (DDPM eqs. 6-7)
        "posterior_var": posterior_var,
        "posterior_log_var": posterior_log_var,
        "posterior_coef_x0": betas * np.sqrt(alpha_bar_prev) / (1.0 - alpha_bar),
        "posterior_coef_xt": (1.0 - alpha_bar_prev) * np.sqrt(alphas) / (1.0 - alpha_bar),
        "large_var": large_var,
        "large_log_var": np.log(large_var),
    }


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

    Models are called as ``model(x_t, t, **model_kwargs)`` with ``t`` a long tensor of shape (N,). The schedule
    (:func:`schedule_arrays`) is computed once in float64; its values are copied to each device (and dtype) the
    first time they are needed there, and looked up per example afterwards, without further copies.
    ``betas``, ``alphas_cumprod``, ``alphas_cumprod_prev``, ``alphas_cumprod_next``, ``posterior_variance`` and
    ``posterior_log_variance_clipped`` are the float64 numpy arrays under their official names.
    """

    def __init__(self, *, betas, model_mean_type, model_var_type, loss_type):
        self.model_mean_type = model_mean_type
        self.model_var_type = model_var_type
        self.loss_type = loss_type
        self.schedule = schedule_arrays(betas)
        self.num_timesteps = len(self.schedule["beta"])
        self._tables: dict = {}  # (device, dtype) -> {name: tensor of T values}

    # the schedule under the official names
    betas = property(lambda self: self.schedule["beta"])
    alphas_cumprod = property(lambda self: self.schedule["alpha_bar"])
    alphas_cumprod_prev = property(lambda self: self.schedule["alpha_bar_prev"])
    alphas_cumprod_next = property(lambda self: self.schedule["alpha_bar_next"])
    posterior_variance = property(lambda self: self.schedule["posterior_var"])
    posterior_log_variance_clipped = property(lambda self: self.schedule["posterior_log_var"])

    # ------------------------------------------------------------------ the schedule on a device

    def _at(self, name, t, like):
        """``schedule[name][t]`` for each example's timestep, shaped (N, 1, ..., 1) to broadcast against ``like``.

        The values are float32 (float64 when ``like`` is float64), the precision the official code uses, so
        results agree with it to float32 round-off for fp32 and bf16 inputs alike; they live on ``t``'s device.
        """
        dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
        table = self._tables.get((t.device, dtype))
        if table is None:
            names = list(self.schedule)
            stacked = torch.from_numpy(np.stack([self.schedule[n] for n in names]))
            # cast on the CPU first: some accelerators (Apple MPS) have no float64
            table = dict(zip(names, stacked.to(dtype).to(t.device).unbind(0)))
            self._tables[(t.device, dtype)] = table
        return table[name][t].reshape(-1, *([1] * (like.dim() - 1)))

    def _model_steps(self, t):
        """The step numbers the model was trained with (these; a respaced process maps its own)."""
        return t

    def _run(self, model, x, t, model_kwargs=None):
        """``model(x, t, **model_kwargs)``, with ``t`` given to the model as trained step numbers."""
        return model(x, self._model_steps(t), **(model_kwargs or {}))

    def _check_timesteps(self, t, x):
        """Clear errors for the usual mistakes with ``t`` (float times, wrong shape, out of range).

        The range is checked for CPU tensors only: on a GPU the check would make every call wait for the
        device (an out-of-range step fails there in the schedule lookup instead).
        """
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
        if t.device.type == "cpu" and ((t < 0) | (t >= self.num_timesteps)).any():
            raise ValueError(
                f"timestep out of range: this diffusion has {self.num_timesteps} steps, so t must lie in "
                f"0..{self.num_timesteps - 1}; got values from {int(t.min())} to {int(t.max())}."
            )

    def _x0_from_eps(self, x_t, t, eps):
        """x_0 = (x_t - sqrt(1 - alpha_bar_t) eps) / sqrt(alpha_bar_t), DDPM eq. 4 solved for x_0."""
        return self._at("sqrt_recip_alpha_bar", t, x_t) * x_t - self._at("sqrt_recipm1_alpha_bar", t, x_t) * eps

    def _eps_from_x0(self, x_t, t, x0):
        """The inverse of :meth:`_x0_from_eps`."""
        return (self._at("sqrt_recip_alpha_bar", t, x_t) * x_t - x0) / self._at("sqrt_recipm1_alpha_bar", t, x_t)

    # ------------------------------------------------------------------ forward process

    def q_sample(self, x_start, t, noise=None):
        """Draw x_t ~ q(x_t | x_0): x_t = sqrt(alpha_bar_t) x_0 + sqrt(1 - alpha_bar_t) eps (DDPM eq. 4)."""
        self._check_timesteps(t, x_start)
        if noise is None:
            noise = torch.randn_like(x_start)
        if noise.shape != x_start.shape:
            raise ValueError(f"noise has shape {tuple(noise.shape)} but x_start has {tuple(x_start.shape)}.")
        signal, noise_scale = self._at("sqrt_alpha_bar", t, x_start), self._at("sqrt_one_minus_alpha_bar", t, x_start)
        return signal * x_start + noise_scale * noise

    def q_posterior_mean_variance(self, x_start, x_t, t):
        """Mean, variance and clipped log-variance of q(x_{t-1} | x_t, x_0) (DDPM eqs. 6-7)."""
        if x_start.shape != x_t.shape:
            raise ValueError(f"x_start {tuple(x_start.shape)} and x_t {tuple(x_t.shape)} must have the same shape.")
        mean = self._posterior_mean(x_start, x_t, t)
        variance = _full(self._at("posterior_var", t, x_t), x_t)
        log_variance = _full(self._at("posterior_log_var", t, x_t), x_t)
        return mean, variance, log_variance

    def _posterior_mean(self, x_start, x_t, t):
        """mu_tilde_t(x_t, x_0) = coef_x0 x_0 + coef_xt x_t (DDPM eq. 7), without the full-size variance tensors
        that :meth:`q_posterior_mean_variance` returns beside it."""
        return self._at("posterior_coef_x0", t, x_t) * x_start + self._at("posterior_coef_xt", t, x_t) * x_t

    # ------------------------------------------------------------------ reverse process

    def _split_output(self, output, x):
        """The network's output as ``(prediction, variance values)``; the second is None for a fixed variance."""
        C = x.shape[1]
        if self.model_var_type == ModelVarType.LEARNED_RANGE:
            _check_model_output(output, x, 2 * C, "learned variance (learn_sigma=True)")
            return torch.split(output, C, dim=1)
        _check_model_output(output, x, C, "a fixed variance (learn_sigma=False)")
        return output, None

    def _reverse_log_variance(self, var_values, x, t):
        """log Sigma_theta of p(x_{t-1} | x_t): interpolated by the network, or one of the two fixed choices."""
        if self.model_var_type == ModelVarType.LEARNED_RANGE:
            # Improved DDPM eq. 15: Sigma = exp(v log beta_t + (1 - v) log beta_tilde_t) with the network's
            # output mapped from [-1, 1] to v in [0, 1].
            frac = (var_values + 1) / 2
            return frac * self._at("log_beta", t, x) + (1 - frac) * self._at("posterior_log_var", t, x)
        name = "large_log_var" if self.model_var_type == ModelVarType.FIXED_LARGE else "posterior_log_var"
        return _full(self._at(name, t, x), x)

    def p_mean_variance(self, model, x, t, clip_denoised=True, denoised_fn=None, model_kwargs=None):
        """Apply the model to get p(x_{t-1} | x_t) and a prediction of x_0.

        :param model: called as ``model(x, t, **model_kwargs)``.
        :param clip_denoised: clamp the predicted x_0 to [-1, 1] (right for images, not for VAE latents:
            DiT's sampler passes ``clip_denoised=False``).
        :param denoised_fn: optional function applied to the predicted x_0 before clipping.
        :return: dict with ``mean``, ``variance``, ``log_variance``, ``pred_xstart`` and ``extra``
            (anything the model returned after its output in a tuple, else None).
        """
        self._check_timesteps(t, x)
        output = self._run(model, x, t, model_kwargs)
        extra = None
        if isinstance(output, tuple):
            output, extra = output
        return dict(self._reverse(output, x, t, clip_denoised, denoised_fn), extra=extra)

    def _reverse(self, output, x, t, clip_denoised=False, denoised_fn=None):
        """p(x_{t-1} | x_t) from the network's ``output``: ``mean``, ``variance``, ``log_variance``, ``pred_xstart``."""
        prediction, var_values = self._split_output(output, x)
        log_variance = self._reverse_log_variance(var_values, x, t)
        if self.model_var_type == ModelVarType.FIXED_LARGE:
            variance = _full(self._at("large_var", t, x), x)
        elif self.model_var_type == ModelVarType.FIXED_SMALL:
            variance = _full(self._at("posterior_var", t, x), x)
        else:
            variance = torch.exp(log_variance)

        def finish(x0):
            if denoised_fn is not None:
                x0 = denoised_fn(x0)
            return x0.clamp(-1, 1) if clip_denoised else x0

        predicts_x0 = self.model_mean_type == ModelMeanType.START_X
        x0 = finish(prediction if predicts_x0 else self._x0_from_eps(x, t, prediction))
        # The mean of p is the posterior mean with the predicted x_0 plugged in (DDPM eq. 7 / 11).
        mean = self._posterior_mean(x0, x, t)
        return {"mean": mean, "variance": variance, "log_variance": log_variance, "pred_xstart": x0}

    # ------------------------------------------------------------------ ancestral (DDPM) sampling

    def p_sample(self, model, x, t, clip_denoised=True, denoised_fn=None, model_kwargs=None, noise=None):
        """One ancestral step: x_{t-1} = mu_theta + sigma_t z, with no noise at t = 0 (DDPM Alg. 2); ``noise``:
        the draw z (default: fresh N(0, I)).

        :return: dict with ``sample`` (x_{t-1}) and ``pred_xstart``.
        """
        out = self.p_mean_variance(model, x, t, clip_denoised, denoised_fn, model_kwargs)
        noise = torch.randn_like(x) if noise is None else noise
        nonzero_mask = (t != 0).to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))
        sample = out["mean"] + nonzero_mask * torch.exp(0.5 * out["log_variance"]) * noise
        return {"sample": sample, "pred_xstart": out["pred_xstart"]}

    def p_sample_loop(
        self, model, shape, noise=None, clip_denoised=True, denoised_fn=None,
        model_kwargs=None, device=None, progress=False,
    ):
        """Sample x_0 with DDPM Alg. 2, starting from ``noise`` (or fresh N(0, I) noise of ``shape``).

        Returns the final sample, a tensor of ``shape``. ``progress=True`` shows a tqdm bar.
        """
        final = None
        for final in self.p_sample_loop_progressive(
            model, shape, noise=noise, clip_denoised=clip_denoised, denoised_fn=denoised_fn,
            model_kwargs=model_kwargs, device=device, progress=progress,
        ):
            pass
        return final["sample"]

    def p_sample_loop_progressive(
        self, model, shape, noise=None, clip_denoised=True, denoised_fn=None,
        model_kwargs=None, device=None, progress=False,
    ):
        """Like :meth:`p_sample_loop` but yields the dict of every step (``sample``, ``pred_xstart``)."""
        yield from self._sample_loop_progressive(
            self.p_sample, model, shape, noise, device, progress,
            clip_denoised=clip_denoised, denoised_fn=denoised_fn, model_kwargs=model_kwargs,
        )

    # ------------------------------------------------------------------ DDIM sampling

    def ddim_sample(
        self, model, x, t, clip_denoised=True, denoised_fn=None, model_kwargs=None, eta=0.0, noise=None,
    ):
        """One DDIM step (Song et al. 2021, eq. 12).

        x_{t-1} = sqrt(alpha_bar_{t-1}) x0_pred + sqrt(1 - alpha_bar_{t-1} - sigma^2) eps_pred + sigma z, with
        sigma = eta * sqrt((1 - alpha_bar_{t-1}) / (1 - alpha_bar_t)) * sqrt(1 - alpha_bar_t / alpha_bar_{t-1})
        (eq. 16). ``eta=0`` is deterministic; ``eta=1`` matches DDPM's posterior variance. ``noise``: the draw z
        (default: fresh N(0, I)).
        """
        out = self.p_mean_variance(model, x, t, clip_denoised, denoised_fn, model_kwargs)
        # Re-derive eps from the (possibly clipped) x_0 prediction so the two stay consistent.
        eps = self._eps_from_x0(x, t, out["pred_xstart"])
        alpha_bar = self._at("alpha_bar", t, x)
        alpha_bar_prev = self._at("alpha_bar_prev", t, x)
        sigma = eta * torch.sqrt((1 - alpha_bar_prev) / (1 - alpha_bar)) * torch.sqrt(1 - alpha_bar / alpha_bar_prev)
        noise = torch.randn_like(x) if noise is None else noise
        mean_pred = out["pred_xstart"] * torch.sqrt(alpha_bar_prev) + torch.sqrt(1 - alpha_bar_prev - sigma**2) * eps
        nonzero_mask = (t != 0).to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))
        sample = mean_pred + nonzero_mask * sigma * noise
        return {"sample": sample, "pred_xstart": out["pred_xstart"]}

    def ddim_sample_loop(
        self, model, shape, noise=None, clip_denoised=True, denoised_fn=None,
        model_kwargs=None, device=None, progress=False, eta=0.0,
    ):
        """Sample x_0 with DDIM; see :meth:`ddim_sample`. Returns the final sample."""
        final = None
        for final in self.ddim_sample_loop_progressive(
            model, shape, noise=noise, clip_denoised=clip_denoised, denoised_fn=denoised_fn,
            model_kwargs=model_kwargs, device=device, progress=progress, eta=eta,
        ):
            pass
        return final["sample"]

    def ddim_sample_loop_progressive(
        self, model, shape, noise=None, clip_denoised=True, denoised_fn=None,
        model_kwargs=None, device=None, progress=False, eta=0.0,
    ):
        """Like :meth:`ddim_sample_loop` but yields the dict of every step (``sample``, ``pred_xstart``)."""
        yield from self._sample_loop_progressive(
            self.ddim_sample, model, shape, noise, device, progress,
            clip_denoised=clip_denoised, denoised_fn=denoised_fn, model_kwargs=model_kwargs,
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

    def _vb_term(self, reverse, x_start, x_t, t, reduce=mean_flat):
        """One term of the variational bound, in bits per dimension (DDPM eq. 5), for the reverse step
        ``reverse`` (a :meth:`p_mean_variance` result): L_{t-1} = KL(q(x_{t-1} | x_t, x_0) || p(x_{t-1} | x_t))
        for t > 0, and the decoder negative log-likelihood L_0 = -log p(x_0 | x_1) at t = 0 (DDPM eq. 13).
        Shape (N,), each example's map reduced by ``reduce``."""
        true_mean, _, true_log_variance = self.q_posterior_mean_variance(x_start, x_t, t)
        kl = reduce(normal_kl(true_mean, true_log_variance, reverse["mean"], reverse["log_variance"]))
        nll = -discretized_gaussian_log_likelihood(x_start, means=reverse["mean"],
                                                   log_scales=0.5 * reverse["log_variance"])
        return torch.where(t == 0, reduce(nll), kl) / math.log(2.0)

    def training_losses(self, model, x_start, t, model_kwargs=None, noise=None, reduce=mean_flat):
        """Training loss for each example of a batch, at the given timesteps.

        With DiT's settings (predict eps, learned-range variance, ``LossType.MSE``) this is the hybrid loss
        of Improved DDPM Sec. 3.1: ``mse`` = mean over pixels of (eps - eps_theta)^2 (L_simple, DDPM eq. 14),
        plus ``vb`` = L_vlb for the variance, computed with the predicted mean detached so that only
        L_simple trains the mean. ``LossType.RESCALED_MSE`` multiplies ``vb`` by T / 1000.

        :param model: called as ``model(x_t, t, **model_kwargs)``.
        :param x_start: clean data x_0, shape (N, C, ...).
        :param t: long tensor of shape (N,) with timestep indices in 0..T-1.
        :param noise: optional eps to use instead of fresh N(0, I) noise.
        :param reduce: turns each elementwise map ``(N, C, H, W)`` into one number per example (default: the
            mean; masked training averages over the kept tokens, :func:`dit_core.train.objectives.token_mean`).
        :return: dict of tensors of shape (N,): ``loss`` and, for MSE losses, ``mse`` (and ``vb`` when the
            variance is learned).
        """
        if noise is None:
            noise = torch.randn_like(x_start)
        x_t = self.q_sample(x_start, t, noise=noise)
        output = self._run(model, x_t, t, model_kwargs)
        if self.loss_type.is_vb():
            loss = self._vb_term(self._reverse(output, x_t, t), x_start, x_t, t, reduce)
            return {"loss": loss * self.num_timesteps if self.loss_type == LossType.RESCALED_KL else loss}

        terms = {}
        prediction, var_values = self._split_output(output, x_t)
        if var_values is not None:
            # Stop the gradient of L_vlb into the mean (Improved DDPM Sec. 3.1): the variance values keep
            # their graph, the mean prediction does not.
            frozen = torch.cat([prediction.detach(), var_values], dim=1)
            terms["vb"] = self._vb_term(self._reverse(frozen, x_t, t), x_start, x_t, t, reduce)
            if self.loss_type == LossType.RESCALED_MSE:
                # L_vlb is a sum over T terms, L_simple a mean: keep their balance when T != 1000.
                terms["vb"] = terms["vb"] * (self.num_timesteps / 1000.0)
        target = x_start if self.model_mean_type == ModelMeanType.START_X else noise
        terms["mse"] = reduce((target - prediction) ** 2)
        terms["loss"] = terms["mse"] + terms["vb"] if "vb" in terms else terms["mse"]
        return terms
