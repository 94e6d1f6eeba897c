"""``optimizer: muon`` (dit_core.train.muon): PyTorch's Muon for the blocks' token matrices and PyTorch's AdamW for
the rest, seen as one optimizer; which weights go where, and a run that trains, resumes exactly and checkpoints it."""

from __future__ import annotations

import pytest
import torch

from dit_core.models import DiT
from dit_core.train import ConfigError, train

if not hasattr(torch.optim, "Muon"):  # torch before 2.9 (test_install_floor.py checks the message there)
    pytest.skip("optimizer muon needs torch>=2.9", allow_module_level=True)

from dit_core.train.muon import MuonAdamW, MuonFp32, make_muon, newton_schulz, split_parameters

from test_train import Blobs, assert_same_checkpoint, final_state, tiny_config, whole_and_resumed


def _run(opt, params, grads):
    for g in grads:
        for p, gp in zip(params, g):
            p.grad = gp.clone()
        opt.step()
    return [p.detach().clone() for p in params]


def _problem(shapes, steps=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    start = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(steps)]
    return start, grads


def test_one_optimizer_steps_both_halves_as_torch_muon_and_adamw_would():
    """The combined optimizer moves the matrices exactly as ``torch.optim.Muon`` (RMS matched to AdamW) and the
    other tensors exactly as ``torch.optim.AdamW``; a learning rate set on ``param_groups`` reaches both."""
    matrices, others = [(48, 16), (16, 64)], [(16,), (3, 16)]
    start, grads = _problem(matrices + others, steps=4)
    ours = [p.clone() for p in start]
    opt = MuonAdamW(ours[:2], ours[2:], lr=1.0, betas=(0.9, 0.95), weight_decay=0.05)
    assert len(opt.param_groups) == 2
    for group in opt.param_groups:
        group["lr"] = 3e-3  # as the loop's schedule sets it
    got = _run(opt, ours, grads)
    theirs = [p.clone() for p in start]
    muon = torch.optim.Muon(theirs[:2], lr=3e-3, weight_decay=0.05, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW(theirs[2:], lr=3e-3, betas=(0.9, 0.95), weight_decay=0.05)
    for g in grads:
        for p, gp in zip(theirs, g):
            p.grad = gp.clone()
        muon.step()
        adamw.step()
    for g, w in zip(got, theirs):
        assert torch.equal(g, w)
    assert not torch.equal(got[0], start[0]) and not torch.equal(got[2], start[2])


def test_the_fp32_iteration_is_pytorchs_update_without_bf16_rounding():
    """``MuonFp32`` (a run that trains in fp32 on a CPU) moves the matrices as ``torch.optim.Muon`` does, up to
    the bf16 rounding of PyTorch's iteration, keeps the same state, and its iteration orthogonalises."""
    shapes = [(48, 16), (16, 64)]
    start, grads = _problem(shapes, steps=3)
    ours, theirs = [p.clone() for p in start], [p.clone() for p in start]
    kw = dict(lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    got = _run(MuonFp32(ours, **kw), ours, grads)
    want = _run(torch.optim.Muon(theirs, **kw), theirs, grads)
    for g, w, s in zip(got, want, start):
        moved = (w - s).abs().mean()
        assert (g - w).abs().mean() < 0.02 * moved  # bf16 keeps 8 bits: ~0.4 % per product
    opt = MuonFp32(ours, **kw)
    _run(opt, ours, grads[:1])
    torch.optim.Muon(theirs, **kw).load_state_dict(opt.state_dict())  # the same state layout
    sv = torch.linalg.svdvals(newton_schulz(torch.randn(64, 16) @ torch.diag(torch.logspace(0, 2, 16))))
    assert 0.5 < sv.min() and sv.max() < 1.25  # Muon's iteration: every singular value pushed near 1
    assert make_muon(torch.nn.ModuleDict({"blocks": torch.nn.ModuleList([torch.nn.ModuleDict(
        {"attn": torch.nn.ModuleDict({"qkv": torch.nn.Linear(4, 12)})})])}), 1e-3, (0.9, 0.999), 0.0,
        fp32=True).muon.__class__ is MuonFp32


SHARED_SHAPES = [(48, 16), (16, 64), (32, 32), (24, 40), (40, 24)]  # an odd count: the shares are unequal


def _shared_worker(rank: int, world: int, init: str, out: str, shapes: list) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    from dit_core.train import muon

    calls, iterate = [], muon.newton_schulz
    muon.newton_schulz = lambda g, *a: calls.append(g.shape) or iterate(g, *a)
    try:
        start, grads = _problem(shapes, steps=3)
        params = [p.clone() for p in start]
        got = _run(MuonFp32(params, lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"), params, grads)
        torch.save((got, len(calls)), f"{out}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("shapes,shares", [(SHARED_SHAPES, (3, 2)),  # matrices 0, 2, 4 and 1, 3 of 5
                                           (SHARED_SHAPES[:1], (1, 0))])  # one matrix: the second has none
def test_processes_share_the_fp32_iteration_and_get_the_same_update_bit_for_bit(tmp_path, shapes, shares):
    """With two processes each orthogonalises every other matrix and they exchange the results: both end with the
    weights one process computes alone, bit for bit."""
    start, grads = _problem(shapes, steps=3)
    params = [p.clone() for p in start]
    alone = _run(MuonFp32(params, lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"), params, grads)
    init = f"file://{tmp_path / 'rendezvous'}"
    torch.multiprocessing.spawn(_shared_worker, args=(2, init, str(tmp_path / "got"), shapes), nprocs=2)
    for rank, share in enumerate(shares):
        got, iterations = torch.load(tmp_path / f"got.{rank}", weights_only=True)
        assert all(torch.equal(g, a) for g, a in zip(got, alone)), rank
        assert iterations == 3 * share, (rank, iterations)  # 3 steps


def test_its_state_round_trips_and_a_foreign_state_is_refused():
    params = [torch.randn(8, 4, requires_grad=True), torch.randn(4, requires_grad=True)]
    opt = MuonAdamW(params[:1], params[1:], lr=1e-3)
    _run(opt, params, [[torch.randn(8, 4), torch.randn(4)]])
    again = MuonAdamW(params[:1], params[1:], lr=1e-3)
    again.load_state_dict(opt.state_dict())
    assert torch.equal(again.state_dict()["muon"]["state"][0]["momentum_buffer"],
                       opt.state_dict()["muon"]["state"][0]["momentum_buffer"])
    with pytest.raises(ValueError, match="not the state of optimizer muon.*--optimizer"):
        again.load_state_dict(torch.optim.AdamW(params).state_dict())
    with pytest.raises(ValueError, match="no block matrices"):
        make_muon(torch.nn.Linear(3, 3), 1e-3, (0.9, 0.999), 0.0)


def test_muon_takes_the_blocks_token_matrices_and_adamw_the_rest():
    model = DiT(input_size=8, patch_size=2, in_channels=3, hidden_size=64, depth=3, num_heads=4, num_classes=5,
                learn_sigma=False)
    muon, adamw = split_parameters(torch.nn.ModuleDict({"dit": model}))  # a prefix, as TrainingModel adds
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in muon) == sorted(
        f"blocks.{i}.{m}.weight" for i in range(3) for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"))
    assert len(muon) + len(adamw) == sum(p.requires_grad for p in model.parameters())
    assert not any("adaLN" in names[id(p)] or names[id(p)].endswith("bias") for p in muon)


def test_a_muon_run_trains_and_resumes_exactly(tmp_path):
    kw = dict(optimizer="muon", hidden_size=64, ckpt_every=3)
    ref, res = whole_and_resumed(tmp_path, **kw)
    assert_same_checkpoint(ref, res)
    assert set(ref["opt"]) == {"muon", "adamw"} and ref["opt"]["muon"]["state"]  # Muon's momentum is saved
    assert all(torch.isfinite(v).all() for v in ref["model"].values())
    # the same run with AdamW ends elsewhere: the option reached the optimizer
    train(tiny_config(tmp_path / "adamw", max_steps=6, hidden_size=64, ckpt_every=3), dataset=Blobs())
    other = final_state(tmp_path / "adamw")["model"]
    name = "blocks.0.attn.qkv.weight"
    key = next(k for k in ref["model"] if k.endswith(name))
    assert not torch.allclose(ref["model"][key], other[key])


def test_an_unknown_optimizer_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="optimizer"):
        tiny_config(tmp_path / "r", optimizer="lion")
