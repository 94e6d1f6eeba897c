"""Measuring memory: what autograd saves, and every tensor a training step allocates and frees.

:func:`measure_saved_bytes` counts what autograd really saves with ``torch.autograd.graph.saved_tensors_hooks``;
:class:`TensorMemoryTracker` follows every tensor a step allocates and frees (on the CPU or on PyTorch's
``meta`` device, where DiT-XL/2 costs no memory) to check the predicted *peak*; on a GPU
``torch.cuda.max_memory_allocated`` does the same. Both check :mod:`.estimator`.
"""

from __future__ import annotations

import weakref
from typing import Iterable

from .estimator import ModelShape, TrainSetup

# ----------------------------------------------------------------------------------------------------------
# Measurement: what autograd saves, and every tensor a step allocates
# ----------------------------------------------------------------------------------------------------------


def _storage_key(t) -> int:
    return t.untyped_storage()._cdata


def measure_saved_bytes(model, batch_size: int, precision: str = "fp32", loss: str = "hybrid",
                        device=None, seed: int = 0) -> dict:
    """Count the bytes autograd saves for backward in one forward pass of ``model`` (+ the diffusion loss).

    Every tensor handed to ``torch.autograd.graph.saved_tensors_hooks`` is counted once per storage (views of
    one tensor share it), parameters excluded. A checkpointed block hides its internals from the hooks (they
    are recomputed), but it keeps its input alive: that is counted with a forward pre-hook. Works on the CPU
    and on the ``meta`` device (no memory, any size); autocast applies on the CPU only.

    Returns ``{"bytes", "storages"}``. The bytes include autocast's weight copies, which do not grow with the
    batch: :func:`measure_saved_per_sample` separates the two.
    """
    import torch

    from ...diffusion import create_diffusion
    from ...runtime import autocast

    device = torch.device(device or next(model.parameters()).device)
    shape = ModelShape.from_model(model)
    diffusion = create_diffusion("", learn_sigma=shape.learn_sigma)
    params = {_storage_key(p) for p in model.parameters()}
    seen: dict[int, int] = {}

    def note(t):
        key = _storage_key(t)
        if key not in params and key not in seen:
            seen[key] = t.untyped_storage().nbytes()

    def pack(t):
        note(t)
        return t

    def pre_hook(block, args):
        if torch.is_grad_enabled() and block.training and args[0].requires_grad:
            note(args[0])

    ckpt = set(getattr(model, "checkpointed_blocks", []))
    handles = [b.register_forward_pre_hook(pre_hook) for i, b in enumerate(model.blocks) if i in ckpt]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(batch_size, shape.in_channels, shape.input_size, shape.input_size, generator=gen).to(device)
    t = torch.randint(0, diffusion.num_timesteps, (batch_size,), generator=gen).to(device)
    y = torch.randint(0, max(shape.num_classes, 1), (batch_size,), generator=gen).to(device)
    def forward(x_t, t_, y=None):
        with autocast(device, precision):
            return model(x_t, t_, y).float()

    was_training = model.training
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if loss == "none":
                out = forward(x, t, y if shape.num_classes else None).sum()
            elif loss == "hybrid":
                if device.type == "meta":
                    raise ValueError("the diffusion loss cannot run on the meta device; use loss='none' there")
                kwargs = dict(y=y if shape.num_classes else None)
                out = diffusion.training_losses(forward, x, t, kwargs)["loss"].mean()
            else:
                raise ValueError(f"measure_saved_bytes: loss must be 'hybrid' or 'none', got {loss!r}")
        del out
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {"bytes": sum(seen.values()), "storages": len(seen)}


def measure_saved_per_sample(model, precision: str = "fp32", loss: str = "hybrid", batch_sizes=(2, 4)) -> dict:
    """Per-sample saved bytes as the slope between two batch sizes (constant terms, such as autocast's
    weight copies, cancel). Batch sizes of at least 2 avoid size-1 dimensions, for which some reshapes are
    views instead of copies."""
    a, b = batch_sizes
    ma = measure_saved_bytes(model, a, precision, loss)
    mb = measure_saved_bytes(model, b, precision, loss)
    per_sample = (mb["bytes"] - ma["bytes"]) / (b - a)
    return {"per_sample": per_sample, "constant": ma["bytes"] - a * per_sample, "at": {a: ma, b: mb}}


class TensorMemoryTracker:
    """Follow every tensor storage created while active; report bytes alive now and at the peak.

    A ``TorchDispatchMode`` sees each operator's outputs (forward, backward, optimizer; autocast casts too).
    An output that does not share storage with one of the operator's inputs is a new allocation; it is
    counted until its storage is freed (a ``weakref.finalize`` on the storage). Tensors that existed before
    (weights, optimizer state) are not counted: add them yourself. The CPU analogue of
    ``torch.cuda.max_memory_allocated`` minus what was allocated before, without the allocator's rounding;
    it also works on the ``meta`` device, so the peak of a DiT-XL/2 step can be measured without memory.

    >>> with TensorMemoryTracker() as mem:           # doctest: +SKIP
    ...     loss = model(x, t, y).square().mean(); loss.backward()
    >>> mem.peak                                     # doctest: +SKIP
    """

    def __init__(self):
        self.live = 0
        self.peak = 0
        self._keys: set[int] = set()
        self._finalizers: list = []
        self._mode = None

    def _free(self, key: int, nbytes: int) -> None:
        if key in self._keys:
            self._keys.discard(key)
            self.live -= nbytes

    def track(self, tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._keys:
            return
        nbytes = storage.nbytes()
        self._keys.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self._finalizers.append(weakref.finalize(storage, self._free, key, nbytes))

    def reset_peak(self) -> None:
        self.peak = self.live

    def __enter__(self) -> "TensorMemoryTracker":
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                inputs = {_storage_key(a) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and _storage_key(t) not in inputs:
                        tracker.track(t)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._mode = None

    def close(self) -> None:
        """Stop following the storages still alive (their later frees are no longer counted)."""
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()
        self._keys.clear()


def simulate_peak(shape: ModelShape, setup: TrainSetup, device: str = "meta", seed: int = 0) -> dict:
    """Peak tensor bytes of a training step of ``shape`` run as ``setup``, followed op by op.

    The step: ``zero_grad(set_to_none=True)``, ``grad_accum`` forward/backward passes of ``micro_batch``
    samples (loss: the output summed, so that nothing but the model is measured), an AdamW step, the EMA
    update. The second step is measured (the optimizer state exists from the first). On the ``meta`` device
    nothing is allocated, so DiT-XL/2 at batch 256 costs a few seconds; there autocast does not apply (use
    ``precision="fp32"``) and sdpa runs as the math path (use ``attn="math"``). Compare with
    ``estimate(shape, setup, loss="none").peak``.

    Returns ``{"peak", "start"}``: the peak, and the bytes alive when the step begins (weights, EMA,
    optimizer state and the previous step's gradients, which ``zero_grad`` then frees).
    """
    import torch

    from ...models import DiT
    from ...runtime import autocast
    from ...train.ema import create_ema, update_ema

    if setup.vae_in_loop:
        raise ValueError("simulate_peak measures the DiT step only; use vae_in_loop=False")
    dev = torch.device(device)
    if dev.type == "meta" and (setup.precision != "fp32" or setup.attn != "math"):
        raise ValueError("on the meta device use precision='fp32' and attn='math' (no autocast, sdpa is decomposed)")
    torch.manual_seed(seed)
    with torch.device(dev):
        model = DiT(**shape.model_kwargs(), attn_backend=setup.attn)
    model.set_grad_checkpointing(setup.checkpointed).train()
    ema = create_ema(model) if setup.ema == "device" else None
    params = [p for p in model.parameters() if p.requires_grad]
    if setup.optimizer == "adamw8bit":
        raise ValueError("simulate_peak runs torch's AdamW; the 8-bit optimizer's state is modelled, not simulated")
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, foreach=False)
    n = setup.micro_batch
    x = torch.randn(n, shape.in_channels, shape.input_size, shape.input_size, device=dev)
    t = torch.randint(0, 1000, (n,), device=dev)
    y = torch.randint(0, max(shape.num_classes, 1), (n,), device=dev) if shape.num_classes else None

    def step():
        opt.zero_grad(set_to_none=True)
        for _ in range(setup.grad_accum):
            with autocast(dev, setup.precision):
                out = model(x, t, y)
            out.float().sum().backward()
        opt.step()
        if ema is not None:
            update_ema(ema, model, 0.9999)

    step()
    tracker = TensorMemoryTracker()
    static = list(model.parameters()) + (list(ema.parameters()) if ema is not None else []) + optimizer_tensors(opt) + [x, t] + ([y] if y is not None else [])
    static += [p.grad for p in params if p.grad is not None]
    for tensor in static:
        tracker.track(tensor)
    del static, tensor  # hold no references: the old gradients must be freed by zero_grad
    start = tracker.live
    with tracker:
        step()
    tracker.close()
    return {"peak": tracker.peak, "start": start}


def tensor_bytes(tensors: Iterable) -> int:
    """Bytes of distinct storages among ``tensors`` (e.g. parameters, optimizer state)."""
    seen = {}
    for t in tensors:
        seen[_storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


def optimizer_tensors(optimizer) -> list:
    import torch

    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]

