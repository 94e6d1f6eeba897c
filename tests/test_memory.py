"""The memory planner: its activation formula against the bytes autograd really saves, its peak against every
tensor a step allocates (CPU and meta device), and its choices."""

import json
from dataclasses import replace

import pytest
import torch

from dit_core.measure import memory
from dit_core.measure.flops import count_params, meta_model
from dit_core.measure.memory import GIB, ModelShape, TrainSetup, activation_bytes, estimate, plan
from dit_core.models import DiT, DiT_models

TINY = dict(depth=2, hidden_size=64, num_heads=4, patch_size=2, input_size=8, in_channels=4, num_classes=10)
DIGITS = dict(depth=3, hidden_size=96, num_heads=3, patch_size=2, input_size=8, in_channels=1, num_classes=10)


def test_parameter_formula_matches_built_models():
    for name in DiT_models:
        assert memory.param_counts(ModelShape.from_name(name, 256))["total"] == count_params(meta_model(name, 256))
    assert memory.param_counts(ModelShape.from_name("DiT-XL/2"))["total"] == 675_129_632
    for kwargs in (TINY, dict(DIGITS, num_classes=0, learn_sigma=False), dict(DIGITS, class_dropout_prob=0.0)):
        with torch.device("meta"):
            model = DiT(**kwargs)
        counts = memory.param_counts(ModelShape.from_model(model))
        assert counts["total"] == count_params(model)
        assert counts["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("attn", ["sdpa", "math"])
@pytest.mark.parametrize("kwargs", [TINY, DIGITS, dict(DIGITS, num_classes=0, learn_sigma=False)], ids=["tiny", "digits", "uncond"])
def test_activation_formula_equals_saved_tensor_bytes(kwargs, attn, precision):
    torch.manual_seed(0)
    model = DiT(**kwargs, attn_backend=attn)
    shape = ModelShape.from_model(model)
    for checkpointed in (0, 1, shape.depth):
        model.set_grad_checkpointing(checkpointed)
        measured = memory.measure_saved_per_sample(model, precision)
        predicted = activation_bytes(shape, precision, attn, checkpointed)
        assert predicted.per_sample == pytest.approx(measured["per_sample"], rel=2e-3, abs=32)
        # the batch-independent part is autocast's weight copies that backward needs
        assert predicted.weight_casts == pytest.approx(measured["constant"], abs=64)


def test_activation_formula_on_a_dit_s_model_with_bf16_and_sdpa():
    """A real DiT-S block width (384, 6 heads) on the CPU, in the precision and attention that GPUs use."""
    torch.manual_seed(0)
    model = DiT(**ModelShape.from_name("DiT-S/4", 128).model_kwargs())  # 16 x 16 latents, 16 tokens
    shape = ModelShape.from_model(model)
    measured = memory.measure_saved_per_sample(model, "bf16")["per_sample"]
    assert activation_bytes(shape, "bf16", "sdpa").per_sample == pytest.approx(measured, rel=1e-3)


def test_activation_formula_on_dit_xl2_at_256px_on_the_meta_device():
    """The large configuration costs nothing on the meta device (fp32, math attention there)."""
    model = meta_model("DiT-XL/2", 256, attn_backend="math")
    shape = ModelShape.from_model(model)
    for checkpointed in (0, 28):
        model.set_grad_checkpointing(checkpointed)
        measured = memory.measure_saved_per_sample(model, "fp32", loss="none")["per_sample"]
        predicted = activation_bytes(shape, "fp32", "math", checkpointed, loss="none").per_sample
        assert predicted == pytest.approx(measured, rel=1e-3)
    # the fp32 per-sample figure behind the out-of-memory reports: ~0.77 GiB per image without checkpointing
    assert 0.7 < activation_bytes(shape, "fp32", "math").per_sample / memory.GIB < 0.8


def test_checkpointing_and_mixed_precision_shrink_activations_as_derived():
    shape = ModelShape.from_name("DiT-XL/2", 256)
    fp32 = activation_bytes(shape, "fp32", "sdpa")
    bf16 = activation_bytes(shape, "bf16", "sdpa")
    ckpt = activation_bytes(shape, "bf16", "sdpa", checkpointed=28)
    assert 0.55 < bf16.per_sample / fp32.per_sample < 0.65  # residual stream and LayerNorm stay fp32
    assert ckpt.per_sample < fp32.per_sample / 15  # only each block's input survives
    math = activation_bytes(shape, "fp32", "math")
    assert math.per_sample > fp32.per_sample  # explicit attention keeps the T x T probabilities
    with pytest.raises(ValueError, match="checkpointed must be in 0..28"):
        activation_bytes(shape, checkpointed=29)


@pytest.mark.parametrize("precision,attn,checkpointed,accum", [
    ("fp32", "sdpa", 0, 1), ("fp32", "math", 1, 2), ("bf16", "sdpa", 0, 2), ("bf16", "sdpa", 3, 1),
])
def test_predicted_peak_brackets_the_tracked_peak_on_cpu(precision, attn, checkpointed, accum):
    shape = ModelShape(name="digits-like", **DIGITS)
    setup = TrainSetup(micro_batch=8, grad_accum=accum, checkpointed=checkpointed, precision=precision, attn=attn)
    measured = memory.simulate_peak(shape, setup, "cpu")["peak"]
    predicted = estimate(shape, setup, loss="none").peak
    assert -0.03 < memory.relative_error(predicted, measured) < 0.10


@pytest.mark.slow
def test_predicted_peak_of_dit_xl2_on_the_meta_device():
    shape = ModelShape.from_name("DiT-XL/2", 256)
    setup = TrainSetup(micro_batch=32, checkpointed=28, precision="fp32", attn="math")
    measured = memory.simulate_peak(shape, setup, "meta")
    # alive when the step starts: weights, EMA, AdamW's two moments and last step's gradients
    assert measured["start"] == pytest.approx(20 * 675_129_632, rel=0.01)
    predicted = estimate(shape, setup, loss="none").peak
    assert -0.03 < memory.relative_error(predicted, measured["peak"]) < 0.10


#: Small AutoencoderKL stand-ins (SD's layout, fewer channels) that run on the CPU in a moment.
STAND_INS = {"two ResNets per stage": dict(block_out_channels=[32, 64, 64, 64], layers_per_block=2, norm_num_groups=8),
             "one ResNet per stage": dict(block_out_channels=[16, 32, 32, 32], layers_per_block=1, norm_num_groups=8)}


def _vae(config: dict, device: str = "cpu"):
    diffusers = pytest.importorskip("diffusers")
    from dit_core.vae import SD_VAE_CONFIG

    torch.manual_seed(0)
    with torch.device(device):
        return diffusers.AutoencoderKL(**dict(SD_VAE_CONFIG, **config)).eval().requires_grad_(False)


def _tracked_encode_peak(vae, x, precision):
    from dit_core.vae import sample_latents

    tracker = memory.TensorMemoryTracker()
    with tracker:
        sample_latents(vae, x, precision)
    tracker.close()
    return tracker.peak


def test_vae_term_of_sd_vae_matches_the_tracked_encoder_peak():
    vae = _vae({}, "meta")
    assert sum(p.numel() for p in vae.parameters()) == memory.VAE_PARAMS
    assert memory.VaeShape.from_model(vae) == replace(memory.SD_VAE, name="custom")
    peak = _tracked_encode_peak(vae, torch.zeros(2, 3, 256, 256, device="meta"), "fp32")
    est = estimate(ModelShape.from_name("DiT-S/2"), micro_batch=2, vae_in_loop=True, vae_precision="fp32")
    assert est.vae_weights == memory.VAE_PARAMS * 4
    assert est.vae_encode == pytest.approx(peak, rel=0.01)  # the posterior's small tensors on top
    # five full-resolution maps of 128 channels per image in fp32 (two ResNets: the encoder holds the input)
    assert memory.vae_encode_bytes(memory.SD_VAE, 256, "fp32") == 5 * 128 * 256 * 256 * 4


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(STAND_INS))
def test_vae_term_matches_the_tracked_encoder_peak_of_stand_ins(name, precision):
    vae = _vae(STAND_INS[name])
    shape = memory.VaeShape.from_model(vae, name)
    assert shape.params == sum(p.numel() for p in vae.parameters()) and shape.downsample == 8
    for size in (32, 64):
        peak = _tracked_encode_peak(vae, torch.rand(2, 3, size, size) * 2 - 1, precision)
        assert 2 * memory.vae_encode_bytes(shape, size, precision, "cpu") == pytest.approx(peak, rel=0.01)
    # CUDA's autocast runs GroupNorm in fp32: more bytes at the worst moment than the CPU's (modelled, not run)
    cuda, cpu = (memory.vae_encode_bytes(shape, 64, precision, d) for d in ("cuda", "cpu"))
    assert cuda > cpu if precision != "fp32" else cuda == cpu


def test_planner_with_the_vae_encoder_in_the_loop_against_autograd_and_the_step_peak(tmp_path):
    """The rung with the VAE in the loop, on the CPU with a stand-in VAE: autograd saves nothing for the encoder
    (it runs without gradient), the DiT's saved bytes are the formula's, and the whole step's tracked peak, which
    falls while encoding, is the planner's (on the safe side, within 10 %)."""
    from dit_core.measure import bench
    from dit_core.vae import sample_latents

    vae = _vae(STAND_INS["two ResNets per stage"])
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        latents = sample_latents(vae, torch.rand(4, 3, 64, 64) * 2 - 1)
    assert saved == [] and latents.shape == (4, 4, 8, 8)
    dit = DiT(**TINY)
    shape = ModelShape.from_model(dit)
    measured = memory.measure_saved_per_sample(dit, "fp32")["per_sample"]
    assert activation_bytes(shape, "fp32", "sdpa").per_sample == pytest.approx(measured, rel=2e-3, abs=32)

    vae.save_pretrained(tmp_path / "vae")
    spec = bench.BenchSpec(model="tiny", image_size=64, batch_size=4, steps=1, warmup=1, threads=1,
                           vae=str(tmp_path / "vae"), shape=dict(TINY, input_size=8))
    for rung in ("baseline", "amp"):
        row = bench.measure_rung(spec, rung)
        assert row["status"] == "ok" and row["vae"].endswith("(pretrained weights)"), row
        est = estimate(shape, bench.ladder.rung_setup(spec, bench.RUNGS[rung], "cpu", row["precision"],
                                                       memory.VaeShape.from_model(vae)))
        assert est.peak_moment == "vae" and est.peak == row["planned_peak_bytes"]
        assert 0 <= memory.relative_error(row["planned_peak_bytes"], row["tensor_peak_bytes"]) < 0.10, row



def test_tracker_counts_allocations_once_and_sees_frees():
    tracker = memory.TensorMemoryTracker()
    with tracker:
        a = torch.ones(1000)  # 4000 bytes
        view = a[:10]  # shares storage: not a new allocation
        b = a * 2
        assert tracker.live == 8000
        del a, b
    assert tracker.peak == 8000
    assert tracker.live == 4000  # `view` keeps a's storage alive
    del view
    assert tracker.live == 0
    tracker.close()


def test_planner_choices_by_card_size():
    shape = ModelShape.from_name("DiT-XL/2", 256)
    big = plan(shape, 80, global_batch=256)
    assert big.fits and big.setup.checkpointed == 0 and big.estimate.peak <= big.budget
    mid = plan(shape, "24GB", global_batch=256)
    assert mid.fits and mid.estimate.peak <= mid.budget
    assert mid.setup.global_batch == 256 and mid.setup.grad_accum > 1
    assert big.setup.micro_batch >= mid.setup.micro_batch
    # the same card without mixed precision needs more recomputation or smaller micro-batches
    fp32 = plan(shape, 24, global_batch=256, precision="fp32")
    assert fp32.relative_time >= mid.relative_time
    assert any("choice: micro-batch" in line for line in mid.explanation)


def test_dit_xl2_on_12_gb_needs_the_low_memory_options():
    shape = ModelShape.from_name("DiT-XL/2", 256)
    default = plan(shape, "rtx3060")
    assert not default.fits
    assert "--ema-device cpu" in str(default) and "--optimizer adamw8bit" in str(default)
    rows = {r["option"]: r for r in memory.low_memory_options(shape, 12)}
    both = rows["8-bit AdamW + EMA on the CPU"]
    assert both["fits"] and both["peak_gib"] <= 12
    assert "PCIe" in both["cost"] and "bitsandbytes" in both["cost"]
    assert rows["AdamW, EMA on the GPU"]["static_gib"] > 10  # 16 bytes per parameter


def test_eight_bit_adamw_state_bytes_match_bitsandbytes():
    bnb = pytest.importorskip("bitsandbytes")
    layer = torch.nn.Linear(256, 256, bias=False)
    opt = bnb.optim.AdamW8bit(layer.parameters(), lr=1e-4)
    layer(torch.randn(4, 256)).sum().backward()
    opt.step()
    tensors = [v for k, v in opt.state[layer.weight].items() if torch.is_tensor(v) and not k.startswith("qmap")]
    state = memory.tensor_bytes(tensors)  # 8-bit moments and their block scales; the shared qmaps excluded
    assert state == memory.optimizer_state_bytes(256 * 256, "adamw8bit")


def test_bad_inputs_say_what_to_do():
    with pytest.raises(ValueError, match="rtx3090"):
        memory.parse_memory("lots")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        TrainSetup(optimizer="sgd")
    with pytest.raises(ValueError, match="precision must be one of"):
        TrainSetup(precision="fp8")
    with pytest.raises(ValueError, match="attention backend must be one of"):
        activation_bytes(ModelShape(**TINY), attn="flash")
    assert memory.parse_memory("rtx3090") == 24 and memory.parse_memory("40GB") == 40


def test_dit_plan_command(capsys):
    from dit_core.cli.plan import main

    assert main(["--model", "DiT-XL/2", "--gpu-memory", "24"]) == 0
    out = capsys.readouterr().out
    assert "choice: micro-batch" in out and "predicted peak" in out and "activations per sample" in out
    assert main(["--model", "DiT-XL/2", "--gpu-memory", "12", "--low-memory"]) == 0  # fits with the fallback
    out = capsys.readouterr().out
    assert "does not fit with adamw" in out and "8-bit AdamW + EMA on the CPU" in out and "12 GiB card" in out
    assert main(["--model", "DiT-XL/2", "--gpu-memory", "4"]) == 1  # nothing fits 4 GB
    assert "does not fit" in capsys.readouterr().out
    assert main(["--model", "digits", "--gpu-memory", "12", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["setup"]["checkpointed"] == 0
    assert main(["--model", "DiT-XL/2", "--gpu-memory", "plenty"]) == 2
    assert "neither a number" in capsys.readouterr().err


@pytest.mark.parametrize("card", [12, 16, 24, 40, 80])
def test_the_command_dit_plan_prints_runs_in_dit_train(card, capsys):
    """The last lines of dit-plan are a dit-train command: parsed as a shell would and given to dit-train's own
    argument parser, it gives the configuration the planner chose, whose estimate fits the card."""
    import shlex

    from dit_core.cli.plan import main
    from dit_core.cli.train import config_from_args
    from dit_core.measure.memory import card_budget, config_setup

    assert main(["--model", "DiT-XL/2", "--gpu-memory", str(card)]) == 0
    out = capsys.readouterr().out
    commands = [line.strip() for line in out.splitlines() if line.strip().startswith("dit-train ")]
    assert len(commands) == 1, out
    argv = shlex.split(commands[0])
    assert argv[0] == "dit-train"
    cfg = config_from_args(argv[1:])  # what `dit-train ...` does with it
    assert cfg.model == "DiT-XL/2" and cfg.batch_size == 256 and cfg.latents_path
    shape, setup = config_setup(cfg)
    assert estimate(shape, setup).peak <= card_budget(card)
    small = card <= 16  # the default (AdamW, EMA on the GPU) does not fit: the planner falls back
    assert cfg.ema_device == ("cpu" if small else "same")
    assert ("does not fit with adamw" in out) == small
    assert cfg.optimizer == ("adamw8bit" if card == 12 else "adamw")
    # and the JSON carries the same command
    assert main(["--model", "DiT-XL/2", "--gpu-memory", str(card), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["command"] == commands[0]


def test_the_12_gb_profile_fits_12_gb_by_the_planners_estimate():
    from dit_core.measure.memory import card_budget, config_setup
    from dit_core.train import make_config

    cfg = make_config("rtx3060-12gb")
    shape, setup = config_setup(cfg)
    assert (setup.optimizer, setup.ema, setup.precision) == ("adamw8bit", "cpu", "bf16")
    peak, budget = estimate(shape, setup).peak, card_budget(12)
    assert peak <= budget, f"rtx3060-12gb: predicted {peak / GIB:.2f} GiB > budget {budget / GIB:.2f} GiB"
    # the same micro-batch with AdamW and the EMA on the GPU would not fit: the two savings are needed
    assert estimate(shape, replace(setup, optimizer="adamw", ema="device")).peak > budget
    # every GPU profile fits its card by the same estimate
    for name, card in (("rtx3090-24gb", 24), ("a100-40gb", 40), ("a100-80gb", 80), ("h100-80gb", 80)):
        shape, setup = config_setup(make_config(name))
        assert estimate(shape, setup).peak <= card_budget(card), name
