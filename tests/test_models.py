"""The DiT model: official layout, parameter and multiply-add counts, attention backends, checkpointing,
guidance, meta device and torch.compile."""

from __future__ import annotations

import re

import pytest
import torch

from dit_core import DiT, DiT_models
from dit_core.attention import xformers_available
from dit_core.measure.flops import PAPER_GMACS_256, PAPER_PARAMS_256, count_params, forward_macs, meta_model
from dit_core.models import sincos_2d

from official_layout import REFERENCE, published_layout
from shared_reference import reference_file, skip_reason
from reference_dit import reference_forward


def tiny(**kw):
    args = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=64, depth=3, num_heads=4, num_classes=10)
    args.update(kw)
    return DiT(**args)


def randomize(model, seed=0):
    """Fill every weight (the adaLN-Zero zeros included) with random values, so tests see all paths."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "pos_embed":
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 / max(1, p.shape[-1]) ** 0.5)
    return model


def inputs(n=4, size=8, classes=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 4, size, size, generator=g), torch.randint(0, 1000, (n,), generator=g),
            torch.randint(0, classes, (n,), generator=g))


# -- the official layout and the paper's figures ---------------------------------------------------------


def test_all_twelve_configs_exist():
    assert sorted(DiT_models) == sorted(f"DiT-{s}/{p}" for s in ("S", "B", "L", "XL") for p in (2, 4, 8))


@pytest.mark.parametrize("entry,image_size", [("DiT-XL/2 256px", 256), ("DiT-XL/2 512px", 512)])
def test_state_dict_matches_published_layout(entry, image_size):
    layout = published_layout()
    if layout is None:
        pytest.skip(skip_reason(REFERENCE))
    ref = layout[entry]
    model = meta_model("DiT-XL/2", image_size)
    sd = model.state_dict()
    assert len(sd) == ref["num_keys"]
    assert count_params(model) == ref["num_params_including_pos_embed"]
    for key, shape in ref["keys_outside_blocks_and_block_0"].items():
        assert tuple(sd[key].shape) == tuple(shape), key
    block0 = {k[len("blocks.0."):]: v.shape for k, v in sd.items() if k.startswith("blocks.0.")}
    for i in range(28):
        block = {k[len(f"blocks.{i}."):]: v.shape for k, v in sd.items() if k.startswith(f"blocks.{i}.")}
        assert block == block0
    outside = {k for k in sd if not k.startswith("blocks.")}
    assert outside == {k for k in ref["keys_outside_blocks_and_block_0"] if not k.startswith("blocks.")}


#: The paper's figures at 256 px, written here (not taken from the library's table, which is checked against
#: them): forward multiply-adds per image in G (Table 4 / Fig. 2, three significant figures), and the
#: parameters of the four /2 models with pos_embed (the released checkpoints; shared/reference/FACTS.md).
PAPER_GMACS = {"DiT-S/8": 0.36, "DiT-S/4": 1.41, "DiT-S/2": 6.06, "DiT-B/8": 1.42, "DiT-B/4": 5.56, "DiT-B/2": 23.0,
               "DiT-L/8": 5.01, "DiT-L/4": 19.7, "DiT-L/2": 80.7, "DiT-XL/8": 7.39, "DiT-XL/4": 29.0,
               "DiT-XL/2": 118.6}
PAPER_PARAMS = {"DiT-S/2": 32_963_360, "DiT-B/2": 130_512_416, "DiT-L/2": 458_102_816, "DiT-XL/2": 675_129_632}


@pytest.mark.parametrize("name", sorted(DiT_models))
def test_params_and_macs_match_paper(name):
    model = meta_model(name, 256)
    if name in PAPER_PARAMS:
        assert count_params(model) == PAPER_PARAMS[name] == PAPER_PARAMS_256[name]
    paper = PAPER_GMACS[name]
    gmacs = forward_macs(model) / 1e9
    # published figures carry three significant figures (rounded or truncated)
    digits = 3 - len(str(int(paper))) if paper >= 1 else 2
    assert abs(gmacs - paper) <= 1.01 * 10 ** (-digits), (gmacs, paper)
    assert PAPER_GMACS_256[name] == paper  # the table dit-models prints beside the counts


def test_paper_figures_are_those_of_the_reference_facts():
    facts = reference_file("FACTS.md")
    if facts is None:
        pytest.skip(skip_reason("FACTS.md"))
    text = facts.read_text()
    macs = text.split("Forward multiply-adds per image")[1].split("At 512")[0]
    assert {f"DiT-{s}/{p}": float(v) for s, p, v in re.findall(r"\b(S|B|L|XL)/(\d) (\d+(?:\.\d+)?)", macs)} == PAPER_GMACS
    params = {f"DiT-{s}/2": int(v.replace(",", "")) for s, v in re.findall(r"\| (S|B|L|XL) \|[^\n]*\| ([\d,]+) \|", text)}
    assert params == PAPER_PARAMS


def test_xl2_training_flops_per_image():
    # FACTS: one DiT-XL/2 training image costs about 712 GFLOP (3 forwards, 2 FLOPs per multiply-add)
    assert abs(6 * forward_macs(meta_model("DiT-XL/2")) / 1e9 - 712) < 1


def test_meta_device_forward_and_512px():
    model = meta_model("DiT-XL/2", 512)
    assert model.pos_embed.device.type == "meta" and model.input_size == 64
    x = torch.empty(2, 4, 64, 64, device="meta")
    t = torch.zeros(2, dtype=torch.long, device="meta")
    out = model(x, t, t)
    assert out.shape == (2, 8, 64, 64) and out.device.type == "meta"


# -- equations of the paper ------------------------------------------------------------------------------


def test_forward_matches_independent_reference():
    model = randomize(tiny()).eval()  # eval: no label dropout
    x, t, y = inputs()
    ref = reference_forward(model.state_dict(), x, t, y, num_heads=4, patch=2)
    out = model(x, t, y)
    assert out.shape == (4, 8, 8, 8)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.double()(x.double(), t, y), ref, rtol=1e-10, atol=1e-10)


def test_pos_embed_is_fixed_sincos():
    model = tiny()
    g = model.x_embedder.grid_size
    assert not model.pos_embed.requires_grad
    pe = model.pos_embed[0].double()
    # token (row i, col j): first half encodes j, second half i; sin then cos, frequencies 10000^(-k/(D/4))
    d4 = model.hidden_size // 4
    omega = 1.0 / 10000 ** (torch.arange(d4, dtype=torch.float64) / d4)
    i, j = 2, 3
    expected = torch.cat([torch.sin(j * omega), torch.cos(j * omega), torch.sin(i * omega), torch.cos(i * omega)])
    torch.testing.assert_close(pe[i * g + j], expected, rtol=0, atol=1e-6)
    assert sincos_2d(64, 4).shape == (16, 64)


def test_adaln_zero_starts_as_identity():
    model = tiny()
    x, t, y = inputs()
    h = torch.randn(4, 16, 64)
    c = torch.randn(4, 64)
    for block in model.blocks:
        assert torch.equal(block(h, c), h)
    assert torch.count_nonzero(model(x, t, y)) == 0


def test_label_dropout_uses_null_class():
    model = tiny(class_dropout_prob=1.0).train()
    emb = model.y_embedder
    y = torch.arange(10)
    null = emb.embedding_table.weight[10]
    assert torch.equal(emb(y, train=True), null.expand(10, -1))
    assert torch.equal(emb(y, train=False), emb.embedding_table.weight[:10])
    forced = emb(y, train=False, force_drop_ids=(y % 2 == 0).long())
    assert torch.equal(forced[0], null) and torch.equal(forced[1], emb.embedding_table.weight[1])
    assert tiny(class_dropout_prob=0.0).y_embedder.embedding_table.weight.shape[0] == 10


def test_unconditional_model():
    model = randomize(tiny(num_classes=0))
    assert model.y_embedder is None
    x, t, _ = inputs()
    assert model(x, t).shape == (4, 8, 8, 8)


# -- classifier-free guidance ----------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [None, 3])
def test_forward_with_cfg(channels):
    model = randomize(tiny()).eval()
    x, t, y = inputs(n=2)
    y_all = torch.cat([y, torch.full_like(y, 10)])
    x_all, t_all = torch.cat([x, x]), torch.cat([t, t])
    out = model.forward_with_cfg(x_all, t_all, y_all, cfg_scale=4.0, guidance_channels=channels)
    cond, uncond = model(x, t, y), model(x, t, torch.full_like(y, 10))
    k = 4 if channels is None else 3
    guided = uncond[:, :k] + 4.0 * (cond[:, :k] - uncond[:, :k])
    torch.testing.assert_close(out[:2, :k], guided, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[2:, :k], guided, rtol=1e-5, atol=1e-5)
    # unguided channels pass through: the conditional half's from the conditional pass, the other's from the null
    torch.testing.assert_close(out[:2, k:], cond[:, k:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[2:, k:], uncond[:, k:], rtol=1e-5, atol=1e-5)
    if channels == 3:  # the official quirk: the 4th noise channel is not guided
        assert not torch.allclose(out[:2, 3], (uncond + 4.0 * (cond - uncond))[:, 3])


def test_cfg_rejects_bad_input():
    model = tiny()
    x, t, y = inputs(n=3)
    with pytest.raises(ValueError, match="even batch"):
        model.forward_with_cfg(x, t, y, 4.0)
    with pytest.raises(ValueError, match="guidance_channels"):
        model.forward_with_cfg(x[:2], t[:2], y[:2], 4.0, guidance_channels=5)


# -- attention backends and checkpointing ----------------------------------------------------------------


def _loss_and_grads(model, x, t, y):
    model.zero_grad()
    loss = (model(x, t, y) ** 2).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("backend", ["math"] + (["xformers"] if xformers_available() else []))
def test_attention_backends_agree(backend):
    model = randomize(tiny())
    x, t, y = inputs()
    ref_loss, ref_grads = _loss_and_grads(model.eval(), x, t, y)
    model.set_attention_backend(backend)
    assert model.attn_backend == backend
    loss, grads = _loss_and_grads(model, x, t, y)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for k in ref_grads:
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=1e-4, atol=1e-6)


def test_inputs_on_another_device_are_a_clear_error():
    model = tiny()
    x, t, y = inputs()
    with pytest.raises(RuntimeError, match=r"device mismatch: t is on meta but the model's weights are on cpu.*\.to\('cpu'\)"):
        model(x, t.to("meta"), y)
    with pytest.raises(RuntimeError, match=r"x is on meta.*model.to\('meta'\)"):
        model(x.to("meta"), t, y)


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown attention backend 'flash3'"):
        tiny(attn_backend="flash3")
    if not xformers_available():
        with pytest.raises(ValueError, match="pip install"):
            tiny().set_attention_backend("xformers")


@pytest.mark.parametrize("which", [True, 2, [0, 2]])
def test_checkpointed_blocks_give_the_same_gradients(which):
    model = randomize(tiny()).eval()
    x, t, y = inputs()
    ref_loss, ref_grads = _loss_and_grads(model, x, t, y)
    model.set_grad_checkpointing(which)
    expected = {True: [0, 1, 2], 2: [0, 1]}.get(which, [0, 2]) if not isinstance(which, list) else which
    assert model.checkpointed_blocks == expected
    loss, grads = _loss_and_grads(model, x, t, y)
    assert torch.equal(loss, ref_loss)
    for k in ref_grads:
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=1e-6, atol=1e-7)


def test_checkpointing_bad_indices():
    with pytest.raises(ValueError, match="out of range"):
        tiny().set_grad_checkpointing([5])


def test_torch_compile_matches_eager():
    model = randomize(tiny()).eval()
    x, t, y = inputs()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, t, y), model(x, t, y), rtol=1e-5, atol=1e-5)


def test_wrong_input_size_and_unknown_model():
    with pytest.raises(ValueError, match="takes 8x8 inputs"):
        tiny()(torch.randn(1, 4, 16, 16), torch.zeros(1), torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown model 'DiT-M/2'"):
        meta_model("DiT-M/2")
