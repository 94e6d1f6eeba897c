"""An official-style reference: DiT, its Gaussian diffusion loss and its guided DDPM sampler, computed with the
plain operations the official code uses, in fp32. Written for this project's benchmarks from the paper and the
published key layout (``shared/reference``); no line is taken from the official repository (its licence is
non-commercial), but every operation that costs time is the one it performs:

* the model: timm-style modules (``PatchEmbed`` with an identity norm, ``Attention`` that reshapes one ``qkv``
  projection and calls ``F.scaled_dot_product_attention`` as timm's fused path does, ``Mlp`` with zero-rate
  dropouts), ``modulate`` as ``x * (1 + scale) + shift``, the six adaLN vectors from one linear layer and
  ``chunk``, the sinusoidal timestep code rebuilt at every call, ``unpatchify`` with ``einsum``;
  ``forward_with_cfg`` takes the first half of the batch, concatenates it with itself, runs the model and guides the
  first three noise channels (the official sampler's quirk);
* the diffusion (derived from ADM): every per-step number is a float64 numpy array; each lookup converts the whole
  array to a tensor, indexes it, casts it to float32 and broadcasts it by adding a tensor of zeros of the full
  shape (``extract``), and ``log(betas)`` is recomputed in numpy at each variance interpolation. A respaced
  process maps its step numbers through a tensor built at every model call (both in the loss and in sampling);
* the training step: ``model.train()`` (label dropout inside the model), the hybrid loss, ``zero_grad`` after the
  forward pass, PyTorch's default AdamW (on the CPU: one loop over the parameters), an EMA by ``mul_`` and ``add_``
  per parameter;
* sampling: ``p_sample_loop`` of ``forward_with_cfg`` on the doubled batch (both halves carry the same noise, and
  the diffusion's arithmetic runs on all of it), then the first half is kept.

``benchmarks/cpu_vs_official.py`` times it against ``dit_core``; ``tests/test_official_style.py`` checks that it
computes what ``dit_core`` computes (and the float64 reference forward of ``tests/reference_dit.py``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ------------------------------------------------------------------------------------------------------------
# The model, module by module as timm and the official DiT build it
# ------------------------------------------------------------------------------------------------------------


class PatchEmbed(nn.Module):
    def __init__(self, img_size, patch_size, in_chans, embed_dim):
        super().__init__()
        self.img_size = (img_size, img_size)
        self.patch_size = (patch_size, patch_size)
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=True)
        self.norm = nn.Identity()

    def forward(self, x):
        if tuple(x.shape[-2:]) != self.img_size:
            raise ValueError(f"input size {tuple(x.shape[-2:])} != {self.img_size}")
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


class Attention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
        x = x.transpose(1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(x))


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.drop1 = nn.Dropout(0.0)
        self.norm = nn.Identity()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(0.0)

    def forward(self, x):
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden, freq_size=256):
        super().__init__()
        self.freq_size = freq_size
        self.mlp = nn.Sequential(nn.Linear(freq_size, hidden, bias=True), nn.SiLU(), nn.Linear(hidden, hidden, bias=True))

    @staticmethod
    def timestep_embedding(t, dim, max_period=10000):
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(0, half, dtype=torch.float32) / half).to(t.device)
        args = t[:, None].float() * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    def forward(self, t):
        return self.mlp(self.timestep_embedding(t, self.freq_size))


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes, hidden, dropout_prob):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden)
        self.num_classes, self.dropout_prob = num_classes, dropout_prob

    def forward(self, labels, train, force_drop_ids=None):
        if (train and self.dropout_prob > 0) or force_drop_ids is not None:
            drop = (torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob if force_drop_ids is None
                    else force_drop_ids == 1)
            labels = torch.where(drop, self.num_classes, labels)
        return self.embedding_table(labels)


class DiTBlock(nn.Module):
    def __init__(self, hidden, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden, num_heads)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden, int(hidden * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden, bias=True))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden, patch, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, patch * patch * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden, bias=True))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class OfficialStyleDiT(nn.Module):
    """DiT with the official key layout, computed as the official model computes it. Its weights are random and
    non-zero (no adaLN-Zero), so that every weight takes part; load them into ``dit_core``'s DiT with
    ``load_state_dict(..., strict=True)``."""

    def __init__(self, input_size=32, patch_size=2, in_channels=4, hidden_size=384, depth=12, num_heads=6,
                 mlp_ratio=4.0, class_dropout_prob=0.1, num_classes=1000, learn_sigma=True, seed=0, guided_channels=3):
        super().__init__()
        self.guided_channels = guided_channels  # the official code guides 3 (latent) channels
        self.in_channels, self.out_channels = in_channels, in_channels * 2 if learn_sigma else in_channels
        self.patch_size, self.num_heads = patch_size, num_heads
        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.x_embedder.num_patches, hidden_size), requires_grad=False)
        self.blocks = nn.ModuleList([DiTBlock(hidden_size, num_heads, mlp_ratio) for _ in range(depth)])
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                fan_in = p[0].numel() if p.dim() > 1 and "embedding_table" not in name else 1
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / math.sqrt(fan_in) if fan_in > 1 else 0.1))

    def unpatchify(self, x):
        c, p = self.out_channels, self.x_embedder.patch_size[0]
        h = w = int(x.shape[1] ** 0.5)
        x = x.reshape(shape=(x.shape[0], h, w, p, p, c))
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(shape=(x.shape[0], c, h * p, h * p))

    def forward(self, x, t, y):
        x = self.x_embedder(x) + self.pos_embed
        c = self.t_embedder(t) + self.y_embedder(y, self.training)
        for block in self.blocks:
            x = block(x, c)
        return self.unpatchify(self.final_layer(x, c))

    def forward_with_cfg(self, x, t, y, cfg_scale):
        half = x[: len(x) // 2]
        combined = torch.cat([half, half], dim=0)
        model_out = self.forward(combined, t, y)
        eps, rest = model_out[:, :self.guided_channels], model_out[:, self.guided_channels:]
        cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
        half_eps = uncond_eps + cfg_scale * (cond_eps - uncond_eps)
        eps = torch.cat([half_eps, half_eps], dim=0)
        return torch.cat([eps, rest], dim=1)


# ------------------------------------------------------------------------------------------------------------
# The Gaussian diffusion as the ADM-derived code computes it: numpy schedules, a tensor built at every lookup
# ------------------------------------------------------------------------------------------------------------


def extract(arr: np.ndarray, timesteps: torch.Tensor, broadcast_shape) -> torch.Tensor:
    res = torch.from_numpy(arr).to(device=timesteps.device)[timesteps].float()
    while len(res.shape) < len(broadcast_shape):
        res = res[..., None]
    return res + torch.zeros(broadcast_shape, device=timesteps.device)


def mean_flat(x):
    return x.mean(dim=list(range(1, len(x.shape))))


def normal_kl(mean1, logvar1, mean2, logvar2):
    tensor = next(o for o in (mean1, logvar1, mean2, logvar2) if isinstance(o, torch.Tensor))
    logvar1, logvar2 = (v if isinstance(v, torch.Tensor) else torch.tensor(v).to(tensor) for v in (logvar1, logvar2))
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + ((mean1 - mean2) ** 2) * torch.exp(-logvar2))


def approx_standard_normal_cdf(x):
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


def discretized_gaussian_log_likelihood(x, means, log_scales):
    centered = x - means
    inv_stdv = torch.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv_stdv * (centered + 1.0 / 255.0))
    cdf_min = approx_standard_normal_cdf(inv_stdv * (centered - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    cdf_delta = cdf_plus - cdf_min
    return torch.where(x < -0.999, log_cdf_plus,
                       torch.where(x > 0.999, log_one_minus_cdf_min, torch.log(cdf_delta.clamp(min=1e-12))))


def kept_steps(num_timesteps: int, count: int) -> list[int]:
    """``count`` evenly spaced steps of ``num_timesteps``, first and last included (the respacing ``"N"``)."""
    if count == num_timesteps:
        return list(range(num_timesteps))
    stride = (num_timesteps - 1) / (count - 1)
    kept, pos = [], 0.0
    for _ in range(count):
        kept.append(round(pos))
        pos += stride
    return kept


class OfficialStyleDiffusion:
    """DDPM with DiT's settings (linear betas, predict eps, learned-range variance, hybrid loss), respaced to
    ``steps`` of the 1000 trained steps (all of them for training)."""

    def __init__(self, steps: int | None = None, num_train_steps: int = 1000, betas: np.ndarray | None = None,
                 use_timesteps: list[int] | None = None):
        base = (np.linspace(1e-4 * 1000 / num_train_steps, 0.02 * 1000 / num_train_steps, num_train_steps,
                            dtype=np.float64) if betas is None else np.asarray(betas, dtype=np.float64))
        self.timestep_map = sorted(use_timesteps) if use_timesteps else kept_steps(len(base), steps or len(base))
        keep = set(self.timestep_map)
        last, new_betas = 1.0, []
        for i, ab in enumerate(np.cumprod(1.0 - base)):
            if i in keep:
                new_betas.append(1 - ab / last)
                last = ab
        betas = np.array(new_betas, dtype=np.float64)
        self.betas, self.num_timesteps = betas, len(betas)
        alphas = 1.0 - betas
        self.alphas_cumprod = np.cumprod(alphas, axis=0)
        self.alphas_cumprod_prev = np.append(1.0, self.alphas_cumprod[:-1])
        self.sqrt_alphas_cumprod = np.sqrt(self.alphas_cumprod)
        self.sqrt_one_minus_alphas_cumprod = np.sqrt(1.0 - self.alphas_cumprod)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod - 1)
        self.posterior_variance = betas * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_log_variance_clipped = np.log(np.append(self.posterior_variance[1], self.posterior_variance[1:]))
        self.posterior_mean_coef1 = betas * np.sqrt(self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_mean_coef2 = (1.0 - self.alphas_cumprod_prev) * np.sqrt(alphas) / (1.0 - self.alphas_cumprod)

    def _wrap(self, model):
        def wrapped(x, ts, **kwargs):
            map_tensor = torch.tensor(self.timestep_map, device=ts.device, dtype=ts.dtype)
            return model(x, map_tensor[ts], **kwargs)
        return wrapped

    def q_sample(self, x_start, t, noise):
        return (extract(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
                + extract(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise)

    def q_posterior_mean_variance(self, x_start, x_t, t):
        mean = (extract(self.posterior_mean_coef1, t, x_t.shape) * x_start
                + extract(self.posterior_mean_coef2, t, x_t.shape) * x_t)
        return (mean, extract(self.posterior_variance, t, x_t.shape),
                extract(self.posterior_log_variance_clipped, t, x_t.shape))

    def p_mean_variance(self, model, x, t, clip_denoised=True, model_kwargs=None):
        model = self._wrap(model)
        c = x.shape[1]
        model_output = model(x, t, **(model_kwargs or {}))
        model_output, model_var_values = torch.split(model_output, c, dim=1)
        min_log = extract(self.posterior_log_variance_clipped, t, x.shape)
        max_log = extract(np.log(self.betas), t, x.shape)
        frac = (model_var_values + 1) / 2
        model_log_variance = frac * max_log + (1 - frac) * min_log
        model_variance = torch.exp(model_log_variance)
        pred_xstart = (extract(self.sqrt_recip_alphas_cumprod, t, x.shape) * x
                       - extract(self.sqrt_recipm1_alphas_cumprod, t, x.shape) * model_output)
        if clip_denoised:
            pred_xstart = pred_xstart.clamp(-1, 1)
        model_mean, _, _ = self.q_posterior_mean_variance(pred_xstart, x, t)
        return dict(mean=model_mean, variance=model_variance, log_variance=model_log_variance, pred_xstart=pred_xstart)

    def _vb_terms_bpd(self, model, x_start, x_t, t):
        true_mean, _, true_log_variance = self.q_posterior_mean_variance(x_start, x_t, t)
        out = self.p_mean_variance(model, x_t, t, clip_denoised=False)
        kl = mean_flat(normal_kl(true_mean, true_log_variance, out["mean"], out["log_variance"])) / np.log(2.0)
        nll = -discretized_gaussian_log_likelihood(x_start, means=out["mean"], log_scales=0.5 * out["log_variance"])
        nll = mean_flat(nll) / np.log(2.0)
        return torch.where(t == 0, nll, kl)

    def training_losses(self, model, x_start, t, model_kwargs=None, noise=None):
        model = self._wrap(model)
        if noise is None:
            noise = torch.randn_like(x_start)
        x_t = self.q_sample(x_start, t, noise)
        model_output = model(x_t, t, **(model_kwargs or {}))
        c = x_t.shape[1]
        if model_output.shape != (x_t.shape[0], 2 * c, *x_t.shape[2:]):
            raise ValueError(f"model output {tuple(model_output.shape)} for input {tuple(x_t.shape)}")
        model_output, model_var_values = torch.split(model_output, c, dim=1)
        frozen = torch.cat([model_output.detach(), model_var_values], dim=1)
        # the stored output goes through the same step-number map as a model call (identity for 1000 steps)
        vb = self._vb_terms_bpd(lambda *args, r=frozen: r, x_start, x_t, t)
        mse = mean_flat((noise - model_output) ** 2)
        return {"loss": mse + vb, "mse": mse, "vb": vb}

    def p_sample(self, model, x, t, clip_denoised=True, model_kwargs=None):
        out = self.p_mean_variance(model, x, t, clip_denoised, model_kwargs)
        noise = torch.randn_like(x)
        nonzero_mask = (t != 0).float().view(-1, *([1] * (len(x.shape) - 1)))
        return {"sample": out["mean"] + nonzero_mask * torch.exp(0.5 * out["log_variance"]) * noise,
                "pred_xstart": out["pred_xstart"]}

    def ddim_sample(self, model, x, t, clip_denoised=True, model_kwargs=None, eta=0.0):
        out = self.p_mean_variance(model, x, t, clip_denoised, model_kwargs)
        eps = ((extract(self.sqrt_recip_alphas_cumprod, t, x.shape) * x - out["pred_xstart"])
               / extract(self.sqrt_recipm1_alphas_cumprod, t, x.shape))
        alpha_bar = extract(self.alphas_cumprod, t, x.shape)
        alpha_bar_prev = extract(self.alphas_cumprod_prev, t, x.shape)
        sigma = eta * torch.sqrt((1 - alpha_bar_prev) / (1 - alpha_bar)) * torch.sqrt(1 - alpha_bar / alpha_bar_prev)
        noise = torch.randn_like(x)
        mean_pred = out["pred_xstart"] * torch.sqrt(alpha_bar_prev) + torch.sqrt(1 - alpha_bar_prev - sigma**2) * eps
        nonzero_mask = (t != 0).float().view(-1, *([1] * (len(x.shape) - 1)))
        return {"sample": mean_pred + nonzero_mask * sigma * noise, "pred_xstart": out["pred_xstart"]}

    def p_sample_loop(self, model, shape, noise, clip_denoised=True, model_kwargs=None, step=None):
        img, step = noise, step or self.p_sample
        for i in list(range(self.num_timesteps))[::-1]:
            t = torch.tensor([i] * shape[0], device=noise.device)
            with torch.no_grad():
                img = step(model, img, t, clip_denoised, model_kwargs)["sample"]
        return img

    def ddim_sample_loop(self, model, shape, noise, clip_denoised=True, model_kwargs=None):
        return self.p_sample_loop(model, shape, noise, clip_denoised, model_kwargs, step=self.ddim_sample)


# ------------------------------------------------------------------------------------------------------------
# The training step and the sampler of the official scripts
# ------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def update_ema(ema, model, decay=0.9999):
    ema_params = dict(ema.named_parameters())
    for name, param in model.named_parameters():
        ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)


def train_step(model, ema, opt, diffusion, x, y, t=None, noise=None):
    """One step of the official training loop on latents ``x`` (already scaled) and labels ``y``."""
    if t is None:
        t = torch.randint(0, diffusion.num_timesteps, (x.shape[0],), device=x.device)
    loss = diffusion.training_losses(model, x, t, dict(y=y), noise=noise)["loss"].mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    update_ema(ema, model)
    return loss.detach()


def sample(model, diffusion, z, labels, cfg_scale, num_classes=1000, ddim=False, clip_denoised=False):
    """Guided sampling as the official ``sample.py`` (DDPM; ``ddim=True``: its DDIM loop): noise ``z`` (N, C, H, W)
    and labels (N,); returns N samples."""
    n = len(labels)
    z = torch.cat([z, z], 0)
    y = torch.cat([labels, torch.tensor([num_classes] * n, device=z.device)], 0)
    loop = diffusion.ddim_sample_loop if ddim else diffusion.p_sample_loop
    out = loop(model.forward_with_cfg, z.shape, z, clip_denoised=clip_denoised,
               model_kwargs=dict(y=y, cfg_scale=cfg_scale))
    return out.chunk(2, dim=0)[0]
