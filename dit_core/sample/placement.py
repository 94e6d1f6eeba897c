"""Where a model is sampled: a temporary copy on another device, and eval mode for the duration only.

:func:`dit_core.sample.generate` never moves, casts or leaves in another mode the model it is given: a trainer's
EMA (on the CPU to save GPU memory, or on the GPU it trains on) must come back exactly as it was. So sampling on
another device goes through :func:`sampling_copy`, freed when the call returns, and sampling in place through
:func:`eval_mode`, which puts every module back in its own mode afterwards.
"""

import contextlib
import copy

import torch



def sampling_copy(model: torch.nn.Module, device: str | torch.device, dtype: torch.dtype | None = None):
    """A frozen eval-mode copy of ``model`` on ``device`` (floating tensors cast to ``dtype`` when given).

    The parameters and buffers are moved one at a time straight to ``device``, so no second copy of the weights
    is ever made where the model lives (a CPU EMA of DiT-XL/2 is 2.7 GB); ``model`` itself is not touched.
    """
    device = torch.device(device)

    def moved(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        return t.to(device=device, dtype=dtype) if dtype is not None and t.is_floating_point() else t.to(device)

    memo: dict = {}
    for p in model.parameters():
        memo[id(p)] = torch.nn.Parameter(moved(p), requires_grad=False)
    for b in model.buffers():
        memo[id(b)] = moved(b)
    clone = copy.deepcopy(model, memo)
    return clone.eval()


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """``model`` in eval mode inside the block, each module back in its own mode afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    if not any(training for _, training in modes):
        yield model
        return
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


def model_device(model) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")
