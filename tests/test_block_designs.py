"""The four block designs of the paper's ablation (Sec. 3.2, Fig. 5), and cross-attention without its context
LayerNorm: each computes what the paper describes (checked against a from-scratch reference), costs what the FLOP
counter says, trains, and is kept apart from the others in checkpoints, the trainer's config and the memory
planner."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dit_core import DiT
from dit_core.checkpoint import SAME_WEIGHTS, CheckpointError, atomic_save, infer_block, infer_config, load_dit
from dit_core.measure.flops import PAPER_CROSS_ATTENTION_OVERHEAD, design_table, forward_macs
from dit_core.models import BLOCKS
from test_models import randomize  # every weight random, the adaLN-Zero zeros included

DESIGNS = list(BLOCKS)


def tiny(block, **kw):
    args = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=2, num_heads=2, num_classes=10,
                block=block)
    args.update(kw)
    return DiT(**args)


def inputs(n=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, 8, 8, generator=g), torch.randint(0, 1000, (n,), generator=g), torch.tensor([0, 3, 10])[:n]


# -- a from-scratch reference of each design, in float64, from the paper's words -------------------------------------


def _ln(x, w=None, b=None):
    return F.layer_norm(x, x.shape[-1:], w, b, eps=1e-6)


def _mha(q_in, kv_in, wq, bq, wk, bk, wv, bv, wo, bo, heads):
    n, t, d = q_in.shape
    q = (q_in @ wq.T + bq).reshape(n, t, heads, -1).transpose(1, 2)
    k = (kv_in @ wk.T + bk).reshape(n, kv_in.shape[1], heads, -1).transpose(1, 2)
    v = (kv_in @ wv.T + bv).reshape(n, kv_in.shape[1], heads, -1).transpose(1, 2)
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v
    return a.transpose(1, 2).reshape(n, t, d) @ wo.T + bo


def _self_attn(x, s, p, heads):
    wq, wk, wv = s[p + "attn.qkv.weight"].chunk(3)
    bq, bk, bv = s[p + "attn.qkv.bias"].chunk(3)
    return _mha(x, x, wq, bq, wk, bk, wv, bv, s[p + "attn.proj.weight"], s[p + "attn.proj.bias"], heads)


def _mlp(x, s, p):
    h = F.gelu(x @ s[p + "mlp.fc1.weight"].T + s[p + "mlp.fc1.bias"], approximate="tanh")
    return h @ s[p + "mlp.fc2.weight"].T + s[p + "mlp.fc2.bias"]


def reference_forward(model, x, t, y):
    """Patchify, embed t and y, run the blocks as Sec. 3.2 describes each design, decode: float64, no dit_core code."""
    s = {k: v.double() for k, v in model.state_dict().items()}
    heads, p, d, block = model.num_heads, model.patch_size, model.hidden_size, model.block
    x = x.double()
    h = F.conv2d(x, s["x_embedder.proj.weight"], s["x_embedder.proj.bias"], stride=p).flatten(2).transpose(1, 2)
    h = h + s["pos_embed"]
    half = 128
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
    args = t.double()[:, None] * freqs[None]
    tf = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    te = F.silu(tf @ s["t_embedder.mlp.0.weight"].T + s["t_embedder.mlp.0.bias"]) @ s["t_embedder.mlp.2.weight"].T
    te = te + s["t_embedder.mlp.2.bias"]
    ye = s["y_embedder.embedding_table.weight"][y]
    c = te + ye
    cond = torch.stack([te, ye], dim=1)
    if block == "in-context":
        h = torch.cat([h, cond], dim=1)  # two more tokens, treated like the others
    for i in range(model.depth):
        b = f"blocks.{i}."
        if block in ("adaln-zero", "adaln"):
            mod = F.silu(c) @ s[b + "adaLN_modulation.1.weight"].T + s[b + "adaLN_modulation.1.bias"]
            if block == "adaln-zero":
                sh1, sc1, g1, sh2, sc2, g2 = mod.chunk(6, dim=1)
            else:  # adaLN: no gates, the branches are added as they are
                sh1, sc1, sh2, sc2 = mod.chunk(4, dim=1)
                g1 = g2 = torch.ones_like(sh1)
            h = h + g1[:, None] * _self_attn(_ln(h) * (1 + sc1[:, None]) + sh1[:, None], s, b, heads)
            h = h + g2[:, None] * _mlp(_ln(h) * (1 + sc2[:, None]) + sh2[:, None], s, b)
        else:
            h = h + _self_attn(_ln(h, s[b + "norm1.weight"], s[b + "norm1.bias"]), s, b, heads)
            if block.startswith("cross-attention"):
                q_in = _ln(h, s[b + "norm_cross.weight"], s[b + "norm_cross.bias"])
                context = cond if block == "cross-attention-raw" else _ln(cond)  # a LayerNorm without parameters
                wk, wv = s[b + "cross_attn.kv.weight"].chunk(2)
                bk, bv = s[b + "cross_attn.kv.bias"].chunk(2)
                h = h + _mha(q_in, context, s[b + "cross_attn.q.weight"], s[b + "cross_attn.q.bias"], wk, bk, wv, bv,
                             s[b + "cross_attn.proj.weight"], s[b + "cross_attn.proj.bias"], heads)
            h = h + _mlp(_ln(h, s[b + "norm2.weight"], s[b + "norm2.bias"]), s, b)
    if block == "in-context":
        h = h[:, :-2]  # the conditioning tokens leave after the last block
    if block in ("adaln-zero", "adaln"):
        sh, sc = (F.silu(c) @ s["final_layer.adaLN_modulation.1.weight"].T
                  + s["final_layer.adaLN_modulation.1.bias"]).chunk(2, dim=1)
        h = _ln(h) * (1 + sc[:, None]) + sh[:, None]
    else:
        h = _ln(h, s["final_layer.norm_final.weight"], s["final_layer.norm_final.bias"])
    out = h @ s["final_layer.linear.weight"].T + s["final_layer.linear.bias"]
    g, co = model.x_embedder.grid_size, model.out_channels
    return torch.einsum("nhwpqc->nchpwq", out.reshape(len(x), g, g, p, p, co)).reshape(len(x), co, g * p, g * p)


@pytest.mark.parametrize("block", DESIGNS)
def test_each_design_computes_what_the_paper_describes(block):
    model = randomize(tiny(block)).eval()
    x, t, y = inputs()
    with torch.no_grad():
        torch.testing.assert_close(model(x, t, y).double(), reference_forward(model, x, t, y), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", DESIGNS)
def test_each_design_is_conditioned_on_t_and_y(block):
    model = randomize(tiny(block)).eval()
    x, t, y = inputs()
    with torch.no_grad():
        base = model(x, t, y)
        assert not torch.allclose(base, model(x, t, torch.tensor([5, 5, 5])), atol=1e-6), "the label changes nothing"
        assert not torch.allclose(base, model(x, t + 300, y), atol=1e-6), "the time step changes nothing"


@pytest.mark.parametrize("block", DESIGNS)
def test_only_adaln_zero_blocks_start_as_the_identity(block):
    model = tiny(block)
    x, t, y = inputs()
    with torch.no_grad():
        assert torch.count_nonzero(model(x, t, y)) == 0, "every design's decoder starts at zero"
        h = torch.randn(3, 16 + model.extra_tokens, 32)
        c = torch.randn(3, 2, 32) if block.startswith("cross-attention") else torch.randn(3, 32)
        identity = all(torch.equal(b(h, c), h) for b in model.blocks)
    assert identity == (block == "adaln-zero")


def test_the_default_is_the_official_design_with_its_keys():
    default = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=2, num_heads=2, num_classes=10)
    assert default.block == "adaln-zero"
    assert {k.split(".", 2)[2] for k in default.state_dict() if k.startswith("blocks.0.")} == {
        "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias", "mlp.fc1.weight", "mlp.fc1.bias",
        "mlp.fc2.weight", "mlp.fc2.bias", "adaLN_modulation.1.weight", "adaLN_modulation.1.bias"}
    with pytest.raises(ValueError, match="unknown block design 'film'.*adaln-zero, adaln, cross-attention, in-context"):
        tiny("film")


def test_the_flop_counter_counts_each_design():
    rows = {r["block"]: r for r in design_table("DiT-XL/2")}
    assert rows["adaln-zero"]["gmacs"] == pytest.approx(118.6, rel=2e-3)
    # cross-attention: "roughly a 15% overhead" (Sec. 3.2); counted: q and output projections over every token
    assert rows["cross-attention"]["overhead"] == pytest.approx(PAPER_CROSS_ATTENTION_OVERHEAD, abs=0.02)
    # in-context: two more tokens of 256, "negligible new Gflops"; adaLN: the least (no gate rows)
    assert rows["in-context"]["tokens"] == 258 and 0 < rows["in-context"]["overhead"] < 0.01
    assert rows["adaln"]["gmacs"] == min(r["gmacs"] for r in rows.values())
    # at the digits' 16 tokens the two extra tokens are an eighth more work
    small = {r["block"]: r for r in design_table("DiT-S/2", input_size=8, in_channels=1, depth=4, hidden_size=128,
                                                 num_heads=4, num_classes=10)}
    assert small["in-context"]["tokens"] == 18 and 0.05 < small["in-context"]["overhead"] < 0.15


@pytest.mark.parametrize("block", DESIGNS)
def test_each_design_trains_with_checkpointing_masking_and_capture(block):
    model = randomize(tiny(block, depth=3, class_dropout_prob=0.0)).train()  # no label dropout: equal passes
    x, t, _ = inputs()
    y = torch.tensor([0, 3, 9])
    model(x, t, y).square().mean().backward()
    ref = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    assert all(g.abs().sum() > 0 for g in ref), "every trainable weight gets a gradient"
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x, t, y).square().mean().backward()
    for g1, g2 in zip(ref, (p.grad for p in model.parameters() if p.requires_grad)):
        torch.testing.assert_close(g1, g2)
    keep = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(i))[:8] for i in range(3)])
    out, tokens = model(x, t, y, keep=keep, mask_token=torch.zeros(1, 1, 32), decoder_depth=1, capture=1)
    assert out.shape == (3, 8, 8, 8) and tokens.shape == (3, 8, 32)  # the kept image tokens only, never t and y


@pytest.mark.parametrize("block", DESIGNS)
def test_a_checkpoint_records_its_design_and_refuses_another(block, tmp_path):
    model = randomize(tiny(block)).eval()
    state = model.state_dict()
    layout = SAME_WEIGHTS.get(block, block)  # what the weights alone say
    assert infer_block(state) == layout and infer_config(state, num_heads=2)["block"] == layout
    atomic_save({"model": state, "ema": state, "config": {"model_config": model.config()}}, tmp_path / "run.pt")
    loaded = load_dit(tmp_path / "run.pt")
    assert loaded.block == block
    x, t, y = inputs()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, t, y), model(x, t, y))
    other = next(d for d in DESIGNS if d != block)
    with pytest.raises(CheckpointError, match=f"holds a DiT with {block} blocks.*built with {other} blocks"):
        load_dit(tmp_path / "run.pt", block=other)
    lying = {"model": state, "config": {"model_config": {**model.config(), "block": other}}}
    atomic_save(lying, tmp_path / "lying.pt")
    with pytest.raises(CheckpointError, match=f"records {other} blocks, but its weights are those of {layout}"):
        load_dit(tmp_path / "lying.pt")


def test_files_without_a_design_hold_adaln_zero(tmp_path):
    model = randomize(tiny("adaln-zero"))
    config = {k: v for k, v in model.config().items() if k != "block"}  # as older checkpoints wrote it
    atomic_save({"model": model.state_dict(), "config": {"model_config": config}}, tmp_path / "old.pt")
    assert load_dit(tmp_path / "old.pt").block == "adaln-zero"
    with pytest.raises(CheckpointError, match="holds a DiT with adaln-zero blocks.*--block adaln-zero"):
        load_dit(tmp_path / "old.pt", block="in-context")


def test_the_trainer_builds_the_design_and_resume_refuses_another(tmp_path):
    from dit_core.train import make_config, train

    base = dict(data_path="digits", out=str(tmp_path / "run"), depth=1, hidden_size=32, num_heads=2, batch_size=8,
                max_steps=2, log_every=1, ckpt_every=2, sample_at_end=False, tensorboard=False, progress=False,
                warmup_steps=0, threads=1)
    summary = train(make_config("digits", {**base, "block": "in-context"}))
    assert summary["steps"] == 2
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert saved["config"]["block"] == "in-context" and saved["config"]["model_config"]["block"] == "in-context"
    assert load_dit(tmp_path / "run" / "checkpoints" / "last.pt").block == "in-context"
    with pytest.raises(CheckpointError, match="cannot resume.*in-context blocks.*built with adaln-zero"):
        train(make_config("digits", {**base, "block": "adaln-zero", "resume": True, "max_steps": 3}))


def test_the_memory_planner_counts_parameters_of_every_design_and_plans_adaln_zero_only():
    from dit_core.measure.memory import ModelShape, estimate, measure_saved_bytes, param_counts

    for block in DESIGNS:
        model = tiny(block)
        shape = ModelShape.from_model(model)
        assert shape.block == block
        assert param_counts(shape)["total"] == sum(p.numel() for p in model.parameters())
    assert estimate(ModelShape.from_model(tiny("adaln-zero")), micro_batch=2).peak > 0
    with pytest.raises(ValueError, match="plans DiT's adaLN-Zero blocks only, not cross-attention.*measure_saved_bytes"):
        estimate(ModelShape.from_model(tiny("cross-attention")), micro_batch=2)
    assert measure_saved_bytes(tiny("cross-attention"), 2, loss="none")["bytes"] > 0  # the route it names works


def test_forward_macs_grow_with_the_extra_tokens():
    ic, az = tiny("in-context"), tiny("adaln-zero")
    assert ic.extra_tokens == 2 and az.extra_tokens == 0
    assert tiny("in-context", num_classes=0).extra_tokens == 1
    assert forward_macs(ic) > forward_macs(tiny("adaln"))


def test_cross_attention_normalises_its_context_and_the_raw_variant_does_not():
    """The same weights in both variants; only the LayerNorm over [t, y] differs. Normalised, the class token's keys
    and values are as large as the time token's however small its embedding; raw, they are not."""
    from dit_core.designs import CrossAttentionBlock

    normed, raw = randomize(tiny("cross-attention")).eval(), tiny("cross-attention-raw").eval()
    raw.load_state_dict(normed.state_dict())
    assert set(raw.state_dict()) == set(normed.state_dict())
    x, t, y = inputs()
    with torch.no_grad():
        assert not torch.allclose(raw(x, t, y), normed(x, t, y), atol=1e-6)
        context = torch.stack([torch.randn(3, 32), 0.02 * torch.randn(3, 32)], dim=1)  # the class table's start
        block = normed.blocks[0]
        assert isinstance(block, CrossAttentionBlock) and block.normalize_context
        scaled = block.norm_context(context)
        torch.testing.assert_close(scaled.pow(2).mean(-1), torch.ones(3, 2), atol=1e-2, rtol=0)  # eps 1e-6
        weights = block.context_attention(torch.randn(3, 16, 32), context)
        assert weights.shape == (3, 2, 16, 2)
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, 16))
        assert raw.blocks[0].norm_context(context).equal(context)


def test_a_raw_cross_attention_checkpoint_loads_as_raw_and_refuses_the_normalised_design(tmp_path):
    model = randomize(tiny("cross-attention-raw")).eval()
    atomic_save({"model": model.state_dict(), "config": {"model_config": model.config()}}, tmp_path / "raw.pt")
    loaded = load_dit(tmp_path / "raw.pt")
    assert loaded.block == "cross-attention-raw"
    x, t, y = inputs()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, t, y), model(x, t, y))
    with pytest.raises(CheckpointError, match="holds a DiT with cross-attention-raw blocks.*built with cross-attention "):
        load_dit(tmp_path / "raw.pt", block="cross-attention")
