"""``optimizer: muon`` (dit_core.train.muon): its Muon half against ``torch.optim.Muon``, its AdamW half against
``torch.optim.AdamW``, which weights go where, and a run that trains, resumes exactly and checkpoints it."""

from __future__ import annotations

import pytest
import torch

from dit_core.models import DiT
from dit_core.train import ConfigError, train
from dit_core.train.muon import MuonAdamW, ns_cost, orthogonalize, orthogonalize_all, owners, split_parameters

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


def test_orthogonalize_sets_every_singular_value_near_one():
    gen = torch.Generator().manual_seed(0)
    for shape in ((128, 384), (512, 128), (64, 64)):
        # singular values spread over two orders of magnitude
        u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape), generator=gen))
        v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape), generator=gen))
        g = u @ torch.diag(torch.logspace(-1, 1, min(shape))) @ v.T
        o = orthogonalize(g)
        assert o.shape == g.shape
        s = torch.linalg.svdvals(o)
        assert s.min() > 0.6 and s.max() < 1.25, (shape, s.min(), s.max())
        # and the directions are g's: o is close to the polar factor u v^T
        assert torch.nn.functional.cosine_similarity(o.flatten(), (u @ v.T).flatten(), dim=0) > 0.95


def test_a_stack_is_orthogonalised_matrix_by_matrix():
    """orthogonalize_all batches the matrices of one shape (a transposed one too) and gives each the numbers
    it gets alone, in fp32 and in bf16, in the order it was given."""
    gen = torch.Generator().manual_seed(2)
    shapes = [(384, 128), (128, 512), (128, 128), (512, 128), (128, 384), (128, 512), (64, 96)]
    mats = [torch.randn(s, generator=gen) * (i + 1) for i, s in enumerate(shapes)]
    for dtype in (None, torch.bfloat16):
        got = orthogonalize_all(mats, dtype=dtype)
        assert [tuple(g.shape) for g in got] == shapes
        for m, g in zip(mats, got):
            alone = orthogonalize(m, dtype=dtype)
            assert g.dtype == torch.float32
            assert torch.allclose(g, alone, atol=1e-6 if dtype is None else 1e-2), (m.shape, (g - alone).abs().max())
    # a stack's matrices are scaled one by one: one large matrix does not shrink the others
    small, large = mats[1], mats[5] * 1e3
    assert torch.allclose(orthogonalize(torch.stack([small, large]))[0], orthogonalize(small), atol=1e-6)


def test_the_muon_half_computes_what_torch_muon_computes():
    shapes = [(384, 128), (128, 512)]
    start, grads = _problem(shapes)
    lr, wd = 2e-3, 0.1
    ours = [p.clone() for p in start]
    theirs = [p.clone() for p in start]
    got = _run(MuonAdamW(ours, [], lr=lr, weight_decay=wd), ours, grads)
    want = _run(torch.optim.Muon(theirs, lr=lr, weight_decay=wd, adjust_lr_fn="match_rms_adamw"), theirs, grads)
    adam = [p.clone() for p in start]
    plain = _run(torch.optim.AdamW(adam, lr=lr, weight_decay=wd), adam, grads)
    for s, g, w, a in zip(start, got, want, plain):
        moved = (w - s).norm()
        assert (g - w).norm() < 0.03 * moved  # PyTorch iterates in bf16, this one in fp32
        assert (a - w).norm() > 0.3 * moved  # and AdamW's steps are not Muon's: the comparison can fail


def test_newton_schulz_in_bf16_as_torch_muon_runs_it():
    """``ns_dtype=bfloat16`` (the trainer's choice when it trains in bf16): the products in bf16, the update in
    the weights' dtype, within bf16's rounding of PyTorch's Muon, which also iterates in bf16 (1.6 % of a
    step apart here, against 0.7 % in fp32: the two round at different points)."""
    g = torch.randn(128, 512, generator=torch.Generator().manual_seed(1))
    low, full = orthogonalize(g, dtype=torch.bfloat16), orthogonalize(g)
    assert low.dtype == torch.float32 and not torch.equal(low, full)
    assert (low - full).norm() < 0.05 * full.norm()
    shapes = [(384, 128), (128, 512)]
    start, grads = _problem(shapes)
    ours, theirs = [p.clone() for p in start], [p.clone() for p in start]
    got = _run(MuonAdamW(ours, [], lr=2e-3, weight_decay=0.1, ns_dtype=torch.bfloat16), ours, grads)
    want = _run(torch.optim.Muon(theirs, lr=2e-3, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"), theirs, grads)
    for s, g, w in zip(start, got, want):
        assert (g - w).norm() < 0.03 * (w - s).norm()


def test_the_adamw_half_computes_what_torch_adamw_computes():
    shapes = [(128,), (3, 128), (128, 12)]
    start, grads = _problem(shapes, steps=5)
    ours = [p.clone() for p in start]
    theirs = [p.clone() for p in start]
    got = _run(MuonAdamW([], ours, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.05), ours, grads)
    want = _run(torch.optim.AdamW(theirs, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.05, foreach=False), theirs,
                grads)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


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
    groups = ref["opt"]["param_groups"]
    assert [g["muon"] for g in groups] == [True, False]
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


def _shared_out_worker(rank, world, init_file, shapes, out_file, ns_dtype):
    """One of ``world`` processes: the same start and gradients as one process, ``distributed=True``."""
    import torch.distributed as dist

    import dit_core.train.muon as muon

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    calls = []  # the matrices this process orthogonalised (in stacks of one shape)
    plain = muon.orthogonalize
    muon.orthogonalize = lambda g, *a, **k: calls.extend([tuple(g.shape[-2:])] * len(g)) or plain(g, *a, **k)
    start, grads = _problem(shapes)
    params = [p.clone() for p in start]
    got = _run(MuonAdamW(params, [], lr=2e-3, weight_decay=0.1, distributed=True, ns_dtype=ns_dtype), params, grads)
    torch.save(dict(params=got, calls=len(calls)), f"{out_file}.{rank}")
    dist.destroy_process_group()


@pytest.mark.parametrize("ns_dtype", [None, torch.bfloat16])
def test_processes_share_the_newton_schulz_work_and_get_one_process_numbers(tmp_path, ns_dtype):
    """Under DDP every process holds the same gradients; each orthogonalises its share of the matrices and the
    all-reduce gives every process all updates, bit for bit what one process computes alone (in bf16 the
    updates travel as bf16: half the bytes, the same numbers)."""
    import torch.multiprocessing as mp

    shapes = [(384, 128), (128, 128), (512, 128), (128, 512), (384, 128), (128, 128)]
    mp.spawn(_shared_out_worker, args=(2, str(tmp_path / "init"), shapes, str(tmp_path / "out"), ns_dtype),
             nprocs=2)
    torch.set_num_threads(1)
    start, grads = _problem(shapes)
    params = [p.clone() for p in start]
    want = _run(MuonAdamW(params, [], lr=2e-3, weight_decay=0.1, ns_dtype=ns_dtype), params, grads)
    ranks = [torch.load(tmp_path / f"out.{r}", weights_only=True) for r in range(2)]
    for r in ranks:
        for g, w in zip(r["params"], want):
            assert torch.equal(g, w)
    calls = [r["calls"] for r in ranks]
    assert sum(calls) == len(shapes) * len(grads) and min(calls) > 0, calls  # shared out, each matrix once
    # by cost, not by count: these six split into two equal loads of Newton-Schulz work
    owner = owners(shapes, 2)
    load = [sum(ns_cost(s) for s, o in zip(shapes, owner) if o == r) for r in range(2)]
    assert load[0] == load[1] and owner == [0, 0, 0, 1, 1, 1], (owner, load)
