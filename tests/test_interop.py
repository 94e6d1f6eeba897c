"""diffusers interop: the key mapping, the documented numerical differences, DiTPipeline against our sampler."""

import json

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from dit_core import interop  # noqa: E402
from dit_core.diffusion import create_diffusion  # noqa: E402
from dit_core.models import DiT  # noqa: E402
from dit_core.sample import generate, load_model  # noqa: E402

from test_sample import tiny_dit  # noqa: E402


def inputs(n=4, channels=1, size=8):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, channels, size, size, generator=g), torch.tensor([0, 10, 500, 999])[:n],
            torch.tensor([0, 3, 9, 10])[:n])


def test_state_dict_round_trip_is_exact():
    model = tiny_dit()
    config = model.config()
    there = interop.to_diffusers_state_dict(model.state_dict(), config)
    # every block holds a copy of the shared embedders; the label table is padded to DiTPipeline's 1001 rows
    assert there["transformer_blocks.1.norm1.emb.class_embedder.embedding_table.weight"].shape == (1001, 32)
    back = interop.from_diffusers_state_dict(there, config)
    ours = model.state_dict()
    assert set(back) == set(ours) - {"pos_embed"}
    for k, v in back.items():
        assert torch.equal(v, ours[k]), k


def test_exported_transformer_computes_our_outputs_once_timesteps_match():
    model = tiny_dit()
    transformer = interop.to_diffusers_transformer(model)
    x, t, y = inputs()
    with torch.no_grad():
        ours = model(x, t, y)
        theirs = transformer(x, timestep=t, class_labels=y).sample
        # Difference 1 of the module docstring: diffusers' timestep frequencies 10000^(-k/127), not /128.
        assert (ours - theirs).abs().max() > 1e-3
        interop.match_dit_timestep_embedding(transformer)
        theirs = transformer(x, timestep=t, class_labels=y).sample
        assert torch.allclose(ours, theirs, atol=1e-5)
        # DiTPipeline's hard-coded null label 1000 is our null class num_classes = 10
        padded_null = transformer(x, timestep=t, class_labels=torch.tensor([0, 3, 9, 1000])).sample
        assert torch.allclose(ours, padded_null, atol=1e-5)


@pytest.mark.parametrize("num_classes,dropout", [(10, 0.0), (1000, 0.1)])
def test_label_tables_of_any_class_count_round_trip(tmp_path, num_classes, dropout):
    model = DiT(input_size=4, patch_size=2, in_channels=1, hidden_size=16, depth=1, num_heads=2,
                num_classes=num_classes, class_dropout_prob=dropout).eval()
    torch.nn.init.normal_(model.y_embedder.embedding_table.weight)
    out = interop.export_diffusers(model, tmp_path / "e")
    if num_classes == 1000:  # an ImageNet folder from elsewhere (the hub's facebook/DiT-XL-2-256) has no dit_core.json
        (out / interop.META_FILE).unlink()
    back = interop.load_diffusers(out)
    assert back.config() == model.config()
    assert torch.equal(back.y_embedder.embedding_table.weight, model.y_embedder.embedding_table.weight)


def test_untied_embedders_cannot_be_imported():
    model = tiny_dit()
    there = interop.to_diffusers_state_dict(model.state_dict(), model.config())
    there["transformer_blocks.1.norm1.emb.timestep_embedder.linear_1.bias"] += 0.1
    with pytest.raises(interop.InteropError, match="untied per-block embedders"):
        interop.from_diffusers_state_dict(there, model.config())


def test_export_folder_layout_and_import(tmp_path):
    model = tiny_dit()
    names = [f"digit {i}" for i in range(10)]
    out = interop.export_diffusers(model, tmp_path / "export", label_names=names)
    assert {p.name for p in out.iterdir()} == {"model_index.json", "transformer", "scheduler", "dit_core.json"}
    index = json.loads((out / "model_index.json").read_text())
    assert index["_class_name"] == "DiTPipeline" and index["id2label"]["3"] == "digit 3"
    assert index["scheduler"] == ["diffusers", "DDIMScheduler"]
    scheduler = json.loads((out / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["clip_sample"] is False and scheduler["beta_schedule"] == "linear"
    with pytest.raises(FileExistsError, match="overwrite"):
        interop.export_diffusers(model, out)

    back, info = load_model(out)
    assert info["kind"] == "diffusers" and info["label_names"] == names and info["space"] == "pixel"
    assert back.config() == model.config()
    for k, v in model.state_dict().items():
        assert torch.allclose(v, back.state_dict()[k], atol=1e-6 if k == "pos_embed" else 0), k


@pytest.mark.parametrize("sampler", ["ddim", "dpm-solver++"])
def test_dit_pipeline_gives_our_images(tmp_path, sampler):
    """A DiT exported to diffusers and run through DiTPipeline (guidance 4, a tiny random VAE) gives the images of
    our sampler to within 1e-4 (measured: 4e-7, float32 round-off), with the exported DDIMScheduler or with
    DPM-Solver++; without the timestep fix the pipeline's images differ by about 3e-3."""
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(in_channels=1, out_channels=1, latent_channels=4, block_out_channels=(8,),
                                  down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
                                  layers_per_block=1, norm_num_groups=4, sample_size=8).eval()
    model = tiny_dit(in_channels=4, seed=3)
    out = interop.export_diffusers(model, tmp_path / "pipe", vae=vae)
    assert (out / "vae" / "config.json").is_file()

    labels, steps, scale, seed = [1, 4, 7], 10, 4.0, 21
    ours = generate(model, create_diffusion(""), labels, sampler=sampler, steps=steps, cfg_scale=scale, seed=seed,
                    vae=vae)

    pipe = diffusers.DiTPipeline.from_pretrained(out)
    if sampler != "ddim":
        pipe.scheduler = interop.make_scheduler(sampler)
    pipe.set_progress_bar_config(disable=True)

    def run():
        gens = [torch.Generator().manual_seed(seed + i) for i in range(len(labels))]  # our per-sample seeds
        images = pipe(labels, guidance_scale=scale, num_inference_steps=steps, generator=gens, output_type="pt").images
        return images * 2 - 1  # the pipeline returns [0, 1]

    raw = run()
    interop.match_dit_timestep_embedding(pipe.transformer)
    matched = run()
    assert matched.shape == ours.shape
    assert (matched - ours).abs().max() < 1e-4
    assert (raw - ours).abs().max() > 1e-3


def test_pixel_model_runs_in_dit_pipeline_with_the_pixel_decoder(tmp_path):
    model = tiny_dit()
    out = interop.export_diffusers(model, tmp_path / "digits")
    pipe = diffusers.DiTPipeline.from_pretrained(out, vae=interop.PixelDecoder())
    pipe.set_progress_bar_config(disable=True)
    interop.match_dit_timestep_embedding(pipe.transformer)
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    theirs = pipe([2, 5], guidance_scale=3.0, num_inference_steps=8, generator=gens, output_type="pt").images * 2 - 1
    # Pixel space: our sampler clips x0 by default and DDIMScheduler does not (clip_sample=False), so compare
    # without clipping; the pipeline clamps the final image to [0, 1] as we clamp to [-1, 1].
    ours = generate(model, None, [2, 5], sampler="ddim", steps=8, cfg_scale=3.0, seed=0, clip_denoised=False)
    assert torch.allclose(theirs, ours.clamp(-1, 1), atol=1e-4)
