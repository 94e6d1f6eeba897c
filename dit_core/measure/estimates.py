"""How long DiT-XL/2 takes on one GPU: the book's one table of estimates, anchored on measured utilisation.

An estimate here is always

    time = work / (the card's dense peak for the precision used  x  the model-FLOPs utilisation (MFU) that this
                   project measured, on its H200, in the configuration the card's profile runs)

* **work**: one training image of DiT-XL/2 at 256 px is 3 forward passes of 118.62 G multiply-adds, 2 FLOPs
  each: 711.73 GFLOP (:mod:`dit_core.measure.flops` counts them; recomputation by gradient checkpointing is
  *not* counted, so a checkpointed run simply shows a lower MFU and is not penalised a second time). The paper's
  400K steps of 256 images are 7.29e19 FLOP.
* **peak**: the dense (no sparsity) tensor-core rate for bf16 inputs with fp32 accumulation, which is what
  ``torch.autocast(dtype=torch.bfloat16)`` runs (:data:`CARDS`, with a source for each).
* **MFU**: :data:`ANCHORS`, read off the project's GPU records in ``benchmarks/results/`` (tests/test_estimates.py
  checks every figure against those files). An MFU measured on one card does not carry over exactly to another
  (memory bandwidth, clock and kernel choice differ), which is why every result is labelled an estimate.

``python -m dit_core.measure.estimates`` prints the table that chapter 06 shows (:func:`markdown_table`; a
markdown page that quotes a training time must hold it verbatim, tests/test_estimates.py checks). Chapters compute
their figures with :func:`training_estimate` and :func:`sampling_seconds_per_image`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The paper's reference training run: 400K steps at global batch 256 (Peebles & Xie 2023, Table 4 and Sec. 5).
PAPER_STEPS = 400_000
GLOBAL_BATCH = 256
#: DiT-XL/2 at 256 px: forward multiply-adds of one image as dit_core.measure.flops counts them (118.621 G; the
#: paper's Table 4 says 118.6), and the training FLOPs per image, 3 forward passes x 2 FLOPs per multiply-add.
FORWARD_GMACS_XL2_256 = 118.621
TRAIN_GFLOP_PER_IMAGE = 6 * FORWARD_GMACS_XL2_256  # 711.73
SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class Anchor:
    """One measured model-FLOPs utilisation and where it comes from."""

    mfu: float  # fraction of the card's dense bf16 peak
    images_per_s: float  # what was measured on the H200
    configuration: str  # micro-batch x accumulation, blocks checkpointed, what ran
    record: str  # the file under benchmarks/results/ and its row
    micro_batch: int | None = None
    grad_accum: int | None = None
    checkpointed_blocks: int | None = None  # of DiT-XL/2's 28


#: Utilisation measured on one NVIDIA H200 (989 TFLOP/s dense bf16), 2026-11-29, DiT-XL/2 at 256 px, bf16
#: autocast, fused attention, TF32, pre-extracted latents (benchmarks/results/nvidia-h200-dit-xl2.md explains the
#: runs). Rows measured with the CUDA allocator capped at a smaller card's size are the configurations the book's
#: profiles for those cards use.
ANCHORS: dict[str, Anchor] = {  # one measured row per anchor: the rows are alike in shape, as a table's are
    # The trainer's step at its fastest: every trick but checkpointing, batch 32, no accumulation (the ladder).
    "best-rung": Anchor(
        0.3155, 438.42, "32 x 1, no checkpointing (the ladder's fastest rung)",
        "nvidia-h200-dit-xl2.json, rung 'all-no-ckpt'", 32, 1, 0),
    # The planner-check rows record img/s; their MFU is img/s x 711.73 GFLOP / 989 TFLOP/s, as the file's table prints.
    # The planner's choice for 80 GiB, which is the a100-80gb and h100-80gb profiles' configuration.
    "80gb": Anchor(
        0.2701, 375.3, "128 x 2, no checkpointing (allocator capped at 80 GiB)",
        "nvidia-h200-planner-check.json, row 'planner, 80 GiB: 128 x 2, ckpt 0/28'", 128, 2, 0),
    # The planner's choice for 40 GiB, which is the a100-40gb profile's configuration.
    "40gb": Anchor(
        0.2103, 292.2, "32 x 8, no checkpointing (allocator capped at 40 GiB)",
        "nvidia-h200-planner-check.json, row 'planner, 40 GiB: 32 x 8, ckpt 0/28'", 32, 8, 0),
    # The planner's choice for 24 GiB (what `dit-plan --gpu-memory 24` recommends).
    "24gb-planned": Anchor(
        0.1523, 211.6, "32 x 8, 13 of 28 blocks checkpointed (allocator capped at 24 GiB)",
        "nvidia-h200-planner-check.json, row 'planner, 24 GiB: 32 x 8, ckpt 13/28'", 32, 8, 13),
    # `dit-train --config rtx3090-24gb` itself (data loader, EMA, checkpoint), steady speed over its last 10 steps:
    # 195.9 img/s x 711.73 GFLOP / 989 TFLOP/s.
    "24gb-profile": Anchor(
        0.1410, 195.9, "32 x 8, all 28 blocks checkpointed: dit-train --config rtx3090-24gb (capped at 23.6 GiB)",
        "nvidia-h200-profiles.json, profile 'rtx3090-24gb', steady_images_per_s", 32, 8, 28),
}

#: Sampling: 250 DDPM steps with guidance 4.0 (two passes per step), batch 16, bf16, VAE decode included:
#: 1.864 img/s x 118.62 TFLOP per image / 989 TFLOP/s (nvidia-h200-dit-xl2.json, "sampling").
SAMPLING_ANCHOR = Anchor(0.2235, 1.864, "250 DDPM steps, guidance 4.0, batch 16, bf16, VAE decode included",
                         "nvidia-h200-dit-xl2.json, sampling")


@dataclass(frozen=True)
class Card:
    """A GPU, its dense bf16 peak, and the book's profile for it."""

    name: str
    memory: str  # as sold (GB = 10^9 bytes; the GeForce cards' "24 GB" are 24 GiB)
    peak_tflops: float  # dense bf16 tensor-core TFLOP/s with fp32 accumulation
    peak_source: str
    profile: str | None  # dit_core/configs/<profile>.yaml
    anchor: str | None  # key of ANCHORS used for this card's training estimate
    configuration: str = ""  # the profile's micro-batch x accumulation and memory savers
    match: tuple[str, ...] = ()  # substrings of torch.cuda.get_device_name(), tried in CARDS order
    note: str = ""  # set when the anchor is not a measurement of the profile's own configuration


def _ampere_geforce_peak(sms: int, boost_ghz: float) -> float:
    """Dense fp16/bf16 tensor TFLOP/s with fp32 accumulation of a GA10x GeForce card: SMs x 4 tensor cores x 128
    FMA x 2 FLOPs x boost clock, halved for fp32 accumulation (the GA10x rule; it gives 142 -> 71 for the 3090)."""
    return sms * 4 * 128 * 2 * boost_ghz / 1e3 / 2


#: The cards of the book's profiles (and the H200 the records were measured on), in matching order: a more
#: specific name comes before a prefix of it ("H100 PCIe" before "H100").
CARDS: tuple[Card, ...] = (
    # NVIDIA H100 datasheet: BF16 Tensor Core 1,979 TFLOPS (SXM) / 1,513 (PCIe) "shown with sparsity", dense = half.
    Card("H100 PCIe", "80 GB", 756.0, "NVIDIA H100 datasheet (1,513 with sparsity)", "h100-80gb", "80gb",
         "128 x 2", ("h100 pcie",)),
    # (An H100 NVL, 835 dense, would also match "h100": no datasheet figure for it was at hand.)
    Card("H100 SXM", "80 GB", 989.0, "NVIDIA H100 datasheet (1,979 with sparsity)", "h100-80gb", "80gb",
         "128 x 2", ("h100",)),
    # H200: the H100 SXM's compute with 141 GB of HBM3e; the card the anchors were measured on.
    Card("H200", "141 GB", 989.0, "the H100 SXM's tensor cores with 141 GB of HBM3e", None, None,
         "", ("h200",)),
    # NVIDIA A100 datasheet: BF16 312 TFLOPS dense (624 with sparsity), both memory sizes.
    Card("A100 80GB", "80 GB", 312.0, "NVIDIA A100 figures, GTC 2020 (doubled with sparsity)", "a100-80gb", "80gb",
         "128 x 2", ("a100-sxm4-80gb", "a100 80gb", "a100-pcie-80gb", "a100 80")),
    Card("A100 40GB", "40 GB", 312.0, "NVIDIA A100 figures, GTC 2020 (doubled with sparsity)", "a100-40gb", "40gb",
         "32 x 8", ("a100",)),
    # Ada whitepaper figures as quoted by spec databases: BF16/FP16 165.2 with FP32 accumulate (330.3 with FP16
    # accumulate); bf16 autocast accumulates in fp32.
    Card("RTX 4090", "24 GB", 165.2, "Ada (AD102) spec, fp32 accumulate (330.3 with fp16 accumulate)", "rtx3090-24gb",
         "24gb-planned", "32 x 8, 13 of 28 blocks checkpointed", ("4090",)),
    # GA102: 142 FP16 tensor TFLOP/s with FP16 accumulate, half with FP32 accumulate (35.6 is the non-tensor FP32).
    Card("RTX 3090", "24 GB", 71.0, "Ampere (GA102) spec, fp32 accumulate (142 with fp16 accumulate)",
         "rtx3090-24gb", "24gb-planned", "32 x 8, 13 of 28 blocks checkpointed", ("3090",)),
    # No NVIDIA figure found for the 3060's tensor rate: derived from 28 SMs at the 1.777 GHz boost clock.
    Card("RTX 3060", "12 GB", round(_ampere_geforce_peak(28, 1.777), 1),
         "derived: 28 SMs x 4 tensor cores x 128 FMA x 2 x 1.777 GHz / 2 (fp32 accumulate; ~51 with fp16 accumulate)",
         "rtx3060-12gb", "24gb-profile", "32 x 8, every block checkpointed, 8-bit AdamW, EMA on the CPU", ("3060",),
         note="not measured: the 24 GB profile's MFU, an upper bound (8-bit AdamW and the EMA on the CPU are "
              "slower)"),
)

#: Published single-GPU figures, for comparison with the estimates (each with its source).
PUBLISHED = {
    # fast-DiT README, "Improved Training Performance": one A100 (80 GB), batch 128, gradient checkpointing +
    # mixed precision (fp16) + pre-extracted features: 0.84 steps/s, i.e. 107.5 img/s. Its MFU, 24.5 %, counts the
    # model's own 711.73 GFLOP an image; with the forward pass that checkpointing recomputes it is about 33 %.
    "fast-DiT, A100 80GB": dict(images_per_s=0.84 * 128, card="A100 80GB",
                                source="fast-DiT README (github.com/chuanyangjin/fast-DiT), batch 128, with "
                                       "checkpointing, fp16, pre-extracted latents"),
    # DiT issue 22 (github.com/facebookresearch/DiT/issues/22), W. Peebles: train.py at ~0.51 steps/s on an
    # 8x A100 node at global batch 256, 0.81 steps/s with TF32 allowed (fp32 otherwise): per GPU 256 x 0.81 / 8.
    "official train.py + TF32, per A100": dict(images_per_s=0.81 * 256 / 8, card="A100 80GB",
                                              source="DiT issue 22, 8x A100, 0.81 steps/s at batch 256 with TF32"),
}


def card(name: str) -> Card:
    """The :class:`Card` called ``name`` (as in :data:`CARDS`, case-insensitive)."""
    for c in CARDS:
        if c.name.lower() == name.lower():
            return c
    raise ValueError(f"unknown card {name!r}; known: {', '.join(c.name for c in CARDS)}")


def card_for_device(device_name: str) -> Card | None:
    """The card whose ``match`` strings occur in ``device_name`` (``torch.cuda.get_device_name()``), or None."""
    lowered = device_name.lower()
    for c in CARDS:
        if any(m in lowered for m in c.match):
            return c
    return None


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its device name, or None when it is not in :data:`CARDS`."""
    c = card_for_device(device_name)
    return c.peak_tflops if c else None


def mfu_of(images_per_s: float, peak: float, gflop_per_image: float = TRAIN_GFLOP_PER_IMAGE) -> float:
    """Model-FLOPs utilisation: model FLOPs per second over the peak (``peak`` in TFLOP/s)."""
    return images_per_s * gflop_per_image / (peak * 1e3)


def training_estimate(name: str, steps: int = PAPER_STEPS, global_batch: int = GLOBAL_BATCH,
                      mfu: float | None = None) -> dict:
    """Estimated images/s and days for ``steps`` steps of ``global_batch`` DiT-XL/2 images (256 px) on card
    ``name``, at the MFU measured in its profile's configuration (or at ``mfu``)."""
    c = card(name)
    if mfu is None:
        if c.anchor is None:
            raise ValueError(f"{c.name} has no profile anchor; pass mfu=")
        mfu = ANCHORS[c.anchor].mfu
    images_per_s = c.peak_tflops * 1e3 * mfu / TRAIN_GFLOP_PER_IMAGE
    seconds = steps * global_batch / images_per_s
    return {"card": c.name, "peak_tflops": c.peak_tflops, "mfu": mfu, "anchor": c.anchor,
            "images_per_s": images_per_s, "seconds": seconds, "days": seconds / SECONDS_PER_DAY}


def sampling_seconds_per_image(name: str, forward_gmacs: float = FORWARD_GMACS_XL2_256, steps: int = 250,
                               guided: bool = True, mfu: float | None = None) -> float:
    """Estimated seconds per image for ``steps`` sampling steps of a model of ``forward_gmacs`` G multiply-adds
    per forward pass (two passes per step with guidance), at the sampling MFU measured on the H200."""
    flop = (2 if guided else 1) * steps * 2 * forward_gmacs * 1e9
    return flop / (card(name).peak_tflops * 1e12 * (SAMPLING_ANCHOR.mfu if mfu is None else mfu))


def format_days(days: float) -> str:
    """``~3.2 days``, ``~13 days``, ``~34 days (~5 weeks)``: two significant figures at most."""
    text = f"~{days:.1f} days" if days < 10 else f"~{days:.0f} days"
    if days >= 28:
        text += f" (~{days / 7:.0f} weeks)"
    return text


def training_table(steps: int = PAPER_STEPS, global_batch: int = GLOBAL_BATCH) -> list[dict]:
    """:func:`training_estimate` for every card with a profile, in :data:`CARDS` order."""
    return [training_estimate(c.name, steps, global_batch) for c in CARDS if c.anchor is not None]


def markdown_table(steps: int = PAPER_STEPS, global_batch: int = GLOBAL_BATCH) -> str:
    """The training-time table as MyST markdown (chapter 06 displays it; a page that quotes it holds it verbatim)."""
    lines = [f"| card | dense bf16 peak | profile | MFU measured in that configuration | images/s (estimate) "
             f"| {steps // 1000}K steps x {global_batch} (estimate) |",
             "|---|---|---|---|---|---|"]
    for row in training_table(steps, global_batch):
        c = card(row["card"])
        derived = "derived" in c.peak_source
        peak = f"{'~' if derived else ''}{c.peak_tflops:g} TFLOP/s{' (derived)' if derived else ''}"
        mfu = f"{row['mfu']:.1%}"
        ips, days = f"~{row['images_per_s']:.0f}", format_days(row["days"])
        if c.note:  # an upper bound on the speed: a lower bound on the time
            mfu, ips, days = f"at most {mfu} (not measured)", f"at most {ips}", f"at least {days}"
        label = c.name if c.memory.replace(" ", "") in c.name.replace(" ", "") else f"{c.name}, {c.memory}"
        lines.append(f"| {label} | {peak} | `{c.profile}`: {c.configuration} | {mfu} | {ips} | {days} |")
    return "\n".join(lines)


def main() -> None:
    print(markdown_table())
    print()
    for key, pub in PUBLISHED.items():
        c = card(pub["card"])
        print(f"{key}: {pub['images_per_s']:.1f} img/s = {mfu_of(pub['images_per_s'], c.peak_tflops):.1%} MFU "
              f"({pub['source']})")


if __name__ == "__main__":
    main()
