"""The paper's findings in miniature (dit_book.findings, chapter 7c): the study's grids, one real run at toy size,
and the reading of its records (spreads over seeds, Gflops-quality correlations, the size-patch trade-offs), on
records made up here and on the paper's own Table 4 (dit_book.paper), read by the same code; the figures chapter 7c
and benchmarks/results/paper-findings.md state, computed from the committed JSON; the GPU track's variants, cost
estimates and the plan that fits its cell (or says it cannot)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dit_book import findings, findings_gpu, paper, study
from dit_book import track as tracks


def _run(variant, seed, fds, accs, gflops=1e-3, steps=(100, 200), batch=64, study_name="scaling", params=1000):
    return {"study": study_name, "variant": variant, "seed": seed, "settings": {}, "max_steps": steps[-1],
            "batch_size": batch, "params": params, "gflops": gflops, "tokens": 16, "train_seconds": 10.0,
            "evals": [{"step": s, "frechet_distance": f, "class_accuracy": a, "real_floor": 0.5, "seconds": 1.0}
                      for s, f, a in zip(steps, fds, accs)]}


def test_the_grids():
    assert list(findings.variants("blocks")) == ["in-context", "cross-attention", "adaln", "adaln-zero",
                                                 "cross-attention-raw"]
    scaling = findings.variants("scaling")
    assert len(scaling) == 9 and scaling["d4w128/2"] == dict(depth=4, hidden_size=128, num_heads=4, patch_size=2,
                                                              block="adaln-zero")
    assert not any(v.split("/")[0] in ("S", "B", "L", "XL") for v in scaling), "the tiny sizes read as DiT's"
    with pytest.raises(ValueError, match="unknown study 'sizes'"):
        findings.variants("sizes")
    # the costs are counted on the trainer's model for the digits: d4w128/2 is the digits profile's model
    l2, l1, s4 = (findings.model_facts(scaling[v]) for v in ("d4w128/2", "d4w128/1", "d2w64/4"))
    assert l2["params"] == 1_274_888 and l2["tokens"] == 16 and l1["tokens"] == 64 and s4["tokens"] == 4
    assert s4["gflops"] < l2["gflops"] < l1["gflops"]
    ic = findings.model_facts(findings.variants("blocks")["in-context"])
    assert ic["tokens"] == 18 and ic["gflops"] > l2["gflops"]
    raw, normed = (findings.model_facts(findings.variants("blocks")[v]) for v in ("cross-attention-raw",
                                                                                   "cross-attention"))
    assert raw == normed  # the context's LayerNorm has no weights and no counted multiply-adds


def test_one_real_run_at_toy_size(tmp_path):
    record = findings.run_one("blocks", "cross-attention", 0, tmp_path, max_steps=4, eval_every=2, per_class=2,
                              eval_steps=2, overrides=dict(depth=1, hidden_size=32, num_heads=2, warmup_steps=0))
    assert [e["step"] for e in record["evals"]] == [2, 4]
    assert all(0 <= e["class_accuracy"] <= 1 and e["frechet_distance"] > 0 for e in record["evals"])
    assert record["settings"]["block"] == "cross-attention" and record["tokens"] == 16 and record["cfg_scale"] == 1.0
    assert record["cpu_seconds_this_call"] > 0 and record["classifier_val_accuracy"] > 0.9
    # what the class does to the model, measured at every score
    last = record["evals"][-1]
    assert 0 < last["class_effect"] and 0 < last["class_attention"] < 1 and 0 < last["class_read"] < 1
    assert last["class_rms"] > 0 and last["time_rms"] > 0
    out = tmp_path / "blocks" / "cross-attention" / "seed0"
    assert (out / "record.json").is_file() and not (out / "checkpoints").exists()
    assert findings.run_one("blocks", "cross-attention", 0, tmp_path) == record  # a finished run is read back


def test_spreads_tables_and_orderings():
    records = [_run("adaln-zero", s, [2.0 + s, 1.0 + 0.1 * s], [0.5, 0.9], study_name="blocks") for s in range(3)]
    records += [_run("in-context", s, [4.0 + s, 3.0 + 0.1 * s], [0.3, 0.6], study_name="blocks") for s in range(3)]
    rows = {r["variant"]: r for r in findings.summarize_curves(records)}
    final = rows["adaln-zero"]["final_fd"]
    assert (final["median"], final["min"], final["max"], final["seeds"]) == (1.1, 1.0, 1.2, 3)
    assert rows["adaln-zero"]["train_gflop"] == pytest.approx(3 * 1e-3 * 64 * 200)
    assert findings.ordering(list(rows.values()), "fd") == ["adaln-zero", "in-context"]
    assert findings.separated(rows["adaln-zero"]["final_fd"], rows["in-context"]["final_fd"])
    assert not findings.separated(rows["adaln-zero"]["fd"][0], rows["in-context"]["fd"][0])  # [2, 4] vs [4, 6]
    table = findings.format_blocks_table(list(rows.values()))
    assert "| adaln-zero | 1.00 |" in table and "1.10 [1.00, 1.20]" in table and "90.0 %" in table


def test_the_clear_of_report():
    """The order by median FD at each step, the designs whose seed range adaLN-Zero's stays clear of, and the count of
    comparisons with the number expected clear by chance alone (0.1 each for three seeds against three)."""
    records = [_run("adaln-zero", s, [4.0 + s, 1.0 + 0.1 * s], [0.2, 0.9], study_name="blocks") for s in range(3)]
    records += [_run("in-context", s, [3.0 + s, 3.0 + 0.1 * s], [0.5, 0.6], study_name="blocks") for s in range(3)]
    records += [_run("adaln", s, [5.0 + s, 1.1 + 0.1 * s], [0.1, 0.7], study_name="blocks") for s in range(3)]
    lines = findings.clear_of_report(findings.summarize_curves(records))
    assert lines[0] == ("step  100: best to worst by FD in-context > adaln-zero > adaln; adaLN-Zero clear of: none")
    assert lines[1] == ("step  200: best to worst by FD adaln-zero > adaln > in-context; adaLN-Zero clear of: "
                        "in-context")  # [1.0, 1.2] against adaln's [1.1, 1.3]: overlapping, not clear
    assert lines[2] == ("4 comparisons: about 0.4 would come out clear by chance alone; adaLN-Zero leads by the "
                        "median accuracy from step 200")
    # fewer seeds make a clear range likelier by chance: one seed against one is always "clear"
    one = findings.clear_of_report(findings.summarize_curves([r for r in records if r["seed"] == 0]))
    assert one[-1].startswith("4 comparisons: about 4.0 would come out clear by chance alone")


def test_three_seeds_apart_by_chance():
    # every ordering of six results equally likely: 2 of the C(6, 3) = 20 splits put one variant's three below
    assert findings.chance_apart(3, 3) == pytest.approx(0.1)
    assert findings.chance_apart(1, 1) == 1.0 and findings.chance_apart(5, 5) == pytest.approx(2 / 252)


def test_correlations_and_trade_offs():
    # FD falls with Gflops: a perfect rank correlation, whatever the size/patch mix
    grid = {"d2w64/4": 1.0, "d2w64/2": 4.0, "d3w96/4": 3.5, "d3w96/2": 14.0}
    records = [_run(v, s, [10 / g, 5 / g + 0.01 * s], [0.1, 0.5], gflops=g * 1e-3) for v, g in grid.items()
               for s in range(3)]
    rows = findings.summarize_curves(records)
    c = findings.correlations(rows)
    assert c["points"] == 4 and c["spearman_gflops_fd"] == pytest.approx(-1.0)
    assert c["pearson_log_gflops_log_fd"] == pytest.approx(-1.0, abs=1e-3)
    pairs = findings.trade_offs(rows)
    assert [(p["a"], p["b"]) for p in pairs] == [("d2w64/2", "d3w96/4")]  # 4.0 vs 3.5 Gflops
    assert not pairs[0]["overlap_fd"]  # 1.25 [1.25, 1.27] vs 1.43 [1.43, 1.45]
    assert pairs[0]["larger_patch"] == "d3w96/4" and pairs[0]["larger_patch_worse"]
    assert pairs[0]["fd_ratio"] == pytest.approx((5 / 3.5 + 0.01) / (5 / 4 + 0.01))
    assert math.isnan(findings.pearson([1, 2], [3, 4]))
    reach = findings.compute_to(rows, 3.0)  # FD <= 3: d2w64/4 never (10, 5), the others at their first step
    assert reach["d2w64/4"] is None and reach["d3w96/2"] == pytest.approx(3 * 14e-3 * 64 * 100)
    assert reach["d2w64/2"] == pytest.approx(findings.training_compute(4e-3, 64, 100))


def test_table_4_read_by_the_same_code():
    """The paper's Table 4 through the digits' analysis. The paper prints no coefficient (its Figure 8: "a strong
    negative correlation"); computed from Table 4's twelve models, Pearson's r of log Gflops and log FID is -0.94.
    Equal-Gflops pairs land together except where a patch-8 model is one of them."""
    rows = paper.scaling_rows()
    assert len(rows) == 12 and {r["variant"] for r in rows} == set(paper.SCALING)
    c = findings.correlations(rows)
    assert c["points"] == 12 and round(c["pearson_log_gflops_log_fd"], 2) == -0.94
    assert math.isnan(c["pearson_log_gflops_accuracy"])  # FID only: no class accuracy in the table
    pairs = {(p["a"], p["b"]): p for p in findings.trade_offs(rows)}
    assert pairs[("DiT-S/2", "DiT-B/4")]["fd_ratio"] == pytest.approx(68.40 / 68.38)  # the paper's example
    eights = [p for p in pairs.values() if "/8" in p["a"] + p["b"]]
    assert eights and all(p["larger_patch_worse"] and p["fd_ratio"] > 1.2 for p in eights)
    assert all(p["fd_ratio"] < 1.06 for p in pairs.values() if p not in eights)
    assert pairs[("DiT-B/4", "DiT-L/8")]["fd"][1]["median"] == 118.87  # another equal-Gflops pair: apart
    checks = findings.scaling_checks(rows)
    assert checks["larger_model"] and checks["smaller_patch"]  # Figure 6, at 400K steps
    assert findings.ordering(paper.design_rows()) == ["adaln-zero", "adaln", "cross-attention", "in-context"]
    # parameters as Table 4 prints them, and as the FLOP counter counts them
    from dit_core.measure.flops import count_params, design_table, meta_model

    for name, (gflops, params_m, _) in paper.SCALING.items():
        assert count_params(meta_model(name)) / 1e6 == pytest.approx(params_m, abs=1.0)
    counted = {r["block"]: r for r in design_table("DiT-XL/2")}
    for design, (gflops, params_m, _) in paper.DESIGNS.items():
        assert counted[design]["params"] / 1e6 == pytest.approx(params_m, abs=1.0)
        assert counted[design]["gmacs"] == pytest.approx(gflops, rel=0.02)


def test_beside_the_paper_reads_both_through_one_table():
    designs = [_run(d, s, [3.0, f + 0.01 * s], [0.2, 0.8], study_name="blocks")
               for d, f in (("in-context", 1.2), ("adaln-zero", 0.6), ("adaln", 1.3), ("cross-attention", 1.1))
               for s in range(3)]
    grid = {"d2w64/4": (1.0, 2.8), "d2w64/2": (4.0, 7.0), "d3w96/4": (3.5, 1.4), "d3w96/2": (14.0, 3.9)}
    scaling = [_run(v, s, [9.0, f], [0.1, 0.5], gflops=g * 1e-3, params=1000 * (1 + v.startswith("d3")))
               for v, (g, f) in grid.items() for s in range(3)]
    table = findings.beside_the_paper(paper.design_rows(), findings.summarize_curves(designs), paper.scaling_rows(),
                                      findings.summarize_curves(scaling), target=1.5)
    assert table.startswith("| | the paper (Table 4")
    assert "adaln-zero 19.47 < adaln 25.21 < cross-attention 26.14 < in-context 35.24" in table
    assert "| adaLN-Zero over in-context | 0.55 | 0.50 |" in table
    assert "-0.94 (12 models)" in table
    assert "no: d2w64/2 above d2w64/4, d3w96/2 above d3w96/4" in table  # the smaller patch worse here
    assert "d3w96/4, " in table.splitlines()[-1]  # the least compute to FD 1.5


def test_committed_records_load_under_the_codes_names(tmp_path):
    """The committed scaling record names its sizes S, B, L; the code names them d2w64, d3w96, d4w128 and reads the
    record under those names, the same figures. A file's labels give its runs of a design the name the code gives
    that design (the record's unnormalised cross-attention runs are cross-attention-raw)."""
    assert study.code_name("S/4") == "d2w64/4" and study.code_name("L/1") == "d4w128/1"
    assert study.code_name("adaln-zero") == "adaln-zero" and study.code_name("DiT-S/2") == "DiT-S/2"
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"labels": {"cross-attention": "cross-attention-raw"},
                                "settings": {"variants": {"S/2": {}, "cross-attention": {}}},
                                "runs": [_run("S/2", 0, [1, 2], [0.1, 0.2]), _run("cross-attention", 0, [3, 4], [0.1, 0.2])]}))
    data = study.load_records(path)
    assert [r["variant"] for r in data["runs"]] == ["d2w64/2", "cross-attention-raw"]
    assert list(data["settings"]["variants"]) == ["d2w64/2", "cross-attention-raw"]


def test_a_subset_never_overwrites_the_whole_record(tmp_path):
    path = findings.record_path(tmp_path, "blocks")
    path.write_text(json.dumps({"runs": [_run("adaln-zero", 0, [1], [0.5], study_name="blocks")]}))
    with pytest.raises(FileExistsError, match="holds runs of adaln-zero.*--tag NAME"):
        findings.run_grid("blocks", tmp_path / "w", tmp_path, [0], only=["in-context"])
    with pytest.raises(ValueError, match="unknown blocks variant.*film"):
        findings.run_grid("blocks", tmp_path / "w", tmp_path, [0], only=["film"])
    assert findings.record_path(tmp_path, "blocks", "cross-attention").name == "paper-findings-blocks-cross-attention.json"


def test_the_gpu_study_variants_and_costs():
    assert findings_gpu.variants("blocks")["cross-attention"] == {"model": "DiT-S/4", "block": "cross-attention"}
    assert list(findings_gpu.variants("scaling")) == ["DiT-S/8", "DiT-S/4", "DiT-B/8", "DiT-B/4"]
    assert findings_gpu.gflops({"model": "DiT-B/4"}) == pytest.approx(paper.SCALING["DiT-B/4"][0], rel=0.01)
    fast, slow = tracks.card_peak("NVIDIA H100 80GB HBM3"), tracks.card_peak("NVIDIA GeForce RTX 3060")
    h100, rtx = findings_gpu.costs(fast, "blocks"), findings_gpu.costs(slow, "blocks")
    assert rtx["total"] == pytest.approx(h100["total"] * fast / slow) and h100["train"] > 0 and h100["fid"] > 0
    assert findings_gpu.costs(fast, "blocks", steps=4000)["train"] == pytest.approx(2 * h100["train"])


@pytest.mark.parametrize("card", ["NVIDIA GeForce RTX 3060", "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090",
                                  "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"])
def test_both_gpu_studies_fit_one_cell_on_every_card_of_the_routes(card):
    peak = tracks.card_peak(card)
    p = findings_gpu.plan(peak)
    both = sum(findings_gpu.costs(peak, s, steps=p["steps"], eval_every=p["eval_every"],
                                  fid_samples=p["fid_samples"])["total"] for s in findings_gpu.STUDIES)
    assert both == pytest.approx(p["seconds"]) and both <= tracks.cell_budget() < tracks.CELL_TIMEOUT_S
    assert p["steps"] % p["eval_every"] == 0 and p["fid_samples"] % 10 == 0 and p["steps"] >= 100 and p["fits"]
    full = sum(findings_gpu.costs(peak, s)["total"] for s in findings_gpu.STUDIES)
    assert p["reduced"] == (full > tracks.cell_budget()) and (p["note"].startswith("the sizes as set") != p["reduced"])


def test_the_gpu_plan_cuts_in_order():
    fast, slow = tracks.card_peak("NVIDIA H100 SXM"), tracks.card_peak("NVIDIA GeForce RTX 3060")
    assert findings_gpu.plan(fast)["steps"] == 2000 and not findings_gpu.plan(fast)["reduced"]
    fewer = findings_gpu.plan(tracks.card_peak("NVIDIA GeForce RTX 4090"))
    assert fewer["steps"] == 1000 and fewer["eval_every"] == 1000 and fewer["fid_samples"] == 1000  # one interval
    small = findings_gpu.plan(slow)
    assert small["eval_every"] == small["steps"] < 1000 and small["fid_samples"] < 1000 and "smaller plan" in small["note"]
    assert findings_gpu.chapter_seconds(fast) == findings_gpu.plan(fast)["seconds"]
    as_set = findings_gpu.plan(slow, fit=False)  # GPU_FIT_CELL = False: the sizes as set, their estimate said
    assert (as_set["steps"], as_set["eval_every"], as_set["fid_samples"]) == (2000, 1000, 1000)
    assert not as_set["reduced"]
    assert not as_set["fits"] and f"about {as_set['seconds'] / 60:.0f} min (estimate), past this cell's budget" in \
        as_set["note"]


@pytest.mark.parametrize("card", ["Quadro P1000", None])
def test_a_card_without_a_known_peak_is_planned_as_the_slowest_known(card):
    """A card dit_book.track.GPU_PEAKS does not know (or no card) gets the plan of the slowest card it knows, which
    fits the cell there, and the note says so; not the sizes as set (about 2.5 h on an RTX 3060)."""
    assert tracks.card_peak(card) is None
    name, peak = findings_gpu.slowest_card()
    assert peak == min(p for _, p in tracks.GPU_PEAKS) and tracks.card_peak(f"NVIDIA GeForce RTX {name}") == peak
    unknown, slowest = findings_gpu.plan(tracks.card_peak(card)), findings_gpu.plan(peak)
    assert {k: v for k, v in unknown.items() if k != "note"} == {k: v for k, v in slowest.items() if k != "note"}
    assert unknown["reduced"] and unknown["fits"] and unknown["seconds"] <= tracks.cell_budget()
    assert unknown["note"].startswith(f"no peak known for this device, so planned as the slowest card") and \
        f"({name}, {peak:g} TFLOP/s" in unknown["note"] and unknown["note"].endswith(slowest["note"])
    row = findings_gpu.format_plans([card or "Quadro P1000"]).splitlines()[-1]
    assert f"(no peak known: planned as {name})" in row and f"~{unknown['seconds'] / 60:.0f} min |" in row


def test_a_plan_that_cannot_fit_says_so(monkeypatch):
    """On a card too slow for even the smallest plan (100 steps, one FID of 10 samples), the plan is that smallest one
    and its note gives the estimate against the budget instead of claiming a fit."""
    p = findings_gpu.plan(1.0)  # 1 TFLOP/s
    assert (p["steps"], p["eval_every"], p["fid_samples"]) == (100, 100, 10) and p["reduced"] and not p["fits"]
    assert p["seconds"] > tracks.cell_budget()
    assert p["note"].startswith("even the smallest plan") and "to fit" not in p["note"]
    assert (f"takes about {p['seconds'] / 60:.0f} min (estimate), past this cell's budget of "
            f"{tracks.cell_budget() / 60:.0f} min (the book stops a cell at {tracks.CELL_TIMEOUT_S / 60:.0f} min)"
            ) in p["note"]
    monkeypatch.setattr(tracks, "GPU_PEAKS", tracks.GPU_PEAKS + (("P1000", 1.0),))
    assert findings_gpu.format_plans(["Quadro P1000"]).splitlines()[-1] == (
        f"| Quadro P1000 | ~{findings_gpu.plan(1.0, fit=False)['seconds'] / 60:.0f} min | 100 steps, FID every 100 "
        f"of 10 samples (past the cell's budget) | ~{p['seconds'] / 60:.0f} min |")


def test_the_record_shows_its_json():
    """benchmarks/results/paper-findings.md's tables are its JSON records rendered by findings.record_tables (the
    scaling runs under the code's size names, the block-design runs' cross-attention as cross-attention-raw), and
    the figures it states in words are the JSON's."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    text = (results / "paper-findings.md").read_text()
    tables = findings.record_tables(results)
    for name, table in tables.items():
        assert table in text, f"paper-findings.md: its {name} table is not its JSON's; paste findings.record_tables()"
    blocks = findings.summarize_curves(study.load_records(results / findings.RECORD_FILES["blocks"])["runs"])
    assert findings.leads(blocks, "adaln-zero", "accuracy") == 600 and findings.leads(blocks, "adaln-zero", "fd") == 400
    assert "highest median accuracy from step 600 on" in " ".join(text.split())


def test_chapter_7c_quotes_table_4_as_the_data_holds_it():
    """The paper's numbers in chapter 7c's prose are dit_book.paper's (Table 4), and its quotations are the paper's
    sentences as paper.QUOTES holds them."""
    from dit_book.records import prose

    text = prose(Path(__file__).resolve().parents[1] / "book" / "07c_paper_findings.ipynb")
    d, s = paper.DESIGNS, paper.SCALING
    assert (f"in-context {d['in-context'][2]:.2f}, cross-attention {d['cross-attention'][2]:.2f}, adaLN "
            f"{d['adaln'][2]:.2f}, adaLN-Zero {d['adaln-zero'][2]:.2f}") in text
    assert f"DiT-S/2 ({s['DiT-S/2'][0]:.2f} Gflops) and DiT-B/4 ({s['DiT-B/4'][0]:.2f}) end at {s['DiT-S/2'][2]:.2f} " \
           f"and {s['DiT-B/4'][2]:.2f}" in text
    assert f"Another pair of about equal Gflops, DiT-L/8 ({s['DiT-L/8'][0]:.2f}) and DiT-B/4, ends at " \
           f"{s['DiT-L/8'][2]:.2f} against {s['DiT-B/4'][2]:.2f}" in text
    for key in ("fig5", "half", "scaling", "similar", "correlation", "compute"):  # quoted whole, or their start
        assert paper.QUOTES[key][:80] in text, key
    assert "XL/4 is outperformed by XL/2 after roughly $10^{10}$ Gflops" in text
    assert "Figure 5 of the paper" in text and "gives curves, not a table" not in text
    assert "whatever mix of size and patch" not in text and "leaves aside" not in text


def test_the_papers_own_example_is_the_papers():
    """Chapter 7c and the record call DiT-S/2 and DiT-B/4 the paper's own example (its words: "e.g., DiT-S/2 and
    DiT-B/4") and name DiT-L/8 and DiT-B/4 as another pair of about equal Gflops, with Table 4's figures."""
    import re

    from dit_book.records import prose

    root = Path(__file__).resolve().parents[1]
    assert "(e.g., DiT-S/2 and DiT-B/4)" in paper.QUOTES["similar"]
    s = paper.SCALING
    for path in (root / "book" / "07c_paper_findings.ipynb", root / "benchmarks" / "results" / "paper-findings.md"):
        text = prose(path)
        examples = [m.end() for m in re.finditer(r"own example", text)]
        assert examples, f"{path.name}: names the paper's own example"
        for end in examples:
            models = re.findall(r"DiT-\w+/\d", text[end:end + 80])
            assert models[:2] == ["DiT-S/2", "DiT-B/4"], f"{path.name}: the paper's own example is {models[:2]}"
        assert re.search(r"another pair of about equal Gflops, DiT-L/8 \(" + f"{s['DiT-L/8'][0]:.2f}" + r"\) and "
                         r"DiT-B/4.{0,20}, ends at " + f"{s['DiT-L/8'][2]:.2f} against {s['DiT-B/4'][2]:.2f}",
                         text, re.I), path.name
        assert "chapter's other pair" not in text, path.name


def test_chapter_7c_and_the_record_state_the_jsons_figures():
    """Every figure chapter 7c's prose states from the digits records, and paper-findings.md with it, computed here
    from the committed JSON by findings' own functions (summarize_curves, leads, ordering, separated, compute_to,
    correlations, trade_offs, scaling_checks) and found in both texts: dit_book.records.QUOTES binds the chapter to
    the record's prose, this binds both to the JSON. (The CPU minutes of the first runs come from /usr/bin/time, which
    the JSON does not hold.)"""
    from dit_book.records import prose

    root = Path(__file__).resolve().parents[1]
    results = root / "benchmarks" / "results"
    texts = {"7c": prose(root / "book" / "07c_paper_findings.ipynb"), "record": prose(results / "paper-findings.md")}
    missing = []

    def says(where, *figures):
        for figure in figures:
            if figure not in texts[where]:
                missing.append(f"{where}: {figure!r}")

    def both(figure):
        says("7c", figure)
        says("record", figure)

    def load(name):
        return study.load_records(results / name)

    def pct(v):  # 0.84 -> "84", 0.605 -> "60.5"
        return f"{100 * v:.1f}".removesuffix(".0")

    def at(row, key, step):
        return next(p for p in row[key] if p["step"] == step)

    def step_range(p):  # as the record writes a spread of accuracies: 35.0 % [26.0, 42.0]
        return f"{100 * p['median']:.1f} % [{100 * p['min']:.1f}, {100 * p['max']:.1f}]"

    # the block designs
    data = load(findings.RECORD_FILES["blocks"])
    (run,) = {(r["max_steps"], r["batch_size"], r["eval_every"], r["per_class"], r["eval_steps"], r["cfg_scale"])
              for r in data["runs"]}
    last, batch, every, per_class, eval_steps, cfg_scale = run
    blocks = findings.summarize_curves(data["runs"])
    b = {r["variant"]: r for r in blocks}
    assert {r["seeds"] for r in blocks} == {3} and cfg_scale == 1.0
    says("7c", f"({last} steps of {batch} images", f"three seeds each, and scores the EMA model every {every} steps",
         f"{per_class} unguided samples per class", f"{eval_steps} DDIM steps", f"800 steps are the first "
         f"{100 * last / paper.STEPS:.1f} % of the paper's 400K", f"in-context's two tokens are 2 of "
         f"{b['in-context']['tokens']} here")
    says("record", f"scored every {every} steps without guidance", f"{per_class} samples per class, {eval_steps} DDIM "
         f"steps", f"patch 2, {b['adaln-zero']['tokens']} tokens; {last} steps")
    floor = b["adaln-zero"]["real_floor"]
    az, ic, ad = (b[v]["final_accuracy"] for v in ("adaln-zero", "in-context", "adaln"))
    az_fd, ic_fd, ad_fd = (b[v]["final_fd"]["median"] for v in ("adaln-zero", "in-context", "adaln"))
    both(f"real digits score FD {floor:.2f}")
    both(f"Its final FD, {az_fd:.2f}, lies below the real floor ({floor:.2f})")
    assert az_fd < floor
    says("7c", f"{pct(az['median'])} % of samples in their class at {last} steps, against {pct(ic['median'])} % for "
               f"in-context and {pct(ad['median'])} % for adaLN",
         f"ends with {pct(ad['median'])} % of samples in the right class against adaLN-Zero's {pct(az['median'])} %",
         f"the lowest FD from step {findings.leads(blocks, 'adaln-zero', 'fd')} on",
         f"its ratio to in-context's {ic_fd:.2f} is not")
    says("record", f"{pct(az['median'])} % [{pct(az['min'])}, {pct(az['max'])}] of samples in their class, against "
                   f"{ic_fd:.2f} and {pct(ic['median'])} % for in-context, {ad_fd:.2f} and {pct(ad['median'])} % for "
                   "adaLN", f"the lowest median FD from step {findings.leads(blocks, 'adaln-zero', 'fd')} on",
         f"its ratio to in-context's {ic_fd:.2f} ({az_fd / ic_fd:.2f})")
    steps = [p["step"] for p in b["adaln-zero"]["accuracy"]]
    ahead = [s for s in steps
             if at(b["in-context"], "accuracy", s)["median"] > at(b["adaln-zero"], "accuracy", s)["median"]]
    first = [s for s in steps if findings.ordering(blocks, "accuracy", s)[0] == "in-context"]
    assert ahead == steps[:len(ahead)] and first == steps[:len(first)], "in-context ahead from the start, then not"
    ic300, az300 = at(b["in-context"], "accuracy", 300), at(b["adaln-zero"], "accuracy", 300)
    lead = findings.leads(blocks, "adaln-zero")
    says("7c", f"in-context draws the right class more often than adaLN-Zero up to step {ahead[-1]} (at step 300, "
               f"{pct(ic300['median'])} % against {pct(az300['median'])} %)",
         f"in-context drew the right class more often than adaLN-Zero until step {ahead[-1]}",
         f"adaLN-Zero leads by the median accuracy from step {lead}")
    says("record", f"In-context has the highest median class accuracy up to step {first[-1]} (at step 300 "
                   f"{step_range(ic300)} against adaLN-Zero's {step_range(az300)})",
         f"the highest median accuracy from step {lead} on")

    # cross-attention, its context normalised or not
    cross = load(findings.RECORD_FILES["cross-attention"])
    c = {r["variant"]: r for r in findings.summarize_curves(cross["runs"])}
    n, raw = c["cross-attention"], c["cross-attention-raw"]
    says("7c", f"FD {n['final_fd']['median']:.2f} and {pct(n['final_accuracy']['median'])} % of samples in their "
               f"class at {last} steps, against {raw['final_fd']['median']:.2f} and "
               f"{pct(raw['final_accuracy']['median'])} % unnormalised on the same machine",
         "ends level with in-context")
    assert not findings.separated(n["final_fd"], b["in-context"]["final_fd"])  # level: the seeds' ranges overlap
    says("record", f"{n['final_fd']['median']:.2f} and {pct(n['final_accuracy']['median'])} % for cross-attention "
                   "with its context normalised",
         f"FD {raw['final_fd']['median']:.2f} against {b['cross-attention-raw']['final_fd']['median']:.2f}, accuracy "
         f"{100 * raw['final_accuracy']['median']:.1f} against "
         f"{100 * b['cross-attention-raw']['final_accuracy']['median']:.1f} %",
         f"the cross-attention rerun {cross['cpu_seconds']:,.0f} s")
    effect_n, effect_raw = n["measured"]["class_effect"], raw["measured"]["class_effect"]
    catch = next(s for s in steps if effect_raw[s] >= effect_n[steps[0]])
    says("record", f"{effect_n[steps[0]]:.2f} at step {steps[0]} for the normalised context and "
                   f"{effect_raw[steps[0]]:.3f} for the raw one, which reaches {effect_raw[catch]:.2f} only at step "
                   f"{catch}", f"(RMS {raw['measured']['class_rms'][steps[0]]:.3f} at step {steps[0]}, "
                   f"{raw['measured']['class_rms'][last]:.3f} at {last})",
         f"({raw['measured']['class_attention'][steps[0]]:.2f} to {raw['measured']['class_attention'][last]:.2f})")
    assert effect_n[steps[0]] / effect_raw[steps[0]] > 3
    says("7c", "the class's effect starts several times smaller")
    assert abs(effect_raw[last] / effect_n[last] - 2 / 3) < 0.05
    says("7c", "two thirds of the normalised model's effect")
    says("record", "two thirds of the normalised model's class effect")

    # the scaling grid
    data = load(findings.RECORD_FILES["scaling"])
    scaling = findings.summarize_curves(data["runs"])
    s = {r["variant"]: r for r in scaling}
    fd = {v: r["final_fd"]["median"] for v, r in s.items()}
    acc = {v: r["final_accuracy"]["median"] for v, r in s.items()}
    end = max(r["max_steps"] for r in scaling)
    sizes, (big_patch, mid_patch, small_patch) = list(findings.SIZES), findings.PATCHES
    says("7c", f"three seeds, scored every {every} steps as in 7c.2", f"for {end} steps (its learning rate")
    says("record", f"patches 4, 2, 1; {end} steps")
    checks = findings.scaling_checks(scaling)
    assert checks["larger_model"] and all(findings.separated(s[f"{a}/{p}"]["final_fd"], s[f"{z}/{p}"]["final_fd"])
                                          for p in findings.PATCHES for a, z in zip(sizes, sizes[1:]))
    both("at every patch size the larger model ends with the lower FD, ranges apart")
    says("7c", "(" + "; ".join(", ".join(f"{size}/{p} {fd[f'{size}/{p}']:.2f}" for size in sizes)
                               for p in (big_patch, small_patch)) + ")")
    worst = {size: max(findings.PATCHES, key=lambda p: fd[f"{size}/{p}"]) for size in sizes}
    assert set(worst.values()) == {mid_patch} and all(
        acc[f"{size}/{mid_patch}"] == min(acc[f"{size}/{p}"] for p in findings.PATCHES) for size in sizes)
    both(f"patch {mid_patch} is the worst of the three at every size")
    lowest = min((f"{size}/{mid_patch}" for size in sizes), key=acc.get)
    assert acc[lowest] < 0.2  # ten classes: chance is 10 %
    says("7c", f"{lowest} draws the right digit {pct(acc[lowest])} % of the time, hardly above chance")
    says("record", f"({lowest} at {pct(acc[lowest])} % accuracy)")
    assert all(fd[f"{size}/{small_patch}"] < fd[f"{size}/{big_patch}"] for size in sizes)
    fewer = " and ".join(size for size in sizes if acc[f"{size}/{small_patch}"] < acc[f"{size}/{big_patch}"])
    says("7c", f"Patch {small_patch} ends with a lower FD than patch {big_patch} at every size, but with a lower class "
               f"accuracy at sizes {fewer}")
    says("record", f"patch {small_patch} ends with a lower FD than patch {big_patch} at every size but a lower "
                   f"accuracy at sizes {fewer}")
    rs = {st: findings.correlations(scaling, st)["pearson_log_gflops_log_fd"] for st in steps if st <= end}
    negative = [st for st, r in rs.items() if r < 0]
    assert negative == [st for st in rs if st >= negative[0]], "positive early, negative from then on"
    says("7c", f"$r = {rs[end]:.2f}$ between log Gflops and log FD at the last step, and positive before step "
               f"{negative[0]}")
    says("record", f"(r = {rs[end]:.2f} at {end} steps, and positive before step {negative[0]}")
    pairs = findings.trade_offs(scaling)
    assert pairs and not any(p["overlap_fd"] for p in pairs)
    closest = min(pairs, key=lambda p: p["gflops_ratio"])
    says("7c", "no pair of about equal Gflops lands together", f"({closest['a']} {fd[closest['a']]:.2f} against "
               f"{closest['b']} {fd[closest['b']]:.2f} at {closest['gflops_ratio']:.1f}x the Gflops)")
    says("record", "configurations of about equal Gflops from another size-patch mix do not land together")
    reach = {t: sorted(((cost, v) for v, cost in findings.compute_to(scaling, t).items() if cost is not None))
             for t in (1.0, 1.5)}
    (c1, best), (c2, second) = reach[1.0][:2]
    assert best == f"{sizes[-1]}/{big_patch}"  # the largest model with the largest patches
    says("7c", f"the largest model with the largest patches reaches FD 1.0 for the least training compute ({best}, "
               f"{c1:,.0f} Gflop, against {c2:,.0f} for {second})",
         f"For FD 1.0 the record gives {best} {c1:,.0f} Gflop, " + " and ".join(
             f"{v} {cost:,.0f}" for cost, v in reach[1.0][1:]) + f", the others not within {end} steps",
         "for FD 1.5, " + " comes before ".join(f"{v} ({cost:,.0f})" for cost, v in reach[1.5][:2]))
    says("record", f"reaches FD 1.0 for the least training compute ({c1:,.0f} Gflop against {c2:,.0f} for {second})",
         "Training compute to reach a median FD of 1.5: " + ", ".join(
             f"{v} {cost:,.0f}" + (" Gflop" if i == 0 else "") for i, (cost, v) in enumerate(reach[1.5]))
         + f", the others not within {end} steps; to reach 1.0: "
         + ", ".join(f"{v} {cost:,.0f}" for cost, v in reach[1.0]))
    a, z = f"{sizes[-1]}/{small_patch}", f"{sizes[-1]}/{big_patch}"
    assert fd[a] < fd[z] <= 1.05 * floor and acc[a] < acc[z]  # near the floor the two measures disagree
    says("7c", f"{a} against {z} ({fd[a]:.2f} against {fd[z]:.2f}, the floor {floor:.2f}) is such a case, and their "
               f"class accuracy ({pct(acc[a])} % against {pct(acc[z])} %) reverses the order")
    says("record", f"FD differences below about {floor:.1f} do not rank models")
    params = [r["params"] / 1e6 for r in scaling + blocks]
    says("7c", f"these are models of {min(params):.1f}-{max(params):.1f} M")
    says("record", f"Models of {min(params):.1f}-{max(params):.1f} M parameters")

    # the longer check: one seed, three times the steps
    long = {r["variant"]: r for r in findings.summarize_curves(load("paper-findings-scaling-long.json")["runs"])}
    assert {r["seeds"] for r in long.values()} == {1} and {r["max_steps"] for r in long.values()} == {3 * end}
    lfd = {v: r["final_fd"]["median"] for v, r in long.items()}
    d2, d3 = sizes[:2]
    assert lfd[f"{d3}/{mid_patch}"] <= lfd[f"{d3}/{big_patch}"]  # catches
    assert lfd[f"{d2}/{mid_patch}"] < 1.2 * lfd[f"{d2}/{big_patch}"]  # comes close
    says("7c", f"In a run three times longer (one seed) {d3}/{mid_patch} catches {d3}/{big_patch}, and "
               f"{d2}/{mid_patch} comes close to {d2}/{big_patch}")
    says("record", f"by {3 * end:,} steps ({lfd[f'{d3}/{mid_patch}']:.2f} both)",
         f"({lfd[f'{d2}/{mid_patch}']:.2f} against {lfd[f'{d2}/{big_patch}']:.2f}, both below the real floor)")
    assert round(lfd[f"{d3}/{mid_patch}"], 2) == round(lfd[f"{d3}/{big_patch}"], 2)
    assert max(lfd[f"{d2}/{mid_patch}"], lfd[f"{d2}/{big_patch}"]) < floor
    assert not missing, "figures the JSON does not give:\n" + "\n".join(missing)


def test_chapter_7c_and_the_record_state_the_counted_design_costs():
    """The design costs chapter 7c and paper-findings.md state in words are the FLOP counter's (design_table): at
    DiT-XL/2 and at the digits profile's model (16 tokens)."""
    from dit_book.records import prose
    from dit_core.measure.flops import design_table

    root = Path(__file__).resolve().parents[1]
    chapter = prose(root / "book" / "07c_paper_findings.ipynb")
    record = prose(root / "benchmarks" / "results" / "paper-findings.md")
    xl = {r["block"]: r["overhead"] for r in design_table("DiT-XL/2")}
    digits = {r["block"]: r for r in design_table("DiT-S/2", input_size=8, in_channels=1, depth=4, hidden_size=128,
                                                   num_heads=4, num_classes=10)}
    tokens = digits["adaln-zero"]["tokens"]
    assert f"Cross-attention costs {100 * xl['cross-attention']:.0f} % more than adaLN-Zero at DiT-XL/2" in chapter
    assert (f"In-context's two extra tokens add {100 * xl['in-context']:.1f} % to DiT-XL/2's Gflops but "
            f"{100 * digits['in-context']['overhead']:.0f} % to the digits model's, 2 tokens beside {tokens}"
            ) in chapter
    assert (f"cross-attention {100 * xl['cross-attention']:+.1f} % Gflops (the paper: \"roughly a 15% overhead\"), "
            f"in-context {100 * xl['in-context']:+.1f} %, adaLN {100 * xl['adaln']:+.2f} %; at the digits' {tokens} "
            f"tokens in-context costs {100 * digits['in-context']['overhead']:+.1f} % and cross-attention "
            f"{100 * digits['cross-attention']['overhead']:+.1f} %") in record
