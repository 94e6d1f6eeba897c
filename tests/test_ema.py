"""The EMA update's two forms (a Python number: the fused kernel; a device tensor: one lerp per tensor) and the
pinned staging of an EMA kept on the CPU, checked on the CPU. The GPU side (pinned copies, an EMA on the CPU
against one on the GPU, no synchronisation in the step) is in tests/test_cuda.py."""

from __future__ import annotations

import pytest
import torch

from dit_core.models import DiT
from dit_core.train.ema import EmaUpdater, HostStaging, create_ema, staging_layout, update_ema


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))


def _perturb(model: torch.nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("decay", [0.9, 0.3])  # both branches of lerp's formula (weight below and above 0.5)
def test_a_python_number_and_a_tensor_weight_give_the_same_update(decay):
    model = _model()
    a, b = create_ema(model), create_ema(model)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        _perturb(model, g)
        update_ema(a, model, decay)  # the fused scalar form
        update_ema(b, model, torch.tensor(decay, dtype=torch.float64))  # a 0-dim tensor: read as a CPU number
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)
    # the list form (what a device tensor takes) against the scalar form on the same numbers
    ema, target = [p.detach().clone() for p in a.parameters()], [p.detach() for p in model.parameters()]
    listed = [p.clone() for p in ema]
    torch._foreach_lerp_(ema, target, 1 - decay)
    torch._foreach_lerp_(listed, target, [torch.tensor(1 - decay)] * len(listed))
    for x, y in zip(ema, listed):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-7)


def test_the_updater_passes_a_python_number_until_an_update_is_masked(monkeypatch):
    """The fused form needs a Python number; the host knows the decay while every update counted (warm-up
    included), with no tensor made for it. After a masked update the count lives on the device and the decay
    comes from there (on a GPU as a device tensor, the list form; here a CPU tensor, read as a number)."""
    model = _model()
    ema = create_ema(model)
    seen, real = [], torch._foreach_lerp_

    def spy(self, other, weight):
        seen.append(weight)
        return real(self, other, weight)

    monkeypatch.setattr(torch, "_foreach_lerp_", spy)
    updater = EmaUpdater(ema, model, 0.999, warmup=True, every=2)
    device_decay = []
    monkeypatch.setattr(updater, "decay_now", lambda real=updater.decay_now: device_decay.append(1) or real())
    for step in range(4):  # updates after steps 1 and 3
        updater(step)
    assert [type(w) for w in seen] == [float, float] and updater.state() == 2 == updater.host_updates
    assert not device_decay  # the host's number, no tensor
    # weight 1 - decay, the decay warmed up from the host count: n = updates * every steps -> min(decay,
    # (1 + n) / (10 + n)) ** every
    assert seen == [pytest.approx(1 - (1 / 10) ** 2), pytest.approx(1 - (3 / 12) ** 2)]
    before = [p.detach().clone() for p in ema.parameters()]
    _perturb(model, torch.Generator().manual_seed(4))
    updater(5, torch.tensor(False))  # masked (a skipped step): weight 0, the EMA unchanged
    assert seen[-1] == 0.0 and all(torch.equal(a, b) for a, b in zip(before, ema.parameters()))
    assert updater.host_updates is None and updater.state() == 2 and len(device_decay) == 1
    updater(7)  # no verdict, but the host no longer knows the count: the device's decay
    assert len(device_decay) == 2 and updater.state() == 3 and seen[-1] == pytest.approx(1 - (5 / 14) ** 2)
    updater.load(5)  # a resumed run: the count comes from the checkpoint, known on the host again
    updater(9)
    assert len(device_decay) == 2 and seen[-1] == pytest.approx(1 - min(0.999, 11 / 20) ** 2)


def test_the_host_and_device_counts_give_the_same_average():
    """An updater that keeps its count on the host (no verdicts) and one whose every update is masked by a
    verdict that is always true: the same EMA, step for step."""
    model = _model()
    a, b = create_ema(model), create_ema(model)
    ua, ub = EmaUpdater(a, model, 0.99, warmup=True), EmaUpdater(b, model, 0.99, warmup=True)
    g = torch.Generator().manual_seed(2)
    for step in range(6):
        _perturb(model, g)
        ua(step)
        ub(step, torch.tensor(True))
    assert ua.host_updates == 6 and ub.host_updates is None and ua.state() == ub.state() == 6
    for x, y in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_staging_packs_dit_xl2_into_power_of_two_blocks():
    """DiT-XL/2's 2.70 GB of weights in pinned blocks: what the pinned allocator (it rounds each request to a
    power of two) would give one buffer per tensor, and what the packed layout gives. Meta tensors: no memory."""
    with torch.device("meta"):
        model = DiT(input_size=32, patch_size=2, in_channels=4, hidden_size=1152, depth=28, num_heads=16,
                    num_classes=1000)
    params = list(model.parameters())
    layout = staging_layout(params)
    assert layout["tensor_bytes"] == 675_129_632 * 4
    assert all(n & (n - 1) == 0 for _, n in layout["blocks"])  # each block is a power of two: nothing is added
    assert layout["pinned_bytes"] < 1.02 * layout["tensor_bytes"]
    assert layout["per_tensor_bytes"] > 1.3 * layout["tensor_bytes"]  # the rounding the layout avoids
    # no two tensors overlap, each lies inside its block, each starts aligned
    spans = {}
    for p, (b, offset) in zip(params, layout["places"]):
        nbytes = p.numel() * p.element_size()
        assert offset * p.element_size() % 512 == 0 and offset * p.element_size() + nbytes <= layout["blocks"][b][1]
        spans.setdefault(b, []).append((offset * p.element_size(), offset * p.element_size() + nbytes))
    for block in spans.values():
        block.sort()
        assert all(end <= nxt for (_, end), (nxt, _) in zip(block, block[1:]))


def test_staging_buffers_are_views_that_receive_the_weights():
    model = _model()
    model[1].weight.data = model[1].weight.data.double()  # a second dtype gets blocks of its own
    params = list(model.parameters())
    staging = HostStaging(params, block_bytes=256)  # tiny blocks: several of them
    assert not staging.pinned  # no CUDA tensor among the parameters: ordinary memory
    assert len(staging.blocks) > 2 and {b.dtype for b in staging.blocks} == {torch.float32, torch.float64}
    assert staging.pinned_bytes == sum(b.numel() * b.element_size() for b in staging.blocks)
    for buf, p in zip(staging.buffers, params):
        assert buf.shape == p.shape and buf.dtype == p.dtype
        assert any(buf.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() for b in staging.blocks)
    got, extra = staging.fetch([p.detach() for p in params], torch.tensor(0.5))
    assert all(torch.equal(x, p) for x, p in zip(got, params)) and float(extra) == 0.5
    with torch.no_grad():  # a second fetch overwrites every buffer, no two share memory
        for p in params:
            p.mul_(-2)
    got, _ = staging.fetch([p.detach() for p in params])
    assert all(torch.equal(x, p) for x, p in zip(got, params))


def test_staging_without_pinned_memory_falls_back_to_ordinary_memory(monkeypatch):
    """Asked to pin where it cannot (this CPU build of torch has no CUDA; on a GPU machine the page-locked memory
    may be refused): a warning, ordinary memory, and the EMA the same."""
    real_empty = torch.empty

    def no_pinning(*args, pin_memory=False, **kwargs):
        if pin_memory:
            raise RuntimeError("cannot pin memory here")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", no_pinning)
    model = _model()
    with pytest.warns(UserWarning, match="could not be pinned"):
        staging = HostStaging(list(model.parameters()), pin=True)
    assert not staging.pinned
    a, b = create_ema(model), create_ema(model)
    _perturb(model, torch.Generator().manual_seed(3))
    update_ema(a, model, 0.9)
    update_ema(b, model, 0.9, staging)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)
