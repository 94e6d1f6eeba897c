"""The paper's findings in miniature: its block-design ablation and its scaling study, rerun on the digits.

Two studies, each a grid of *variants* trained by the real trainer on the `digits` profile, three seeds each
(:func:`dit_book.study.train_and_score`), the EMA model scored every ``eval_every`` steps with the digits' judge
(:func:`dit_core.eval.classwise.sample_and_score`): class accuracy, and the Fréchet distance in the judge's
feature space ("FD": the FID recipe with a network fitted to real digits instead of Inception). Samples are drawn
**without guidance** (``cfg_scale`` 1), as the paper's ablations and scaling figures are.

* ``blocks`` (the paper's Fig. 5): the four block designs of ``DiT(block=...)`` (adaLN-Zero, adaLN,
  cross-attention, in-context) at the digits profile's size and budget, and cross-attention reading its context
  unnormalised (``cross-attention-raw``). Each score also measures how strongly the class reaches the model
  (:func:`conditioning`).
* ``scaling`` (the paper's Figs. 2, 6 and 8): three model sizes (:data:`SIZES`, named by depth and width, e.g.
  ``d2w64``: they are not DiT's S, B and L) by three patch sizes (4, 2, 1: 4, 16 and 64 tokens of an 8x8 digit),
  adaLN-Zero. Quality is read against the model's forward multiply-adds per image (the paper's "Gflops") and
  against the training compute, ``3 x Gflops x batch x steps`` (the paper's estimate).

The reading (:func:`summarize_curves`, :func:`ordering`, :func:`correlations`, :func:`trade_offs`,
:func:`compute_to`, :func:`scaling_checks`) takes rows of that shape, and :mod:`dit_book.paper` puts the paper's
Table 4 in the same shape, so :func:`beside_the_paper` reads both with the same code.

``python -m dit_book.findings`` runs the grids (``--estimate`` projects their CPU time first); chapter 7c
(``book/07c_paper_findings.ipynb``) reads the records, ``benchmarks/results/paper-findings.md`` says what they show.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

from dit_core.atomic import atomic_write_text

from . import study
from .convergence import judge_of_run, prepare_data
from .study import curve, load_records, spread  # noqa: F401 (part of this module's interface)

#: The block designs, in the order of the paper's Fig. 5 legend.
DESIGNS = ("in-context", "cross-attention", "adaln", "adaln-zero")
#: The blocks study's variants: the four designs, and cross-attention reading its context unnormalised
#: (``cross-attention-raw``, :class:`dit_core.designs.CrossAttentionRawBlock`).
BLOCK_VARIANTS = DESIGNS + ("cross-attention-raw",)

#: Model sizes of the scaling grid, named by depth and width. Depth and width grow together here; in the paper
#: (its Table 1) S to B widens only (12 blocks both), B to L deepens and widens, L to XL deepens. Per token, S to B
#: is 4x the multiply-adds, B to L 3.5x; here 3.4x and 2.4x. ``d4w128`` is the digits profile's own size.
SIZES = {
    "d2w64": dict(depth=2, hidden_size=64, num_heads=2),
    "d3w96": dict(depth=3, hidden_size=96, num_heads=3),
    "d4w128": dict(depth=4, hidden_size=128, num_heads=4),
}
#: Patch sizes of the scaling grid: 4, 16 and 64 tokens of an 8x8 digit (the paper: 8, 4, 2 on 32x32 latents).
PATCHES = (4, 2, 1)

#: The two studies' settings: the `digits` profile's recipe (its batch of 64, learning rate and schedule), trained
#: for ``max_steps`` (the schedule decays over them), scored every ``eval_every`` steps with ``per_class``
#: unguided samples a class and ``eval_steps`` DDIM steps.
STUDIES = {
    "blocks": dict(profile="digits", max_steps=800, eval_every=100, per_class=20, eval_steps=25, cfg_scale=1.0),
    "scaling": dict(profile="digits", max_steps=600, eval_every=100, per_class=20, eval_steps=25, cfg_scale=1.0),
}
SEEDS = (0, 1, 2)
#: The digits as the trainer sees them: one channel of 8x8, ten classes.
DIGITS_SHAPE, DIGITS_CLASSES = (1, 8, 8), 10


def variants(study_name: str) -> dict[str, dict]:
    """The study's variants: name -> training-config overrides."""
    if study_name == "blocks":
        return {design: {"block": design} for design in BLOCK_VARIANTS}
    if study_name == "scaling":
        return {f"{size}/{patch}": dict(SIZES[size], patch_size=patch, block="adaln-zero")
                for size in SIZES for patch in PATCHES}
    raise ValueError(f"unknown study {study_name!r}; choose one of {', '.join(STUDIES)}")


def model_facts(overrides: dict, profile: str = "digits") -> dict:
    """Parameters, forward multiply-adds per image (the paper's "Gflops", in G) and tokens of a variant's model:
    the DiT the trainer builds for the digits (:func:`dit_book.study.model_facts`)."""
    from dit_core.train import make_config

    cfg = make_config(profile, {k: v for k, v in overrides.items() if k != "data_path"})
    return study.model_facts(cfg, DIGITS_SHAPE, DIGITS_CLASSES)


def conditioning(model, process, judge, n: int = 256, seed: int = 0) -> dict:
    """How strongly the class reaches a model, measured on ``n`` real held-out digits noised at random steps:

    * ``class_effect``: how much the class changes the model's noise prediction, ``|eps(x_t, t, y) - eps(x_t, t,
      y')| / |eps(x_t, t, y)|`` with ``y'`` another class, averaged (0: the class is ignored);
    * ``class_rms`` and ``time_rms``: the root-mean-square entry of the class embeddings (the class rows of the
      table, not guidance's null row; 0.02 at the start) and of the time embeddings of those steps;
    * for the cross-attention designs, averaged over blocks, heads and image tokens: ``class_attention``, the
      attention weight on the class token (0.5 is even), and ``class_read``, the class token's share of what the
      attention reads (its weight times the norm of its value, against the time token's).
    """
    import torch

    from dit_core.designs import CrossAttentionBlock

    images, labels = judge.real_images("val")
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(len(images), generator=g)[:n]
    x0, y = images[pick], labels[pick]
    t = torch.randint(0, process.num_timesteps, (len(x0),), generator=g)
    x_t = process.q_sample(x0, t, noise=torch.randn(x0.shape, generator=g))
    out = {}
    with torch.no_grad():
        if model.y_embedder is not None:
            other = (y + torch.randint(1, model.num_classes, y.shape, generator=g)) % model.num_classes
            c = model.in_channels
            eps, eps_other = model(x_t, t, y)[:, :c], model(x_t, t, other)[:, :c]
            out["class_effect"] = float((eps - eps_other).flatten(1).norm(dim=1).mean() / eps.flatten(1).norm(dim=1).mean())
            table = model.y_embedder.embedding_table.weight[:model.num_classes]
            out["class_rms"] = float(table.pow(2).mean().sqrt())
        out["time_rms"] = float(model.t_embedder(t).pow(2).mean().sqrt())
        blocks = [b for b in model.blocks if isinstance(b, CrossAttentionBlock)]
        if blocks and model.y_embedder is not None:
            seen = []
            hooks = [b.register_forward_pre_hook(lambda mod, args: seen.append((mod, *args))) for b in blocks]
            try:
                model(x_t, t, y)
            finally:
                for h in hooks:
                    h.remove()
            weight, read = [], []
            for block, x, context in seen:
                w = block.context_attention(x, context)  # (n, heads, tokens, 2): t, y
                v = block.cross_attn.kv(block.norm_context(context)).chunk(2, dim=-1)[1]  # (n, 2, width)
                v = v.reshape(len(v), 2, block.cross_attn.num_heads, -1).norm(dim=-1).transpose(1, 2)  # (n, heads, 2)
                r = w * v[:, :, None, :]
                weight.append(float(w[..., 1].mean()))
                read.append(float((r[..., 1] / r.sum(-1)).mean()))
            out["class_attention"] = sum(weight) / len(weight)
            out["class_read"] = sum(read) / len(read)
    return out


# ----------------------------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------------------------


def run_one(study_name: str, variant: str, seed: int, work: str | os.PathLike, *, max_steps: int | None = None,
            eval_every: int | None = None, per_class: int | None = None, eval_steps: int | None = None,
            overrides: dict | None = None, keep_checkpoints: bool = False, progress: bool = False,
            quiet: bool = False) -> dict:
    """Train ``variant`` of ``study_name`` with ``seed`` in ``work/<study>/<variant>/seed<seed>``, score its EMA model
    every ``eval_every`` steps without guidance (and :func:`conditioning`), and return the run's record
    (:func:`dit_book.study.train_and_score`; also ``record.json``).

    ``overrides``: further config keys (e.g. a smaller model for a smoke run); ``quiet``: the trainer's lines go to
    ``train.log`` in the run's folder instead of the screen. Resumes a killed run.
    """
    spec = STUDIES[study_name]
    settings = {**variants(study_name)[variant], **(overrides or {})}
    out = Path(work) / study_name / variant.replace("/", "-") / f"seed{seed}"
    if (out / "record.json").is_file():
        return json.loads((out / "record.json").read_text())
    max_steps = int(max_steps or spec["max_steps"])
    eval_every = int(eval_every or spec["eval_every"])
    per_class, eval_steps = int(per_class or spec["per_class"]), int(eval_steps or spec["eval_steps"])
    data_path = settings.pop("data_path", None) or prepare_data("digits", Path(work))
    cfg = study.study_config(spec["profile"], settings, data={"data_path": data_path}, out=out, seed=seed,
                             max_steps=max_steps, eval_every=eval_every, progress=progress)

    def scorer(cfg, seconds):
        judge, classes = judge_of_run(out, "digits")
        score = study.judge_scorer(cfg, judge, classes, per_class=per_class, eval_steps=eval_steps,
                                   cfg_scale=spec["cfg_scale"], seconds=seconds, measure=conditioning)
        return score, {"classifier_val_accuracy": float(judge.val_accuracy),
                       **study.model_facts(cfg, DIGITS_SHAPE, DIGITS_CLASSES)}

    return study.train_and_score(out, cfg, scorer, {
        "study": study_name, "variant": variant, "seed": seed, "settings": settings, "per_class": per_class,
        "eval_steps": eval_steps, "cfg_scale": spec["cfg_scale"], "sampler": "ddim"},
        quiet=quiet, keep_checkpoints=keep_checkpoints, remove=("checkpoints",))


# ----------------------------------------------------------------------------------------------------------
# Reading the records
# ----------------------------------------------------------------------------------------------------------


def by_variant(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["variant"], []).append(r)
    return out


def _median(values: list[float]):
    values = [v for v in values if v is not None]
    return spread(values)["median"] if values else None


def summarize_curves(records: list[dict]) -> list[dict]:
    """One row per variant: its cost (parameters, Gflops, tokens, training compute at the last step) and, as
    median [min, max] over seeds (:func:`dit_book.study.spread`), its class accuracy and FD at every scored step
    and at the end, and the seeds' median of every other figure its scores hold (``measured``: e.g.
    :func:`conditioning`'s, by step)."""
    rows = []
    for variant, runs in by_variant(records).items():
        r0 = runs[0]
        acc, fd = curve(runs, "class_accuracy"), curve(runs, "frechet_distance")
        last = max(r["max_steps"] for r in runs)
        extra = sorted({k for r in runs for e in r["evals"] for k in e} - {
            "step", "seconds", "class_accuracy", "frechet_distance", "real_floor"})
        rows.append({
            "variant": variant, "seeds": len(runs), "params": r0["params"], "gflops": r0["gflops"],
            "tokens": r0["tokens"], "settings": r0["settings"], "max_steps": last, "batch_size": r0["batch_size"],
            "train_gflop": training_compute(r0["gflops"], r0["batch_size"], last),
            "accuracy": acc, "fd": fd, "final_accuracy": acc[-1] if acc else spread([]),
            "final_fd": fd[-1] if fd else spread([]),
            "measured": {k: {p["step"]: p["median"] for p in curve(runs, k)} for k in extra},
            "seconds_per_step": _median([r["train_seconds"] / r["max_steps"] for r in runs if r.get("train_seconds")]),
            "real_floor": _median([e["real_floor"] for r in runs for e in r["evals"] if "real_floor" in e]),
        })
    order = list(BLOCK_VARIANTS) + list(variants("scaling"))
    rows.sort(key=lambda r: order.index(r["variant"]) if r["variant"] in order else len(order))
    return rows


def training_compute(gflops: float, batch_size: int, steps: int) -> float:
    """The paper's training compute in Gflops: ``Gflops x batch x steps x 3`` (a backward pass is counted as two
    forward passes), multiply-adds as the paper counts them."""
    return 3.0 * gflops * batch_size * steps


def format_spread(s: dict, fmt: str = "{:.2f}", pct: bool = False) -> str:
    """A :func:`~dit_book.study.spread` as ``median [min, max]`` (the median alone for one seed or equal ends)."""
    if not s["seeds"]:
        return "-"
    f = (lambda v: f"{100 * v:.1f} %") if pct else (lambda v: fmt.format(v))
    if s["seeds"] == 1 or f(s["min"]) == f(s["max"]):
        return f(s["median"])
    return f"{f(s['median'])} [{f(s['min'])}, {f(s['max'])}]"


def format_blocks_table(rows: list[dict], steps: list[int] | None = None) -> str:
    """The block-design table: per design its Mflops (the paper's Gflops, forward multiply-adds per image, x 1000),
    parameters, and FD and class accuracy at some scored steps (default: a third, two thirds and all of the budget),
    median [min, max] over seeds."""
    if not rows:
        return "(no records)"
    all_steps = [p["step"] for p in rows[0]["fd"]]
    steps = steps or sorted({all_steps[max(0, len(all_steps) // 3 - 1)], all_steps[max(0, 2 * len(all_steps) // 3 - 1)],
                             all_steps[-1]})
    head = "| design | Mflops | params | " + " | ".join(f"FD @ {s}" for s in steps) + " | " + \
        " | ".join(f"accuracy @ {s}" for s in steps) + " |"
    lines = [head, "|" + "---|" * (3 + 2 * len(steps))]
    for r in rows:
        fd = {p["step"]: p for p in r["fd"]}
        acc = {p["step"]: p for p in r["accuracy"]}
        cells = [format_spread(fd[s]) if s in fd else "-" for s in steps] + \
            [format_spread(acc[s], pct=True) if s in acc else "-" for s in steps]
        lines.append(f"| {r['variant']} | {1e3 * r['gflops']:.2f} | {r['params'] / 1e6:.2f} M | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_scaling_table(rows: list[dict]) -> str:
    """The scaling table: per configuration its tokens, Mflops (the paper's Gflops x 1000), parameters, training
    compute and the final FD and class accuracy, median [min, max] over seeds."""
    if not rows:
        return "(no records)"
    lines = ["| model | tokens | Mflops | params | training compute (Gflop) | final FD | final accuracy |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['tokens']} | {1e3 * r['gflops']:.2f} | {r['params'] / 1e6:.2f} M | "
                     f"{r['train_gflop']:.3g} | {format_spread(r['final_fd'])} | "
                     f"{format_spread(r['final_accuracy'], pct=True)} |")
    return "\n".join(lines)


def format_conditioning_table(rows: list[dict], step: int | None = None) -> str:
    """What :func:`conditioning` measured at ``step`` (default: the last), the seeds' medians: the class's effect
    on the prediction, the class and time embeddings' RMS and, for the cross-attention designs, the attention on
    the class token and its share of what is read; beside each design's final FD and accuracy."""
    lines = ["| design | class's effect on the prediction | class embedding RMS | time embedding RMS | attention on "
             "the class token | class's share of what is read | final FD | final accuracy |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r.get("measured", {})
        if not m:
            continue
        s = step if step is not None else max(m.get("class_rms", {0: None}))

        def cell(key, fmt="{:.3f}"):
            v = m.get(key, {}).get(s)
            return fmt.format(v) if v is not None and math.isfinite(v) else "-"

        lines.append(f"| {r['variant']} | {cell('class_effect', '{:.2f}')} | {cell('class_rms')} | {cell('time_rms')} | "
                     f"{cell('class_attention', '{:.2f}')} "
                     f"| {cell('class_read', '{:.2f}')} | {format_spread(r['final_fd'])} | "
                     f"{format_spread(r['final_accuracy'], pct=True)} |")
    return "\n".join(lines)


def pearson(xs: list[float], ys: list[float]) -> float:
    """Pearson's correlation coefficient of two equally long lists."""
    n = len(xs)
    if n < 3:
        return math.nan
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def _at(points: list[dict], step: int | None):
    pts = {p["step"]: p["median"] for p in points}
    return pts.get(step if step is not None else max(pts)) if pts else None


def correlations(rows: list[dict], step: int | None = None) -> dict:
    """How well Gflops predict quality across a scaling grid, at ``step`` (default: each row's last scored step):
    Pearson's r of log10 Gflops with log10 FD (the paper: FID) and with class accuracy (the seeds' medians; NaN
    where a row has none), and Spearman's rank correlation of Gflops with FD. The paper finds FID falling as Gflops
    rise (a negative correlation)."""
    pts = []
    for r in rows:
        fd, acc = _at(r["fd"], step), _at(r["accuracy"], step)
        if fd is not None and math.isfinite(fd) and fd > 0:
            pts.append((r["gflops"], fd, acc if acc is not None else math.nan))
    if len(pts) < 3:
        return {"points": len(pts), "step": step}
    g = [math.log10(p[0]) for p in pts]
    accs = [p[2] for p in pts]
    return {"points": len(pts), "step": step if step is not None else max(p["step"] for p in rows[0]["fd"]),
            "pearson_log_gflops_log_fd": pearson(g, [math.log10(p[1]) for p in pts]),
            "pearson_log_gflops_accuracy": pearson(g, accs) if all(map(math.isfinite, accs)) else math.nan,
            "spearman_gflops_fd": pearson(_ranks([p[0] for p in pts]), _ranks([p[1] for p in pts]))}


def compute_to(rows: list[dict], target: float) -> dict[str, float | None]:
    """Per configuration, the training compute (Gflop, :func:`training_compute`) at the first scored step where its
    median FD is at most ``target``; None when it never gets there (the paper's Figure 9 read at one FD). With
    one scored step (the paper's Table 4) it is the compute of that step: an upper bound."""
    out = {}
    for r in rows:
        hit = next((p["step"] for p in r["fd"] if p["median"] <= target), None)
        out[r["variant"]] = training_compute(r["gflops"], r["batch_size"], hit) if hit is not None else None
    return out


def size_and_patch(variant: str) -> tuple[str, int]:
    """``"d2w64/4"`` -> ``("d2w64", 4)``; ``"DiT-S/8"`` -> ``("DiT-S", 8)``."""
    size, patch = variant.rsplit("/", 1)
    return size, int(patch)


def trade_offs(rows: list[dict], within: float = 1.6) -> list[dict]:
    """Pairs of scaling configurations whose Gflops differ by less than ``within`` x but that get them from
    another size and patch (one larger model with larger patches, one smaller with smaller patches): the paper
    says such pairs obtain similar FID. Each pair with its final FDs and accuracies, ``fd_ratio`` (the higher
    median FD over the lower), whether the seeds' ranges of FD overlap, and which of the two has the larger patch
    and whether it is the worse (``larger_patch_worse``)."""
    pairs = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            ratio = max(a["gflops"], b["gflops"]) / min(a["gflops"], b["gflops"])
            (sa, pa), (sb, pb) = size_and_patch(a["variant"]), size_and_patch(b["variant"])
            if ratio < within and sa != sb and pa != pb:
                fa, fb = a["final_fd"]["median"], b["final_fd"]["median"]
                larger, other = (a, b) if pa > pb else (b, a)
                pairs.append({"a": a["variant"], "b": b["variant"], "gflops_ratio": ratio,
                              "fd": (a["final_fd"], b["final_fd"]),
                              "accuracy": (a["final_accuracy"], b["final_accuracy"]),
                              "fd_ratio": max(fa, fb) / min(fa, fb),
                              "overlap_fd": not separated(a["final_fd"], b["final_fd"]),
                              "larger_patch": larger["variant"],
                              "larger_patch_worse": larger["final_fd"]["median"] > other["final_fd"]["median"]})
    return pairs


def scaling_checks(rows: list[dict]) -> dict:
    """The paper's Figure 6 as two yes/no questions, by the final median FD: at every patch size, does each larger
    model (more parameters) end lower (``larger_model``), and at every model size does each smaller patch end lower
    (``smaller_patch``)? Each with the cases that fail, as ``(worse, better)`` pairs of variants."""
    by_patch, by_size = {}, {}
    for r in rows:
        size, patch = size_and_patch(r["variant"])
        by_patch.setdefault(patch, []).append(r)
        by_size.setdefault(size, []).append(r)
    fails = {"larger_model": [], "smaller_patch": []}
    for key, groups, order in (("larger_model", by_patch, lambda r: r["params"]),
                               ("smaller_patch", by_size, lambda r: -size_and_patch(r["variant"])[1])):
        for group in groups.values():
            ranked = sorted(group, key=order)
            for small, big in zip(ranked, ranked[1:]):
                if not big["final_fd"]["median"] < small["final_fd"]["median"]:
                    fails[key].append((big["variant"], small["variant"]))
    return {"larger_model": not fails["larger_model"], "smaller_patch": not fails["smaller_patch"],
            "fails": fails}


def ordering(rows: list[dict], key: str = "fd", step: int | None = None) -> list[str]:
    """Variants from best to worst by the seeds' median ``key`` ("fd": lower is better; "accuracy") at ``step``
    (default: the last)."""
    def value(r):
        v = _at(r[key], step)
        return v if key == "fd" else -v
    return [r["variant"] for r in sorted(rows, key=value)]


def separated(a: dict, b: dict) -> bool:
    """Whether two spreads over seeds do not overlap (``a`` entirely below or above ``b``)."""
    return a["max"] < b["min"] or b["max"] < a["min"]


def chance_apart(n_a: int = 3, n_b: int = 3) -> float:
    """The probability that the ranges of ``n_a`` and ``n_b`` seeds come out disjoint when the two variants do not
    differ at all (every ordering of the ``n_a + n_b`` results equally likely): ``2 / C(n_a + n_b, n_a)``, 0.1
    for 3 against 3."""
    return 2.0 / math.comb(n_a + n_b, n_a)


def clear_of_report(rows: list[dict], variant: str = "adaln-zero", label: str = "adaLN-Zero") -> list[str]:
    """The order of ``rows`` (:func:`summarize_curves`) by the median FD at each scored step, and the variants whose
    range of FD over the seeds ``variant``'s stays clear of (:func:`separated`), a line per step; then how many such
    comparisons were made, how many would come out clear by chance alone if no variant differed
    (:func:`chance_apart` of each pair's seeds), and the step from which ``variant`` leads by the median accuracy
    (:func:`leads`). ``label``: how the lines name ``variant``."""
    by_name = {r["variant"]: r for r in rows}
    lines, comparisons, by_chance = [], 0, 0.0
    for step in [p["step"] for p in by_name[variant]["fd"]]:
        at = {v: next(p for p in r["fd"] if p["step"] == step) for v, r in by_name.items()}
        others = [v for v in by_name if v != variant]
        clear = [v for v in others if separated(at[variant], at[v])]
        comparisons += len(others)
        by_chance += sum(chance_apart(at[variant]["seeds"], at[v]["seeds"]) for v in others)
        lines.append(f"step {step:4d}: best to worst by FD {' > '.join(ordering(rows, 'fd', step))}; {label} clear of: "
                     f"{', '.join(clear) or 'none'}")
    lines.append(f"{comparisons} comparisons: about {by_chance:.1f} would come out clear by chance alone; {label} "
                 f"leads by the median accuracy from step {leads(rows, variant)}")
    return lines


def beside_the_paper(paper_designs: list[dict], designs: list[dict], paper_scaling: list[dict], scaling: list[dict],
                     paper_target: float = 50.0, target: float = 1.0) -> str:
    """The paper (Table 4, :mod:`dit_book.paper`) and the digits (rows of :func:`summarize_curves`) through the
    same reading, as a Markdown table: the designs' order and adaLN-Zero against in-context, the Gflops-quality
    correlations, the pairs of about equal Gflops (:func:`trade_offs`), Figure 6's two checks
    (:func:`scaling_checks`) and the least training compute to a quality target (:func:`compute_to`: FID
    ``paper_target``, FD ``target``)."""
    def order(rows):
        at = {r["variant"]: r["final_fd"]["median"] for r in rows}
        return " < ".join(f"{v} {at[v]:.2f}" for v in ordering(rows))

    def ratio(rows):
        at = {r["variant"]: r["final_fd"]["median"] for r in rows}
        return f"{at['adaln-zero'] / at['in-context']:.2f}"

    def corr(rows, key):
        c = correlations(rows)
        return f"{c[key]:+.2f} ({c['points']} models)"

    def pairs(rows):
        found = trade_offs(rows)
        worse = [p for p in found if p["larger_patch_worse"]]
        return (f"{len(found)}: " + "; ".join(f"{p['a']} / {p['b']} {p['fd_ratio']:.2f}x" for p in found),
                f"{len(worse)} of {len(found)}")

    def checks(rows, key):
        c = scaling_checks(rows)
        return "yes" if c[key] else "no: " + ", ".join(f"{w} above {b}" for w, b in c["fails"][key])

    def cheapest(rows, goal):
        reach = {v: c for v, c in compute_to(rows, goal).items() if c is not None}
        if not reach:
            return "none"
        best = min(reach, key=reach.get)
        return f"{best}, {reach[best]:.3g} Gflop ({len(reach)} of {len(rows)} get there)"

    p_pairs, d_pairs = pairs(paper_scaling), pairs(scaling)
    table = [
        ("designs, best to worst (final FID / FD)", order(paper_designs), order(designs)),
        ("adaLN-Zero over in-context", ratio(paper_designs), ratio(designs)),
        ("Pearson r (log Gflops, log FID / FD)", corr(paper_scaling, "pearson_log_gflops_log_fd"),
         corr(scaling, "pearson_log_gflops_log_fd")),
        ("Spearman (Gflops, FID / FD)", corr(paper_scaling, "spearman_gflops_fd"),
         corr(scaling, "spearman_gflops_fd")),
        ("pairs within 1.6x of each other's Gflops, another size and patch: FID / FD ratio", p_pairs[0], d_pairs[0]),
        ("... where the larger patch is the worse", p_pairs[1], d_pairs[1]),
        ("larger model lower at every patch", checks(paper_scaling, "larger_model"), checks(scaling, "larger_model")),
        ("smaller patch lower at every size", checks(paper_scaling, "smaller_patch"), checks(scaling, "smaller_patch")),
        (f"least training compute to FID {paper_target:g} / FD {target:g}", cheapest(paper_scaling, paper_target),
         cheapest(scaling, target)),
    ]
    lines = ["| | the paper (Table 4: FID-50K at 400K steps) | the digits (FD at the last step, median of the seeds) |",
             "|---|---|---|"]
    lines += [f"| {name} | {a} | {b} |" for name, a, b in table]
    return "\n".join(lines)


def format_design_costs(counted: list[dict], unit: str = "G", paper_designs: dict | None = None) -> str:
    """Rows of :func:`dit_core.measure.flops.design_table` as a Markdown table: each design's forward multiply-adds
    (``unit`` "G": Gflops, "M": Mflops), its overhead over adaLN-Zero, tokens and parameters; with
    ``paper_designs`` (:data:`dit_book.paper.DESIGNS`) Table 4's Gflops, parameters and FID-50K beside them."""
    scale = {"G": 1.0, "M": 1e3}[unit]
    head = f"| design | {unit}flops (counted) | over adaLN-Zero | tokens | params (counted) |"
    rule = "|---|---|---|---|---|"
    if paper_designs:
        head += " Gflops (Table 4) | params (Table 4) | FID-50K at 400K (Table 4) |"
        rule += "---|---|---|"
    lines = [head, rule]
    for r in counted:
        line = (f"| {r['block']} | {r['gmacs'] * scale:.2f} | {r['overhead']:+.1%} | {r['tokens']} | "
                f"{r['params'] / 1e6:.2f} M |")
        if paper_designs:
            g, m, fid = paper_designs[r["block"]]
            line += f" {g:.2f} | {m} M | {fid:.2f} |"
        lines.append(line)
    return "\n".join(lines)


def format_paper_scaling(paper_rows: list[dict], counted: bool = True) -> str:
    """Table 4's twelve configurations (:func:`dit_book.paper.scaling_rows`) as a Markdown table: Gflops, parameters
    and FID-50K at 400K steps, and (``counted``) the same model's multiply-adds and parameters as
    :mod:`dit_core.measure.flops` counts them."""
    from dit_core.measure.flops import count_params, forward_macs, meta_model

    lines = ["| model | Gflops | params | FID-50K at 400K |" + (" Gflops (counted) | params (counted) |" if counted
                                                                   else ""),
             "|---|---|---|---|" + ("---|---|" if counted else "")]
    for r in paper_rows:
        line = f"| {r['variant']} | {r['gflops']:.2f} | {r['params'] / 1e6:.0f} M | {r['final_fd']['median']:.2f} |"
        if counted:
            model = meta_model(r["variant"])
            line += f" {forward_macs(model) / 1e9:.2f} | {count_params(model) / 1e6:.1f} M |"
        lines.append(line)
    return "\n".join(lines)


def format_correlations(rows: list[dict]) -> str:
    """:func:`correlations` at every scored step, as a Markdown table (a row per measure, a column per step)."""
    steps = [p["step"] for p in rows[0]["fd"]]
    cs = [correlations(rows, s) for s in steps]
    names = (("Pearson r (log Gflops, log FD)", "pearson_log_gflops_log_fd"), ("Spearman (Gflops, FD)",
             "spearman_gflops_fd"), ("Pearson r (log Gflops, accuracy)", "pearson_log_gflops_accuracy"))
    lines = ["| step | " + " | ".join(str(s) for s in steps) + " |", "|---|" + "---|" * len(steps)]
    lines += [f"| {name} | " + " | ".join(f"{c[key]:+.2f}" for c in cs) + " |" for name, key in names]
    return "\n".join(lines)


def leads(rows: list[dict], variant: str, key: str = "accuracy") -> int | None:
    """The first scored step from which ``variant`` has the best median ``key`` at every later step (None: it
    does not keep the lead to the end)."""
    steps = [p["step"] for p in rows[0][key]]
    first = None
    for s in steps:
        if ordering(rows, key, s)[0] == variant:
            first = s if first is None else first
        else:
            first = None
    return first


#: The record files of the two studies (``benchmarks/results``): the block designs, their cross-attention rerun
#: (both variants, with :func:`conditioning`), the scaling grid.
RECORD_FILES = {"blocks": "paper-findings-blocks.json", "cross-attention": "paper-findings-blocks-cross-attention.json",
                "scaling": "paper-findings-scaling.json"}


def record_tables(results: str | os.PathLike) -> dict[str, str]:
    """The tables ``benchmarks/results/paper-findings.md`` shows, rendered from its JSON records: ``blocks`` (the
    four designs as the record ran them), ``cross-attention`` (the rerun of both variants), ``conditioning``,
    ``scaling``, ``correlations`` and ``paper`` (:func:`beside_the_paper`)."""
    from . import paper

    data = {k: load_records(Path(results) / name) for k, name in RECORD_FILES.items()}
    blocks, cross, scaling = (summarize_curves(data[k]["runs"]) for k in ("blocks", "cross-attention", "scaling"))
    designs = blocks + [r for r in cross if r["variant"] == "cross-attention"]  # the normalised one from the rerun
    return {"blocks": format_blocks_table(blocks, steps=[200, 400, 600, 800]),
            "cross-attention": format_blocks_table(cross, steps=[200, 400, 600, 800]),
            "conditioning": format_conditioning_table(cross),
            "scaling": format_scaling_table(scaling), "correlations": format_correlations(scaling),
            "paper": beside_the_paper(paper.design_rows(), designs, paper.scaling_rows(), scaling)}


# ----------------------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------------------


def plot_curves(records: list[dict], ax=None, x: str = "step", labels: dict | None = None,
                keys=("frechet_distance", "class_accuracy")):
    """FD and class accuracy (or any other figures of the scores, ``keys``, e.g. :func:`conditioning`'s) against
    ``x`` ("step" or "compute": the training compute) per variant (:func:`dit_book.study.plot_curves`): the median
    over seeds, the range shaded. Returns the figure."""
    def compute(runs, step):
        return training_compute(runs[0]["gflops"], runs[0]["batch_size"], step)

    return study.plot_curves(records, group="variant", x=x, keys=keys, ax=ax, xvalue=compute, labels=labels)


def plot_gflops(rows: list[dict], ax=None, ylabel: str = "final FD"):
    """Final FD (or the paper's FID) against Gflops per scaling configuration (the paper's Fig. 8): a point per
    configuration of ``rows`` (:func:`summarize_curves`, or :func:`dit_book.paper.scaling_rows`; the median over
    seeds, the range as an error bar), coloured by size, marked by patch (the largest patch a square)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    sizes = list(dict.fromkeys(size_and_patch(r["variant"])[0] for r in rows))
    patches = sorted({size_and_patch(r["variant"])[1] for r in rows}, reverse=True)
    markers = dict(zip(patches, "so^v"))
    for r in rows:
        size, patch = size_and_patch(r["variant"])
        f = r["final_fd"]
        ax.errorbar(r["gflops"], f["median"], yerr=[[f["median"] - f["min"]], [f["max"] - f["median"]]],
                    fmt=markers.get(patch, "o"), color=f"C{sizes.index(size)}", capsize=3, label=r["variant"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("Gflops (forward multiply-adds per image, in G)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=3)
    ax.figure.tight_layout()
    return ax.figure


# ----------------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------------


def write_results(path: Path, study_name: str, records: list[dict], settings: dict) -> str:
    rows = summarize_curves(records)
    table = format_blocks_table(rows) if study_name == "blocks" else format_scaling_table(rows)
    data = {"study": study_name, "settings": settings, "environment": study.environment(), "runs": records,
            "summary": rows, "table": table, "cpu_seconds": sum(r.get("cpu_seconds_this_call") or 0 for r in records)}
    if study_name == "scaling":
        data["correlations"] = correlations(rows)
        data["trade_offs"] = trade_offs(rows)
    atomic_write_text(path, json.dumps(data, indent=1, default=str) + "\n")
    return table


def record_path(results: Path, study_name: str, tag: str | None = None, quick: bool = False) -> Path:
    """``results/paper-findings-<study>[-<tag>][-quick].json``."""
    return Path(results) / f"paper-findings-{study_name}{'-' + tag if tag else ''}{'-quick' if quick else ''}.json"


def _job(study_name: str, variant: str, seed: int, work, kw: dict) -> dict:
    return {"fn": run_one, "args": (study_name, variant, seed, str(work)), "kw": kw}


def run_grid(study_name: str, work: Path, results: Path, seeds, jobs: int = 1, kw: dict | None = None,
             only: list[str] | None = None, quick: bool = False, tag: str | None = None) -> list[dict]:
    """Run every (variant, seed) of ``study_name`` (``only``: those variants), ``jobs`` at a time (one thread each,
    :func:`dit_book.study.run_jobs`), rewriting the results file (:func:`record_path`) after every run. A results
    file that holds runs of other variants is not overwritten: give those runs' file another ``tag``."""
    kw = dict(kw or {})
    unknown = sorted(set(only or ()) - set(variants(study_name)))
    if unknown:
        raise ValueError(f"unknown {study_name} variant(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(variants(study_name))}")
    names = [v for v in variants(study_name) if not only or v in only]
    path = record_path(results, study_name, tag, quick)
    if path.is_file():
        others = sorted({r["variant"] for r in load_records(path).get("runs", [])} - set(names))
        if others:
            raise FileExistsError(f"{path} holds runs of {', '.join(others)}, which this command does not run; "
                                  "writing it would drop them. Give the new runs a file of their own (--tag NAME "
                                  f"writes {record_path(results, study_name, 'NAME', quick).name}).")
    settings = {"study": {**STUDIES[study_name], **kw}, "variants": {v: variants(study_name)[v] for v in names},
                "seeds": list(seeds), "quick": quick}
    records: list[dict] = []

    def done(record):
        records.append(record)
        records.sort(key=lambda r: (r["variant"], r["seed"]))
        write_results(path, study_name, records, settings)
        last = record["evals"][-1] if record["evals"] else {}
        print(f"  {study_name} {record['variant']} seed {record['seed']}: FD "
              f"{last.get('frechet_distance', math.nan):.2f}, accuracy {last.get('class_accuracy', math.nan):.1%}, "
              f"{record['cpu_seconds_this_call']:.0f} s CPU", flush=True)

    study.run_jobs([_job(study_name, v, s, work, kw) for s in seeds for v in names], jobs, done)
    print(f"\n{study_name} ({path}):\n{write_results(path, study_name, records, settings)}\n", flush=True)
    return records


QUICK = dict(max_steps=40, eval_every=20, per_class=4, eval_steps=8)


# ----------------------------------------------------------------------------------------------------------
# The chapter's live run (its set-up is dit_book.setup.paper_findings)
# ----------------------------------------------------------------------------------------------------------


def run_live(designs, work, *, max_steps: int, eval_every: int, per_class: int, eval_steps: int,
             overrides: dict | None = None, jobs: int = 2, seed: int = 0) -> list[dict]:
    """The block-design study at a reduced size, as the chapter runs it: ``designs`` trained on the digits for
    ``max_steps`` each (the learning rate decays over them), scored every ``eval_every`` steps without guidance,
    ``jobs`` runs at a time on one thread each, the trainer's lines in each run's ``train.log``. Returns the records
    in the order of ``designs`` (a fresh measurement: ``work`` is cleared)."""
    work = Path(work)
    shutil.rmtree(work / "blocks", ignore_errors=True)
    kw = dict(max_steps=max_steps, eval_every=eval_every, per_class=per_class, eval_steps=eval_steps,
              overrides=overrides or {}, quiet=True)
    records = study.run_jobs([_job("blocks", d, seed, work, kw) for d in designs], jobs)
    return sorted(records, key=lambda r: list(designs).index(r["variant"]))


def main(argv=None) -> int:
    import argparse

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    repo = Path(__file__).resolve().parents[1]
    p = argparse.ArgumentParser(prog="python -m dit_book.findings", description=__doc__.splitlines()[0])
    p.add_argument("--studies", default="blocks,scaling", help="blocks, scaling (comma-separated)")
    p.add_argument("--variants", default=None, help="only these variants (e.g. adaln-zero,in-context or "
                                                    "d2w64/2,d4w128/1)")
    p.add_argument("--seeds", type=int, default=len(SEEDS), help="seeds 0 .. N-1 (default 3)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, one thread each")
    p.add_argument("--work", default=str(repo / "runs" / "findings"), help="the runs' state (resumable)")
    p.add_argument("--results", default=str(repo / "benchmarks" / "results"), help="where the JSON records go")
    p.add_argument("--tag", default=None, help="write paper-findings-<study>-<TAG>.json (runs kept apart)")
    p.add_argument("--quick", action="store_true", help="tiny budgets, one seed: every code path in minutes")
    p.add_argument("--estimate", action="store_true", help="time a few steps of every variant and project the CPU time")
    for key in ("max_steps", "eval_every", "per_class", "eval_steps"):
        p.add_argument(f"--{key.replace('_', '-')}", type=int, default=None)
    args = p.parse_args(argv)
    studies = [s.strip() for s in args.studies.split(",") if s.strip()]
    for s in studies:
        variants(s)
    only = [v.strip() for v in args.variants.split(",")] if args.variants else None
    kw = dict(QUICK) if args.quick else {}
    kw.update({k: getattr(args, k) for k in ("max_steps", "eval_every", "per_class", "eval_steps")
               if getattr(args, k)})
    if args.estimate:
        return estimate(studies, Path(args.work), seeds=args.seeds, only=only)
    work = Path(args.work + ("-quick" if args.quick else ""))
    results = work if args.quick else Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    seeds = range(1 if args.quick else args.seeds)
    cpu0 = time.process_time()
    for s in studies:
        run_grid(s, work, results, seeds, args.jobs, kw, only, args.quick, args.tag)
    print(f"CPU time of this command's own process: {time.process_time() - cpu0:.0f} s (the runs' CPU time is in "
          "each record's cpu_seconds_this_call)")
    return 0


def estimate(studies: list[str], work: Path, seeds: int = 3, only=None, steps: int = 20) -> int:
    """Time ``steps`` training steps and one small score of every variant on one thread; project each study."""
    import tempfile

    import torch

    torch.set_num_threads(1)
    total = 0.0
    for study_name in studies:
        spec = STUDIES[study_name]
        print(f"{study_name}: {'variant':10} {'s/step':>8} {'s/score':>8} {'run min':>8}")
        for variant in variants(study_name):
            if only and variant not in only:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                cpu0 = time.process_time()
                r = run_one(study_name, variant, 0, tmp, max_steps=steps, eval_every=steps,
                            per_class=spec["per_class"], eval_steps=spec["eval_steps"], overrides={"warmup_steps": 1})
                cpu = time.process_time() - cpu0
            per_step = r["train_cpu_seconds_this_call"] / steps  # CPU time: the machine may be shared
            per_eval = max(cpu - r["train_cpu_seconds_this_call"], 0.0)
            minutes = (spec["max_steps"] * per_step + spec["max_steps"] // spec["eval_every"] * per_eval) / 60
            total += minutes * seeds
            print(f"{study_name}: {variant:10} {per_step:8.3f} {per_eval:8.1f} {minutes:8.1f}", flush=True)
    print(f"projected CPU time, {seeds} seeds: {total / 60:.2f} h on one thread")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
