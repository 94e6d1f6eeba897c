"""Checkers for the book's "implement it" exercises: the reader writes a piece of DiT, the checker compares it
with ``dit_core`` on random inputs and says which part differs.

* chapter 3, DiT's parts in the order of the paper's Figure 3: :func:`check_patchify` (patchify and unpatchify,
  against ``DiT.unpatchify`` and ``PatchEmbed``, a linear layer applied to each patch),
  :func:`check_timestep_embedder` (sinusoidal features and their MLP), :func:`check_label_embedder` (label dropout
  and the null class), :func:`check_dit_block` (the adaLN-Zero block: shift, scale, gate, zero at the start),
  :func:`check_final_layer`, and :func:`check_dit`, the assembled model, which loads a ``dit_core`` DiT's state
  dict and gives its outputs (:mod:`dit_book.my_dit` holds the chapter's solutions);
* chapter 4: :func:`check_q_sample` (DDPM eq. 4) and :func:`check_simple_loss` (``L_simple``, value and gradient),
  and :func:`check_ddim_step`, one deterministic DDIM step (Song et al. 2021, eq. 12 with eta = 0) against
  ``GaussianDiffusion.ddim_sample``, step by step and over a whole 50-step loop;
* chapter 5: :func:`check_training_step` (noise, steps, loss, AdamW, EMA) against ``TrainStep`` from the same
  seed, and :func:`check_newton_schulz`, Muon's iteration in fp32;
* chapter 7: :func:`check_guidance`, the classifier-free guidance combination as a sampler's ``model_fn``
  (Ho & Salimans 2022; DiT Sec. 4), against ``DiT.forward_with_cfg``.

Each returns a one-line summary when everything matches and raises ``AssertionError`` naming the first check
that failed (with torch's report of the largest difference) otherwise. Where a wrong answer has a known cause (a
label that is not the null class, a step ``t`` off by one, a missing gate or stop-gradient, ``zero_grad``
forgotten), the message names that cause rather than the formula. The small DiTs the checkers run are made to
react to every input (:func:`_reactive`): with ``dit_core``'s initialisation (adaLN-Zero, the timestep MLP and the
label table at N(0, 0.02)) a new model's output barely depends on ``t`` and ``y``, and a solution that passes the
wrong ones would look right. Example::

    from dit_book.exercises import check_guidance

    def my_guided(model, cfg_scale):
        ...
    print(check_guidance(my_guided))
"""

from __future__ import annotations

import copy
import math
from typing import Callable

import torch
from torch.testing import assert_close

#: fp32 round-off of a few small matrix products and of the DDIM update.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def _reactive(model: torch.nn.Module) -> torch.nn.Module:
    """Weights under which a DiT's output depends on every input: the adaLN and final linear layers and the
    timestep MLP with a standard deviation of 1/sqrt(fan_in) (a default linear layer's scale; biases likewise), the
    label table at N(0, 1). In place;
    returns ``model``. (``dit_core``'s initialisation, adaLN-Zero and N(0, 0.02) for the timestep MLP and the
    labels, is right for training, and makes a new model almost blind to ``t`` and ``y``.)"""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adaLN" in name or name.startswith(("final_layer.linear", "linear.", "t_embedder.mlp")):
                p.normal_(0, (p.shape[1] if p.dim() == 2 else p.shape[0]) ** -0.5)
            elif name.startswith("y_embedder"):
                p.normal_(0, 1.0)
    return model


#: How much the checkers' small DiTs must change their output (largest absolute change) when ``t`` moves by one
#: step or a label becomes the null class: a hundred times the tolerance and more, so that a slip in ``t`` or
#: ``y`` shows in the values, not only in a gradient.
REACTION = 1e-2


def _reaction(model, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """The largest change of ``model``'s output when ``t`` moves by one step, and when ``y`` is the null class."""
    with torch.no_grad():
        out = model(x, t, y)
        later = model(x, (t + 1).clamp(max=999), y) if (t < 999).any() else model(x, t - 1, y)
        null = model(x, t, torch.full_like(y, model.num_classes))
    return (out - later).abs().max().item(), (out - null).abs().max().item()


def _small_dit(input_size: int, patch_size: int, channels: int, learn_sigma: bool, seed: int, reactive: bool = True):
    """A small DiT in eval mode whose output reacts to ``x``, ``t`` and ``y`` (:func:`_reactive`, checked against
    :data:`REACTION`). ``reactive=False``: a model whose output is noise-sized (the adaLN and final layers at
    N(0, 0.02), the rest as initialised), for a sampler's loop, which a reactive model's large outputs would make
    diverge; a reader's code that does not call the model needs no more."""
    from dit_core.models import DiT

    torch.manual_seed(seed)
    model = DiT(input_size=input_size, patch_size=patch_size, in_channels=channels, hidden_size=32, depth=2,
                num_heads=2, num_classes=10, learn_sigma=learn_sigma).eval()
    if not reactive:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "adaLN" in name or "final_layer.linear" in name:
                    p.normal_(0, 0.02)
        return model
    _reactive(model)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, channels, input_size, input_size, generator=gen)
    by_t, by_y = _reaction(model, x, torch.tensor([0, 500, 998]), torch.tensor([1, 4, 7]))
    if min(by_t, by_y) < REACTION:
        raise RuntimeError(f"the checker's test DiT barely reacts to its inputs (a step of t changes its output by "
                           f"{by_t:.1e}, the null class by {by_y:.1e}; at least {REACTION} is needed): a change in "
                           "dit_core's DiT? Report it with this message")
    return model


class _Calls(torch.nn.Module):
    """A model that records the ``(t, y)`` of every call before running it, so that a checker can name a slip in
    what a reader's code passes to the model. Its other attributes (``num_classes``, ``in_channels``, ...) are
    the model's."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner = model
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x, t, y, *args, **kwargs):
        self.calls.append((torch.as_tensor(t).detach().clone(), torch.as_tensor(y).detach().clone()))
        return self.inner(x, t, y, *args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)


def _called_with(calls, t: torch.Tensor, y: torch.Tensor | None = None) -> str | None:
    """What a reader's code passed to the model, when it is not the ``t`` it was given (every call) or, with ``y``,
    never the labels ``y`` in any call: a sentence naming it, or None."""
    n = len(t)
    for got_t, _ in calls:
        flat = got_t.reshape(-1)
        if len(flat) % n or not torch.equal(flat.long(), t.repeat(len(flat) // n)):
            return (f"the model was called with t = {flat.tolist()}, not the t it was given, {t.tolist()}: call it at "
                    "the step whose noise it predicts, as given")
    if y is not None and not any(len(got_y) % n == 0 and torch.equal(got_y.reshape(-1, n)[0], y) for _, got_y in calls):
        return (f"the model was called with the labels {[g.tolist() for _, g in calls]}, never with y = {y.tolist()}: "
                "pass the labels as given (the step that drops labels does it before)")
    return None


def _expect(check: str, hint: str, actual, expected, tolerance: dict = TOLERANCE):
    try:
        assert_close(actual, expected, **tolerance)
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
    model = _small_dit(8, 2, 4, learn_sigma=False, seed=seed, reactive=False)  # ddim_step does not call it
    gen = torch.Generator().manual_seed(seed)
    y = torch.tensor([1, 5, 7])
    kwargs = dict(clip_denoised=False, model_kwargs=dict(y=y))
    noise = torch.randn(3, 4, 8, 8, generator=gen)
    ab, ab_prev = process.alphas_cumprod, process.alphas_cumprod_prev
    dtypes = set()

    def step(x, eps, k):
        out = ddim_step(x, eps, float(ab[k]), float(ab_prev[k]))
        if not torch.is_tensor(out) or tuple(out.shape) != tuple(x.shape):
            raise AssertionError(f"ddim_step returned {getattr(out, 'shape', type(out).__name__)} for x_t of shape "
                                 f"{tuple(x.shape)}: return x_prev, shaped like x_t")
        dtypes.add(out.dtype)
        return out.to(x.dtype)  # a float64 answer is a right answer; the model takes float32 again

    with torch.no_grad():
        for k in sorted({steps - 1, steps // 2, 1, 0}, reverse=True):
            x = noise if k == steps - 1 else torch.randn(3, 4, 8, 8, generator=gen)
            original = process.timestep_map[k]
            mine = step(x, model(x, torch.full((3,), original), y), k)
            _expect(f"one step at t = {original + 1} (code index {original}, step {k} of {steps})",
                    "x0_hat = (x_t - sqrt(1 - alpha_bar_t) eps) / sqrt(alpha_bar_t), then "
                    "x_prev = sqrt(alpha_bar_prev) x0_hat + sqrt(1 - alpha_bar_prev) eps",
                    mine, process.ddim_sample(model, x, torch.full((3,), k), **kwargs)["sample"])
        x = noise
        for k in reversed(range(steps)):
            x = step(x, model(x, torch.full((3,), process.timestep_map[k]), y), k)
        library = process.ddim_sample_loop(model, noise.shape, noise=noise, **kwargs)
        _expect(f"{steps} steps from the same noise", "the loop drifts from ddim_sample_loop", x, library)
    other = sorted(str(d).replace("torch.", "") for d in dtypes - {noise.dtype})
    note = (f" (your step returns {', '.join(other)}, compared as float32, the model's precision: a sampler casts "
            "it back before the next model call)") if other else ""
    return f"your DDIM step matches ddim_sample at every step checked and ddim_sample_loop over {steps} steps{note}"


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
            spy = _Calls(model)
            mine = guided(spy, s)(x, t, y)
            reference = model.forward_with_cfg(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]), s)[:3]
            if tuple(mine.shape) != tuple(reference.shape):
                raise AssertionError(f"model_fn(x, t, y) has shape {tuple(mine.shape)}; expected "
                                     f"{tuple(reference.shape)}: the noise channels, then the variance channels")
            c = model.in_channels
            hint = "eps_null + s (eps_y - eps_null), null class = num_classes"
            if not torch.allclose(mine[:, :c], reference[:, :c], **TOLERANCE):
                labels = [got for _, got in spy.calls]
                if s != 1.0 and not any((got == model.num_classes).any() for got in labels):
                    hint = (f"no model call had the null class: the labels passed were {[g.tolist() for g in labels]}; "
                            f"the unconditional prediction eps_null is the model's at label model.num_classes = "
                            f"{model.num_classes} (label dropout trained that row), not at class 0 or any other class")
                else:
                    hint = _called_with(spy.calls, t) or hint
            _expect(f"noise channels at scale {s}", hint, mine[:, :c], reference[:, :c])
            _expect(f"variance channels at scale {s}", "these come from the conditional pass, unguided",
                    mine[:, c:], reference[:, c:])
    return f"your guidance matches DiT.forward_with_cfg at scales {', '.join(f'{s:g}' for s in scales)}"


# ------------------------------------------------------------------------------------------------------------
# Chapter 3: DiT's own parts, written by the reader (dit_book.my_dit holds the chapter's solutions)
# ------------------------------------------------------------------------------------------------------------

#: Sinusoidal features at steps up to 999 in float32: equivalent ways of writing the frequencies (``exp`` of a
#: logarithm, or a power) differ by an ulp of ``w_k``, which a step of 999 turns into ~1e-4 of angle.
FEATURES_TOLERANCE = dict(rtol=0.0, atol=1e-3)
#: The assembled model against ``dit_core``'s: fp32 round-off through a few blocks, and the timestep features'
#: ~1e-4 (above) through the conditioning: 6e-7 at most with the frequencies written as a power. The chapter's
#: solution gives the library's outputs bit for bit.
MODEL_TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def _load(mine: torch.nn.Module, reference: torch.nn.Module, what: str, layout: str) -> None:
    """Load ``reference``'s state dict into ``mine``, naming the tensors whose names or shapes differ."""
    want, have = reference.state_dict(), mine.state_dict()
    missing, extra = [k for k in want if k not in have], [k for k in have if k not in want]
    shapes = [f"{k}: yours {tuple(have[k].shape)}, dit_core's {tuple(want[k].shape)}"
              for k in want if k in have and have[k].shape != want[k].shape]
    if missing or extra or shapes:
        lines = [f"{what}: its parameters are not dit_core's (whose names and shapes are the official "
                 f"checkpoints'); {layout}"]
        for title, items in (("missing", missing), ("not in dit_core", extra), ("other shape", shapes)):
            if items:
                lines.append(f"  {title}: {', '.join(items[:6])}{' ...' if len(items) > 6 else ''}")
        raise AssertionError("\n".join(lines))
    mine.load_state_dict(want)


#: DiT's layer norms (blocks and final layer): no parameters of their own and eps = 1e-6, the official code's;
#: PyTorch's default eps is 1e-5, a difference that shows only on tokens of small variance.
LAYER_NORM_EPS = 1e-6
#: How small: tokens of variance 1e-6, where eps = 1e-5 in place of 1e-6 scales the normalised tokens by 0.43.
SMALL_TOKENS = 1e-3


def _eps_hint(module: torch.nn.Module) -> str:
    """The hint for a layer norm's eps: which of ``module``'s ``nn.LayerNorm`` have another eps than DiT's, if any."""
    wrong = [f"{name or 'it'} has eps={m.eps:g}" for name, m in module.named_modules()
             if isinstance(m, torch.nn.LayerNorm) and m.eps != LAYER_NORM_EPS]
    return ((f"{', '.join(wrong)}: " if wrong else "") + "DiT's layer norms are nn.LayerNorm(hidden_size, "
            f"elementwise_affine=False, eps={LAYER_NORM_EPS:g}); PyTorch's default eps, 1e-5, differs on tokens of "
            "small variance")


def _randomize(module: torch.nn.Module, std: float = 0.1) -> torch.nn.Module:
    """Non-zero adaLN and final-layer weights, so that shift, scale and gate all matter."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "adaLN" in name or name.startswith(("linear.", "final_layer.linear")):
                p.normal_(0, std)
    return module


def _shape(what: str, actual: torch.Tensor, expected: tuple, meaning: str) -> None:
    if tuple(actual.shape) != tuple(expected):
        raise AssertionError(f"{what} has shape {tuple(actual.shape)}; expected {tuple(expected)}: {meaning}")


def check_timestep_embedder(timestep_embedding: Callable, TimestepEmbedder: type, *, seed: int = 0) -> str:
    """Check ``timestep_embedding(t, dim) -> (N, dim)`` and the module ``TimestepEmbedder(hidden_size)``.

    The features are DiT's: ``[cos(t w_k), sin(t w_k)]`` with ``w_k = 10000^(-k / (dim/2))``, ``k = 0 .. dim/2 - 1``,
    cosines first (``dit_core.models.TimestepEmbedder.timestep_embedding``); the module feeds the 256 features
    to an MLP named ``mlp``, ``Linear(256, D) -> SiLU -> Linear(D, D)``, whose weights are loaded from dit_core's.
    """
    from dit_core.models import TimestepEmbedder as Reference

    t = torch.tensor([0.0, 1.0, 10.0, 250.0, 999.0, 0.5, 499.5])
    for dim in (256, 8):
        got = timestep_embedding(t, dim)
        want = Reference.timestep_embedding(t, dim)
        _shape(f"timestep_embedding(t, {dim}) for {len(t)} steps", got, want.shape, "(N, dim)")
        half = dim // 2
        swapped = torch.cat([want[:, half:], want[:, :half]], dim=1)
        if torch.allclose(got.float(), swapped, **FEATURES_TOLERANCE):
            raise AssertionError(f"timestep_embedding(t, {dim}): your features are [sin, cos]; DiT puts the "
                                 "cosines first: [cos(t w_k), sin(t w_k)]")
        try:
            assert_close(got.float(), want, **FEATURES_TOLERANCE)
        except AssertionError as err:
            raise AssertionError(f"timestep_embedding(t, {dim}) at t = {t.tolist()}: the features are "
                                 f"[cos(t w_k), sin(t w_k)] with w_k = 10000^(-k / {half}), k = 0 .. {half - 1}"
                                 f"\n{err}") from None
    steps = torch.tensor([0, 3, 999])  # the samplers and the training step pass integer steps
    _expect("timestep_embedding of integer steps", "convert t to float before multiplying by the frequencies",
            timestep_embedding(steps, 256).float(), Reference.timestep_embedding(steps, 256), FEATURES_TOLERANCE)

    torch.manual_seed(seed)
    reference = Reference(32)
    mine = TimestepEmbedder(32)
    _load(mine, reference, "TimestepEmbedder(32)",
          "the MLP is mlp = nn.Sequential(nn.Linear(256, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size))")
    with torch.no_grad():
        got, want = mine(steps), reference(steps)
    _shape("TimestepEmbedder(32)(t) for 3 steps", got, (3, 32), "(N, hidden_size)")
    _expect("TimestepEmbedder(32)(t)", "the 256 sinusoidal features of t, then mlp (Linear, SiLU, Linear)", got, want,
            FEATURES_TOLERANCE)
    return "your timestep embedding matches dit_core's: the 256 sinusoidal features and the MLP after them"


def check_label_embedder(LabelEmbedder: type, *, seed: int = 0) -> str:
    """Check ``LabelEmbedder(num_classes, hidden_size, dropout_prob)``, called as ``embedder(y, drop=None)``.

    Its table ``embedding_table`` has ``num_classes + 1`` rows: row ``num_classes`` is the null class. A label is
    replaced by the null class where ``drop`` is True, in eval and in training mode alike (a training step that
    draws its own drops passes them); with ``drop=None``, in training mode each label is dropped with probability
    ``dropout_prob`` (0.1 in the paper; checked at 0.1 and 0.25), and in eval mode (sampling) none is. Compared
    with ``dit_core.models.LabelEmbedder`` (its ``force_drop_ids``) after loading its table.
    """
    from dit_core.models import LabelEmbedder as Reference

    torch.manual_seed(seed)
    reference = Reference(10, 16, 0.1)
    mine = LabelEmbedder(10, 16, 0.1)
    _load(mine, reference, "LabelEmbedder(10, 16, 0.1)",
          "the table is embedding_table = nn.Embedding(num_classes + 1, hidden_size): one row per class and a "
          "last one, the null class")
    mine.eval()
    y = torch.tensor([0, 3, 9, 10, 5, 7])  # 10: the null class itself, as guidance asks for it
    drop = torch.tensor([False, True, False, False, True, True])
    many = torch.arange(10).repeat(2000)  # 20,000 labels, none of them the null class
    gen = torch.Generator().manual_seed(seed)
    given = torch.rand(len(many), generator=gen) < 0.3  # drops a training step passes
    null_row = reference.embedding_table.weight[10]
    with torch.no_grad():
        _expect("eval mode, labels 0..10", "in eval mode (sampling) the embedding is the table's row of each label",
                mine(y), reference(y, False))
        _expect("eval mode with drop", "where drop is True the label becomes the null class, index num_classes",
                mine(y, drop), reference(y, False, force_drop_ids=drop.long()))
        dropped_eval = (mine(many) == null_row).all(dim=1).float().mean().item()
        if dropped_eval:
            raise AssertionError(f"in eval mode {dropped_eval:.1%} of the labels were dropped: sampling drops none "
                                 "(drop labels only in training mode, `self.training`)")
        mine.train()
        got = mine(many, given)
        dropped = (got == null_row).all(dim=1)
        if not torch.equal(dropped, given):
            raise AssertionError(
                f"training mode with drop given (30 % of 20,000 labels): {int((dropped & ~given).sum()):,} labels "
                f"that drop did not name became the null class and {int((given & ~dropped).sum()):,} that it named "
                "did not: when drop is given it decides, in training mode too (a training step passes the drops it "
                "drew, and a resumed run must drop the same labels); draw at random only when drop is None")
        _expect("training mode with drop given", "where drop is True the null class, elsewhere the label's row", got,
                reference(many, False, force_drop_ids=given.long()))
        shares = {}
        for p in (0.1, 0.25):
            embedder = mine if p == 0.1 else LabelEmbedder(10, 16, p)
            if p != 0.1:
                _load(embedder, Reference(10, 16, p), f"LabelEmbedder(10, 16, {p})", "the table as above")
                embedder.train()
            shares[p] = (embedder(many) == embedder.embedding_table.weight[10]).all(dim=1).float().mean().item()
    for p, share in shares.items():
        bound = 5 * (p * (1 - p) / len(many)) ** 0.5  # five standard errors of a share of 20,000 draws
        if abs(share - p) > bound:
            fixed = " (not a fixed 0.1)" if p != 0.1 and abs(share - 0.1) <= bound else ""
            raise AssertionError(f"in training mode {share:.1%} of 20,000 labels became the null class with "
                                 f"dropout_prob {p}; expected {p:.0%}, within {bound:.1%}: drop each label with "
                                 f"probability self.dropout_prob{fixed}, e.g. torch.rand(N) < self.dropout_prob")
    return (f"your label embedding matches dit_core's: the null class at index 10, the rows of the labels, dropped "
            f"where asked in eval and training mode, and {shares[0.1]:.1%} and {shares[0.25]:.1%} of 20,000 labels "
            "dropped in training mode at dropout_prob 0.1 and 0.25")


def _zero_at_start(what: str, module: torch.nn.Module, names: tuple[str, ...], why: str) -> None:
    nonzero = [k for k, v in module.state_dict().items() if k.startswith(names) and v.abs().max() > 0]
    if nonzero:
        raise AssertionError(f"{what} at initialisation: {', '.join(nonzero)} should start at zero; {why}")


def _ungated(block: torch.nn.Module, x: torch.Tensor, c: torch.Tensor) -> str:
    """Which branch of a new block (all gates 0) reaches ``x`` anyway: its output is compared with ``x`` plus the
    attention branch, the MLP branch or both, ungated (with zero shift and scale, modulate is the identity)."""
    hint = "each branch adds gate * branch(modulate(norm(x), shift, scale)) to x"
    try:
        with torch.no_grad():
            out = block(x, c)
            attn = block.attn(block.norm1(x))
            candidates = {"the attention branch": x + attn, "the MLP branch": x + block.mlp(block.norm2(x)),
                          "both branches": x + attn + block.mlp(block.norm2(x + attn))}
    except Exception:  # noqa: BLE001 - other names than dit_core's: the generic hint (the names are checked next)
        return hint
    for name, candidate in candidates.items():
        if torch.allclose(out, candidate, **TOLERANCE):
            return f"{name} is added without its gate; {hint}"
    return hint


def check_dit_block(DiTBlock: type, *, seed: int = 0) -> str:
    """Check ``DiTBlock(hidden_size, num_heads)``, called as ``block(x, c)`` with tokens ``x`` ``(N, T, D)`` and the
    conditioning ``c`` ``(N, D)``: the adaLN-Zero block of ``dit_core.models.DiTBlock``.

    ``adaLN_modulation = Sequential(SiLU, Linear(D, 6D))`` regresses, from ``c``, shift, scale and gate for the
    attention and then for the MLP; each branch adds ``gate * branch(LN(x) (1 + scale) + shift)`` to ``x``. The
    modulation's linear layer starts at zero, so a new block is the identity.
    """
    from dit_core.models import DiTBlock as Reference

    torch.manual_seed(seed)
    d = 32
    mine = DiTBlock(d, 2)
    gen = torch.Generator().manual_seed(seed)
    x, c = torch.randn(3, 16, d, generator=gen), torch.randn(3, d, generator=gen)
    zero_why = ("adaLN-Zero: the last Linear of adaLN_modulation starts with zero weight and bias, so every gate is "
                "0 and a new block is the identity")
    _zero_at_start("DiTBlock", mine, ("adaLN_modulation",), zero_why)
    with torch.no_grad():
        if not torch.equal(mine(x, c), x):
            raise AssertionError(f"DiTBlock at initialisation: adaLN_modulation starts at zero, so every gate is 0, "
                                 f"yet block(x, c) is not x: {_ungated(mine, x, c)}")
    reference = _randomize(Reference(d, 2))
    _load(mine, reference, f"DiTBlock({d}, 2)",
          "norm1, attn (dit_core.attention.Attention), norm2, mlp (dit_core.models.Mlp) and "
          "adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))")
    modulate = "modulate(x, shift, scale) = x * (1 + scale) + shift, one shift and scale per image"
    order = "adaLN_modulation(c).chunk(6, dim=1) gives shift, scale, gate for the attention, then for the MLP"
    with torch.no_grad():
        only_attention = {k: v.clone() for k, v in reference.state_dict().items()}
        for k in ("adaLN_modulation.1.weight", "adaLN_modulation.1.bias"):
            only_attention[k][5 * d:] = 0  # the MLP's gate at zero: the block is x + the attention branch
        reference.load_state_dict(only_attention)
        mine.load_state_dict(only_attention)
        _expect("the attention branch (the MLP's gate at zero)",
                f"x + gate * attn(modulate(norm1(x), shift, scale)); {order}; {modulate}", mine(x, c), reference(x, c))
        reference = _randomize(reference)
        mine.load_state_dict(reference.state_dict())
        _expect("the whole block", f"then x + gate * mlp(modulate(norm2(x), shift, scale)), on the x that the "
                f"attention branch returned; {order}", mine(x, c), reference(x, c))
        small = x * SMALL_TOKENS
        _expect(f"the whole block on tokens of variance {SMALL_TOKENS ** 2:g}", _eps_hint(mine), mine(small, c),
                reference(small, c))
    return ("your adaLN-Zero block matches dit_core's DiTBlock: the identity at initialisation, then shift, scale "
            f"and gate on both branches, its layer norms' eps {LAYER_NORM_EPS:g} included")


def check_final_layer(FinalLayer: type, *, seed: int = 0) -> str:
    """Check ``FinalLayer(hidden_size, patch_size, out_channels)``, called as ``final(x, c)``: adaLN with a shift
    and a scale (``adaLN_modulation = Sequential(SiLU, Linear(D, 2D))``, no gate), then ``linear`` from each token to
    a ``p x p x C_out`` patch; both linear layers start at zero (``dit_core.models.FinalLayer``)."""
    from dit_core.models import FinalLayer as Reference

    torch.manual_seed(seed)
    d, p, c_out = 32, 2, 6
    mine = FinalLayer(d, p, c_out)
    _zero_at_start("FinalLayer", mine, ("linear", "adaLN_modulation"),
                   "DiT starts its final layer (linear and adaLN_modulation) at zero, so a new DiT predicts zero")
    gen = torch.Generator().manual_seed(seed)
    x, c = torch.randn(3, 16, d, generator=gen), torch.randn(3, d, generator=gen)
    reference = _randomize(Reference(d, p, c_out))
    _load(mine, reference, f"FinalLayer({d}, {p}, {c_out})",
          "norm_final, linear = nn.Linear(hidden_size, p * p * out_channels) and "
          "adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))")
    with torch.no_grad():
        got = mine(x, c)
        _shape("final(x, c) for 16 tokens", got, (3, 16, p * p * c_out), "(N, T, p * p * out_channels)")
        _expect("the final layer", "linear(modulate(norm_final(x), shift, scale)) with "
                "adaLN_modulation(c).chunk(2, dim=1) = shift, scale", got, reference(x, c))
        small = x * SMALL_TOKENS
        _expect(f"the final layer on tokens of variance {SMALL_TOKENS ** 2:g}", _eps_hint(mine), mine(small, c),
                reference(small, c))
    return (f"your final layer matches dit_core's FinalLayer: zero at initialisation, then adaLN (its layer norm's "
            f"eps {LAYER_NORM_EPS:g} included) and the linear map")


def check_dit(DiT: type, *, seed: int = 0) -> str:
    """Check the assembled model ``DiT(input_size, patch_size, in_channels, hidden_size, depth, num_heads,
    num_classes=..., learn_sigma=...)``, called as ``model(x, t, y)``.

    Two small configurations: a new model predicts zero (adaLN-Zero, the zero final layer); it loads the state
    dict of ``dit_core.models.DiT`` as it is (the official checkpoints' names), and then gives that model's
    outputs, null class included. Last, DiT-XL/2 built on the meta device (shapes only, no memory) has the
    tensors of the official checkpoint, which ``dit_core``'s DiT-XL/2 loads (``tests/test_models.py``).
    """
    from dit_core.models import DiT as Reference, model_kwargs, sincos_2d

    configs = (dict(input_size=8, patch_size=2, in_channels=1, hidden_size=64, depth=2, num_heads=4, num_classes=10,
                    learn_sigma=True),
               dict(input_size=16, patch_size=4, in_channels=4, hidden_size=32, depth=1, num_heads=2, num_classes=5,
                    learn_sigma=False))
    largest = 0.0
    for cfg in configs:
        size, n, channels = cfg["input_size"], 4, cfg["in_channels"]
        out_channels = 2 * channels if cfg["learn_sigma"] else channels
        where = f"DiT({', '.join(f'{k}={v}' for k, v in cfg.items())})"
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(n, channels, size, size, generator=gen)
        t = torch.tensor([0, 10, 500, 999])
        y = torch.tensor([1, cfg["num_classes"], 3, 0])  # the null class too
        torch.manual_seed(seed)
        mine = DiT(**cfg).eval()
        with torch.no_grad():
            out = mine(x, t, y)
        _shape(f"{where}(x, t, y)", out, (n, out_channels, size, size),
               "(N, C_out, H, W): the noise prediction, then the variance channels with learn_sigma")
        if out.abs().max() > 0:
            raise AssertionError(f"{where}: a new model predicts {out.abs().max():.2e} somewhere, not zero: the "
                                 "blocks are adaLN-Zero and the final layer starts at zero")
        trained = [name for name, p in mine.named_parameters() if name == "pos_embed" and p.requires_grad]
        if trained:
            raise AssertionError(f"{where}: pos_embed is trained (requires_grad=True): DiT's position table is the "
                                 "fixed sine-cosine one, never trained; nn.Parameter(table, requires_grad=False) keeps "
                                 "it in the state dict (as the official checkpoints have it) and out of the optimizer")
        table = getattr(mine, "pos_embed", None)
        grid = size // cfg["patch_size"]
        if torch.is_tensor(table) and table.numel() == grid * grid * cfg["hidden_size"]:
            _expect(f"{where}: pos_embed of a new model", "the table of sincos_2d(hidden_size, input_size // "
                    "patch_size), as float32, shaped (1, T, hidden_size)", table.detach().reshape(1, grid * grid, -1),
                    torch.tensor(sincos_2d(cfg["hidden_size"], grid), dtype=torch.float32)[None])
        reference = _reactive(Reference(**cfg)).eval()
        _load(mine, reference, where,
              "x_embedder (PatchEmbed), t_embedder, y_embedder, pos_embed (a parameter that is not trained), "
              "blocks (an nn.ModuleList of DiTBlock) and final_layer")
        with torch.no_grad():
            got, want = mine(x, t, y), reference(x, t, y)
        forward = ("tokens = x_embedder(x) + pos_embed; c = t_embedder(t) + y_embedder(y); tokens = block(tokens, "
                   "c) for every block; then unpatchify(final_layer(tokens, c))")
        if any(isinstance(m, torch.nn.LayerNorm) and m.eps != LAYER_NORM_EPS for m in mine.modules()):
            forward = _eps_hint(mine)  # the likeliest slip when the blocks' and final layer's checks passed
        _expect(f"{where}(x, t, y) with dit_core's weights", forward, got, want, MODEL_TOLERANCE)
        largest = max(largest, (got - want).abs().max().item())

    xl = dict(model_kwargs("DiT-XL/2"), input_size=32, in_channels=4, num_classes=1000, learn_sigma=True)
    with torch.device("meta"):
        mine_xl, official = DiT(**xl), Reference(**xl)
    want = {k: tuple(v.shape) for k, v in official.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in mine_xl.state_dict().items()}
    if have != want:
        wrong = sorted(set(want) ^ set(have)) + sorted(k for k in set(want) & set(have) if want[k] != have[k])
        raise AssertionError(f"DiT-XL/2 ({xl}): {len(wrong)} tensors differ from the official checkpoint's, e.g. "
                             f"{', '.join(wrong[:5])}")
    count = sum(v.numel() for v in mine_xl.state_dict().values())
    return (f"your DiT loads dit_core's weights and gives its outputs (largest difference {largest:.1e}) on "
            f"{len(configs)} configurations; your DiT-XL/2 has the official checkpoint's {len(want)} tensors, "
            f"{count:,} numbers")


# ------------------------------------------------------------------------------------------------------------
# Chapter 4: the forward process and the simple loss
# ------------------------------------------------------------------------------------------------------------


def _alpha_bar(diffusion) -> torch.Tensor:
    return torch.as_tensor(diffusion.schedule["alpha_bar"])  # float64, code index i holds the paper's t = i + 1


def check_q_sample(q_sample: Callable, *, seed: int = 0) -> str:
    """Check ``q_sample(x0, t, noise, alpha_bar) -> x_t``: ``sqrt(alpha_bar[t]) x0 + sqrt(1 - alpha_bar[t]) noise``
    (DDPM eq. 4), each image at its own code index ``t`` (0 .. T-1), with ``alpha_bar`` the cumulative products
    as a tensor (``torch.as_tensor(diffusion.schedule["alpha_bar"])``). Compared with
    ``GaussianDiffusion.q_sample`` for DiT's linear schedule and the cosine one, on batches whose size equals the
    image width (so that a per-image factor not shaped ``(N, 1, 1, 1)`` broadcasts, wrongly, over the columns)."""
    from dit_core.diffusion import create_diffusion

    gen = torch.Generator().manual_seed(seed)
    for schedule in ("linear", "squaredcos_cap_v2"):
        diffusion = create_diffusion("", noise_schedule=schedule)
        alpha_bar = _alpha_bar(diffusion)
        for shape, t in (((8, 1, 8, 8), [0, 1, 10, 100, 250, 500, 750, 999]), ((3, 4, 4, 4), [999, 0, 420])):
            x0, noise = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
            t = torch.tensor(t)
            where = f"{schedule} schedule, x0 of shape {shape}, t = {t.tolist()}"
            index_hint = "t is already the code index (0 .. T-1) of alpha_bar, so take alpha_bar[t]"
            try:
                got = q_sample(x0, t, noise, alpha_bar)
            except IndexError as err:
                raise AssertionError(f"q_sample ({where}) indexed outside alpha_bar ({err}): {index_hint}") from None
            _shape(f"q_sample ({where})", got, shape, "the shape of x0")
            if got.dtype != x0.dtype:
                raise AssertionError(
                    f"q_sample ({where}) returned {str(got.dtype).replace('torch.', '')} for "
                    f"{str(x0.dtype).replace('torch.', '')} images: alpha_bar holds float64 (the schedule's "
                    "precision) and float64 times float32 is float64, which a float32 model refuses as input; "
                    "return x0's dtype, e.g. (...).to(x0.dtype)")
            for shift in (1, -1):
                valid = (t + shift >= 0) & (t + shift < len(alpha_bar))  # the images whose neighbour step exists
                shifted = diffusion.q_sample(x0[valid], t[valid] + shift, noise=noise[valid])
                if valid.sum() > 1 and torch.allclose(got[valid], shifted, **TOLERANCE):
                    raise AssertionError(f"q_sample ({where}) used alpha_bar[t {'+' if shift > 0 else '-'} 1]: "
                                         + index_hint)
            a = alpha_bar[t].reshape(-1, 1, 1, 1).to(x0.dtype)
            if torch.allclose(got, a * x0 + (1 - a) * noise, **TOLERANCE):
                raise AssertionError(f"q_sample ({where}) scaled by alpha_bar and 1 - alpha_bar: those are the "
                                     "variances; x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) eps")
            _expect(f"q_sample ({where})", "x_t = sqrt(alpha_bar[t]) x0 + sqrt(1 - alpha_bar[t]) noise, with "
                    "alpha_bar[t] shaped (N, 1, 1, 1) so that each image gets its own step", got,
                    diffusion.q_sample(x0, t, noise=noise))
    return "your q_sample matches GaussianDiffusion.q_sample on the linear and the cosine schedule, at every t tried"


def check_simple_loss(simple_loss: Callable, *, seed: int = 0) -> str:
    """Check ``simple_loss(model, x0, y, t, noise, alpha_bar) -> loss``: ``L_simple`` (DDPM eq. 14), the mean over
    the batch and every dimension of ``(noise - eps_theta(x_t, t, y))^2``, where ``eps_theta`` is the model's first
    ``C`` output channels (the others, with a learned variance, are not its business). Compared, value and
    gradient, with the ``mse`` term of ``GaussianDiffusion.training_losses`` on a small DiT with and without
    learned variance."""
    from dit_core.diffusion import create_diffusion

    gen = torch.Generator().manual_seed(seed)
    for learn_sigma in (True, False):
        diffusion = create_diffusion("", learn_sigma=learn_sigma)
        model = _small_dit(8, 2, 4, learn_sigma=learn_sigma, seed=seed)
        x0, noise = torch.randn(4, 4, 8, 8, generator=gen), torch.randn(4, 4, 8, 8, generator=gen)
        t, y = torch.tensor([5, 250, 600, 999]), torch.tensor([1, 2, 10, 4])
        where = "learned variance" if learn_sigma else "fixed variance"
        spy = _Calls(model)
        mine = simple_loss(spy, x0, y, t, noise, _alpha_bar(diffusion))
        if not torch.is_tensor(mine) or mine.dim() != 0:
            raise AssertionError(f"simple_loss ({where}) returned {getattr(mine, 'shape', mine)}: return one number, "
                                 "the mean over the batch and every dimension")
        if not mine.requires_grad:
            raise AssertionError(f"simple_loss ({where}) has no gradient: compute it from the model's output "
                                 "without torch.no_grad() or .detach()")
        grads = torch.autograd.grad(mine, [p for p in model.parameters() if p.requires_grad])
        want = diffusion.training_losses(model, x0, t, model_kwargs=dict(y=y), noise=noise)["mse"].mean()
        want_grads = torch.autograd.grad(want, [p for p in model.parameters() if p.requires_grad])
        hint = ("the mean of (noise - eps)^2, eps = the model's first C channels at x_t = q_sample(x0, t, noise)"
                + ("; the last C channels are the variance values, not part of L_simple" if learn_sigma else ""))
        hint = _called_with(spy.calls, t, y) or hint
        _expect(f"L_simple ({where})", hint, mine.detach().float(), want.detach())
        for (name, p), g, w in zip(((n, p) for n, p in model.named_parameters() if p.requires_grad), grads, want_grads):
            _expect(f"the gradient of L_simple for {name} ({where})", hint, g, w, dict(rtol=1e-4, atol=1e-7))
    return "your L_simple matches the mse term of training_losses, value and gradient, with and without learned variance"


# ------------------------------------------------------------------------------------------------------------
# Chapter 5: the training step and Muon's Newton-Schulz iteration
# ------------------------------------------------------------------------------------------------------------


def _hybrid_loss(diffusion, model, x0, y, t, noise, *, stop_gradient: bool = True, decoder_nll: bool = True,
                 bits: bool = True) -> torch.Tensor:
    """The per-image loss of DiT's training step (``training_losses``: ``mse + vb``), written out so that the
    checker can also compute it with one of the slips it names: no stop-gradient before the bound, the KL in place
    of the decoder's NLL at ``t = 0``, the bound in nats. ``L_simple`` alone for a model without learned variance."""
    from dit_core.diffusion.losses import discretized_gaussian_log_likelihood, mean_flat, normal_kl

    x_t = diffusion.q_sample(x0, t, noise)
    out = model(x_t, t, y)
    c = x0.shape[1]
    eps = out[:, :c]
    mse = mean_flat((noise - eps) ** 2)
    if out.shape[1] == c:
        return mse
    frozen = torch.cat([eps.detach() if stop_gradient else eps, out[:, c:]], dim=1)
    p = diffusion.p_mean_variance(lambda *_: frozen, x_t, t, clip_denoised=False)
    mean, _, log_var = diffusion.q_posterior_mean_variance(x0, x_t, t)
    kl = mean_flat(normal_kl(mean, log_var, p["mean"], p["log_variance"]))
    nll = -mean_flat(discretized_gaussian_log_likelihood(x0, means=p["mean"], log_scales=0.5 * p["log_variance"]))
    vb = torch.where(t == 0, nll, kl) if decoder_nll else kl
    return mse + (vb / math.log(2) if bits else vb)


def _step_with_t0(seed: int, first: int, batch: int, num_timesteps: int) -> int:
    """The first step number from ``first`` on whose draws (``batches.step_draws``) hold ``t = 0`` for some image,
    so that the checker sees the decoder term ``L_0`` of the bound, which only that step has."""
    from dit_core.train.batches import STREAM_STEP, generator

    for step in range(first, first + 100_000):
        if (torch.randint(0, num_timesteps, (batch,), generator=generator(seed, STREAM_STEP, step)) == 0).any():
            return step
    raise RuntimeError("no step drew t = 0 in 100,000 tries")  # p = 0.97^32 per step: does not happen


#: The ``eps`` of the checker's AdamW (see :func:`check_training_step`).
ADAM_EPS = 1e-5


def check_training_step(training_step: Callable, DiT: type | None = None, *, learn_sigma: bool = True,
                        steps: int = 3, seed: int = 0, grad_clip: float = 0.0, grad_accum: int = 1) -> str:
    """Check ``training_step(model, ema, opt, diffusion, x0, y, g, ema_decay) -> loss`` for a few steps against
    ``dit_core.train.step.TrainStep`` from the same seed.

    The step draws its random numbers from the generator ``g`` in the library's order (``batches.step_draws``):
    a code index ``t`` per image (``torch.randint(0, T, (N,), generator=g)``), the noise (``torch.randn``), then the
    label drops (``torch.rand(N, generator=g) < 0.1``); drops labels to the null class; computes the loss (the
    hybrid ``L_simple + L_vlb`` with a learned variance, ``L_simple`` without), one AdamW step on it, and the EMA
    update ``ema <- decay ema + (1 - decay) weights``. It returns the loss. The checker gives it
    ``g = dit_core.train.batches.generator(seed, STREAM_STEP, step)``, the generator of the library's draws.

    The steps checked are ``0 .. steps - 2`` and then the first later step whose draws hold ``t = 0``, where the
    bound's term is the decoder's NLL, not a KL. Losses, weights and EMA are compared after every step; where the
    loss differs, the message names the slip when it is one of: labels not dropped, the draws in another order,
    the KL in place of the NLL at ``t = 0``, the bound in nats or left out; where the loss is right and the weights
    are not: the stop-gradient missing, gradients of the step before still there (``zero_grad``), or the update.

    ``DiT``: the model class to train (the reader's, built with the library's arguments and loaded with its
    weights); ``None`` trains ``dit_core``'s DiT. ``grad_clip`` and ``grad_accum`` switch on those additions in the
    library's step (chapter 5's exercises: what each changes, and what it does not).
    """
    from dit_core.diffusion import create_diffusion
    from dit_core.models import DiT as Library
    from dit_core.train.batches import STREAM_STEP, generator
    from dit_core.train.ema import create_ema
    from dit_core.train.step import StepOptions, TrainStep

    cfg = dict(input_size=8, patch_size=2, in_channels=1, hidden_size=32, depth=2, num_heads=2, num_classes=10,
               learn_sigma=learn_sigma)
    batch, lr, decay = 32, 1e-3, 0.9
    torch.manual_seed(seed)
    library = _reactive(Library(**cfg)).eval()  # eval(): the step drops labels itself, from the draws
    mine = (DiT or Library)(**cfg)
    _load(mine, library, "your DiT", "use the model of chapter 3 (dit_book.my_dit.DiT) or dit_core's")
    mine.eval()
    diffusion = create_diffusion("", noise_schedule="squaredcos_cap_v2", learn_sigma=learn_sigma)
    T = diffusion.num_timesteps
    mine_ema, library_ema = create_ema(mine), create_ema(library)
    # AdamW's eps at 1e-5 rather than 1e-8: the key bias of attention has a gradient that is zero in exact arithmetic
    # (softmax ignores a shift shared by all keys), and AdamW would turn its round-off, which differs between two
    # right ways of computing the loss, into a full step of the learning rate
    mine_opt = torch.optim.AdamW(mine.parameters(), lr=lr, weight_decay=0.0, eps=ADAM_EPS)
    library_opt = torch.optim.AdamW(library.parameters(), lr=lr, weight_decay=0.0, eps=ADAM_EPS)
    library_step = TrainStep(library, diffusion, library_opt, library_ema,
                             StepOptions(precision="fp32", grad_clip=grad_clip, grad_accum=grad_accum,
                                         ema_decay=decay, ema_warmup=False), batch_size=batch, seed=seed)
    loss_hint = ("draw from g in the library's order: t = torch.randint(0, T, (N,), generator=g), then the noise "
                 "torch.randn(x0.shape, generator=g), then the drops torch.rand(N, generator=g) < 0.1; labels "
                 "dropped to the null class; x_t = q_sample(x0, t, noise); "
                 + ("the loss L_simple + L_vlb, the mean of training_losses' mse + vb" if learn_sigma
                    else "the loss L_simple, the mean of (noise - eps)^2")
                 + "; the model stays in eval mode (the step drops the labels)")
    numbers = list(range(max(steps - 1, 0))) + [_step_with_t0(seed, max(steps - 1, 0), batch, T)]
    data = torch.Generator().manual_seed(seed + 1)
    exact, previous_grads, largest = True, None, 0.0
    trainable = [name for name, p in library.named_parameters() if p.requires_grad]
    for step in numbers:
        x0 = torch.rand(batch, 1, 8, 8, generator=data) * 2 - 1
        y = torch.randint(0, 10, (batch,), generator=data)
        before = copy.deepcopy(library)  # the weights this step starts from, for naming a slip
        t = torch.randint(0, T, (batch,), generator=generator(seed, STREAM_STEP, step))
        where = f"step {step}" + (" (it draws t = 0 for some images: the bound's decoder term)" if (t == 0).any()
                                   and learn_sigma else "")
        loss = training_step(mine, mine_ema, mine_opt, diffusion, x0, y, generator(seed, STREAM_STEP, step), decay)
        micro = batch // grad_accum
        want = library_step(step, iter([(x0[k:k + micro], y[k:k + micro]) for k in range(0, batch, micro)])).loss
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise AssertionError(f"step {step}: training_step returned {loss!r}; return the loss (one number)")
        got = loss.detach().reshape(()).float()
        if not torch.allclose(got, want, **TOLERANCE):
            hint = _loss_slip(got, before, diffusion, x0, y, seed, step, learn_sigma) or loss_hint
            _expect(f"the loss of {where}", hint, got, want)
        reference_grads = _gradients(before, diffusion, x0, y, seed, step)
        pairs = list(zip(mine.state_dict().items(), library.state_dict().items()))
        for (name, a), (_, b) in pairs:
            if not torch.allclose(a, b, **TOLERANCE):
                hint = _weights_slip(mine, trainable, before, diffusion, x0, y, seed, step, reference_grads,
                                     previous_grads, learn_sigma)
                _expect(f"the weights after {where} ({name})", hint, a, b)
        for (name, a), (_, b) in zip(mine_ema.state_dict().items(), library_ema.state_dict().items()):
            _expect(f"the EMA after step {step} ({name})", "after the optimizer step, ema <- decay ema + "
                    "(1 - decay) weights: e.lerp_(w, 1 - decay) for every parameter", a, b)
        exact = exact and torch.equal(loss.detach().reshape(()), want) and all(torch.equal(a, b) for (_, a), (_, b) in pairs)
        largest = max((a - b).abs().max().item() for (_, a), (_, b) in pairs)
        previous_grads = reference_grads
    how = "bit for bit" if exact else f"to float round-off (weights {largest:.1e} apart after the last step)"
    return (f"your training step matches dit_core's TrainStep {how} over {len(numbers)} steps from the same seed "
            f"(steps {', '.join(map(str, numbers))}; step {numbers[-1]} draws t = 0): losses, weights and EMA "
            f"({'hybrid loss' if learn_sigma else 'L_simple'})")


def _draws(seed: int, step: int, x0: torch.Tensor, num_timesteps: int, order: str = "t, noise, drop"):
    """The step's ``(t, noise, drop)`` from its generator, in the library's order or (``"noise, t, drop"``) with
    the noise drawn first."""
    from dit_core.train.batches import STREAM_STEP, generator

    g, n = generator(seed, STREAM_STEP, step), len(x0)
    if order == "noise, t, drop":
        noise = torch.randn(x0.shape, generator=g)
        t = torch.randint(0, num_timesteps, (n,), generator=g)
    else:
        t = torch.randint(0, num_timesteps, (n,), generator=g)
        noise = torch.randn(x0.shape, generator=g)
    return t, noise, torch.rand(n, generator=g) < 0.1


def _loss_slip(got, model, diffusion, x0, y, seed, step, learn_sigma) -> str | None:
    """The slip that gives the reader's loss ``got`` from the weights ``model`` started the step with, if it is one
    the checker knows: a sentence that names it, or None."""
    null = model.num_classes
    t, noise, drop = _draws(seed, step, x0, diffusion.num_timesteps)
    dropped = torch.where(drop, torch.full_like(y, null), y)
    candidates = {"labels not dropped: the drops torch.rand(N, generator=g) < 0.1 turn those labels into the null "
                  f"class (index model.num_classes = {null}) before the model sees them":
                  lambda: _hybrid_loss(diffusion, model, x0, y, t, noise)}
    t2, noise2, drop2 = _draws(seed, step, x0, diffusion.num_timesteps, "noise, t, drop")
    candidates["the draws in another order: t first (torch.randint), then the noise (torch.randn), then the drops "
               "(torch.rand), as batches.step_draws draws them"] = lambda: _hybrid_loss(
        diffusion, model, x0, torch.where(drop2, torch.full_like(y, null), y), t2, noise2)
    if learn_sigma:
        candidates["L_vlb left out: the loss is L_simple + L_vlb, the bound training the variance channels"] = \
            lambda: _hybrid_loss(diffusion, model, x0, dropped, t, noise, bits=True) - _vb(diffusion, model, x0,
                                                                                          dropped, t, noise)
        candidates["the bound in nats: divide L_vlb by log(2) (bits per dimension, as training_losses reports it)"] = \
            lambda: _hybrid_loss(diffusion, model, x0, dropped, t, noise, bits=False)
        if (t == 0).any():
            candidates["at t = 0 (code index 0) the bound's term is the decoder's negative log-likelihood "
                       "(discretized_gaussian_log_likelihood of x0, in bits), not the KL of the posterior: "
                       "torch.where(t == 0, nll, kl)"] = \
                lambda: _hybrid_loss(diffusion, model, x0, dropped, t, noise, decoder_nll=False)
    with torch.no_grad():
        for slip, loss in candidates.items():
            if torch.allclose(got, loss().mean().float(), **TOLERANCE):
                return slip
    return None


def _vb(diffusion, model, x0, y, t, noise) -> torch.Tensor:
    """The bound's term alone, per image, in bits (the hybrid loss minus L_simple)."""
    from dit_core.diffusion.losses import mean_flat

    eps = model(diffusion.q_sample(x0, t, noise), t, y)[:, : x0.shape[1]]
    return _hybrid_loss(diffusion, model, x0, y, t, noise) - mean_flat((noise - eps) ** 2)


def _gradients(model, diffusion, x0, y, seed, step, **slip) -> dict:
    """The gradient of the step's loss at ``model``'s weights (a copy's), by parameter name."""
    net = copy.deepcopy(model)
    t, noise, drop = _draws(seed, step, x0, diffusion.num_timesteps)
    y = torch.where(drop, torch.full_like(y, net.num_classes), y)
    params = {n: p for n, p in net.named_parameters() if p.requires_grad}
    grads = torch.autograd.grad(_hybrid_loss(diffusion, net, x0, y, t, noise, **slip).mean(), list(params.values()))
    return dict(zip(params, grads))


def _weights_slip(mine, trainable, before, diffusion, x0, y, seed, step, grads, previous, learn_sigma) -> str:
    """Why the weights differ when the loss is right, from the gradients the reader's step left in ``.grad``."""
    generic = "one AdamW step on the loss: opt.zero_grad(), loss.backward(), opt.step()"
    params = dict(mine.named_parameters())
    have = {name: params[name].grad for name in trainable if name in params}
    if any(g is None for g in have.values()):
        return generic + " (your step left no gradients to look at: set them to None after opt.step() only)"

    def close(want):
        return all(torch.allclose(have[n], want[n], rtol=1e-4, atol=1e-6) for n in want)

    if close(grads):
        return ("your gradients are right, the update made with them is not: " + generic + ", with the optimizer "
                "you were given (AdamW at its learning rate), once per step")
    if previous is not None and close({n: grads[n] + previous[n] for n in grads}):
        return ("the gradients of the step before were still there: loss.backward() adds to .grad, so call "
                "opt.zero_grad() before it (" + generic + ")")
    if learn_sigma and close(_gradients(before, diffusion, x0, y, seed, step, stop_gradient=False)):
        return ("the bound's gradient reached the noise prediction: L_vlb must see eps through eps.detach() (the "
                "stop-gradient of Improved DDPM), so that L_simple alone trains the mean and L_vlb the variance")
    return ("the loss is right but its gradient is not: compute the loss from the model's output without "
            "torch.no_grad() or .detach() (except the stop-gradient before L_vlb); " + generic)


def check_newton_schulz(newton_schulz: Callable, *, seed: int = 0) -> str:
    """Check ``newton_schulz(g) -> X``, Muon's five quintic Newton-Schulz iterations in fp32: ``g`` scaled to
    unit Frobenius norm, then ``X <- a X + (b A + c A^2) X`` with ``A = X X^T`` and
    ``(a, b, c) = (3.4445, -4.7750, 2.0315)``; compared with ``dit_core.train.muon.newton_schulz`` on wide, tall
    and square matrices."""
    from dit_core.train.muon import newton_schulz as library

    gen = torch.Generator().manual_seed(seed)
    for rows, cols in ((64, 256), (256, 64), (48, 48)):
        g = torch.randn(rows, 8, generator=gen) @ torch.randn(8, cols, generator=gen) \
            + 0.1 * torch.randn(rows, cols, generator=gen)  # nearly low-rank, as gradients are
        got = newton_schulz(g.clone())
        _shape(f"newton_schulz of a {rows} x {cols} matrix", got, (rows, cols), "the shape of g")
        _expect(f"newton_schulz of a {rows} x {cols} matrix",
                "x = g / g.norm(), then five times A = x @ x.T; x = a x + (b A + c A @ A) @ x, with "
                "(a, b, c) = (3.4445, -4.7750, 2.0315)", got.float(), library(g), dict(rtol=1e-4, atol=1e-5))
    return "your Newton-Schulz iteration matches dit_core.train.muon.newton_schulz on wide, tall and square matrices"
