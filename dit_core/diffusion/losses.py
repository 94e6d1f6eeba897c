"""The small probability formulas behind the diffusion losses.

* :func:`normal_kl` -- KL divergence between two Gaussians, the terms L_{t-1} of the variational bound
  (Ho et al. 2020, eq. (5)).
* :func:`discretized_gaussian_log_likelihood` -- the decoder term L_0: the probability that a Gaussian
  lands in the bin of width 2/255 around each pixel value (Ho et al. 2020, eq. (13)).
* :func:`mean_flat` -- average over every dimension but the batch, giving one number per example.

All functions work elementwise on tensors and return values in nats; the diffusion divides by log(2)
to report bits.
"""

import math

import torch


def mean_flat(x):
    """Mean over all dimensions except the first (batch) one: shape (N, ...) -> (N,)."""
    return x.mean(dim=tuple(range(1, x.dim())))


def normal_kl(mean1, logvar1, mean2, logvar2):
    """KL( N(mean1, exp(logvar1)) || N(mean2, exp(logvar2)) ), elementwise, in nats.

    The closed form for two Gaussians with variances s1^2 = exp(logvar1), s2^2 = exp(logvar2):
    KL = 1/2 * ( -1 + log(s2^2 / s1^2) + s1^2 / s2^2 + (mean1 - mean2)^2 / s2^2 ).
    Arguments broadcast; Python floats are allowed as long as one argument is a tensor.
    """
    tensor = next((a for a in (mean1, logvar1, mean2, logvar2) if isinstance(a, torch.Tensor)), None)
    if tensor is None:
        raise ValueError("normal_kl needs at least one torch.Tensor argument; got only Python numbers.")
    # torch.exp does not take Python floats, so turn the log-variances into tensors like `tensor`.
    logvar1, logvar2 = (
        v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=tensor.dtype, device=tensor.device)
        for v in (logvar1, logvar2)
    )
    return 0.5 * (
        -1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2)
    )


def approx_standard_normal_cdf(x):
    """The tanh approximation of the standard normal CDF, Phi(x) ~ 1/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    This is the approximation the DDPM and DiT code use (its absolute error is below 2e-4); keeping it
    reproduces their loss values exactly.
    """
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


def discretized_gaussian_log_likelihood(x, *, means, log_scales):
    """Log-probability (nats) of the 8-bit image ``x`` under a Gaussian discretized to 256 bins.

    Ho et al. 2020, eq. (13): pixel values are scaled to [-1, 1], so bin edges sit at x -/+ 1/255.
    The probability of a pixel is Phi((x + 1/255 - mean) / scale) - Phi((x - 1/255 - mean) / scale),
    except that the outermost bins extend to -inf (x = -1) and +inf (x = 1).

    :param x: targets in [-1, 1], assumed to come from uint8 values.
    :param means: Gaussian means, same shape as ``x``.
    :param log_scales: log standard deviations (log sigma, i.e. half the log-variance), same shape.
    """
    if not (x.shape == means.shape == log_scales.shape):
        raise ValueError(
            f"x, means and log_scales must have the same shape, got {tuple(x.shape)}, "
            f"{tuple(means.shape)} and {tuple(log_scales.shape)}."
        )
    centered = x - means
    inv_std = torch.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv_std * (centered + 1.0 / 255.0))  # upper bin edge
    cdf_min = approx_standard_normal_cdf(inv_std * (centered - 1.0 / 255.0))  # lower bin edge
    # Clamp before the log so that far-away bins give a large finite penalty instead of -inf.
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    log_cdf_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    return torch.where(
        x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_cdf_delta)
    )
