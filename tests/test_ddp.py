"""DistributedDataParallel on the CPU: 2 processes (gloo) train the same model as 1 process with the same global
batch. The CLI runs under ``torchrun`` exactly as a multi-GPU user would start it."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from test_train import REPO, TINY_ARGS, child_env


def test_two_processes_equal_one_process(tmp_path):
    from dit_core.data import export_digits

    data = export_digits(tmp_path / "digits")
    common = ["--data-path", str(data), *TINY_ARGS, "--batch-size", "16", "--max-steps", "6", "--log-every", "2",
              "--class-dropout-prob", "0.5"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "dit_core.train"]
    two = subprocess.Popen([*torchrun, *common, "--out", str(tmp_path / "two")], env=child_env(), cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    one = subprocess.Popen([sys.executable, "-m", "dit_core.train", *common, "--out", str(tmp_path / "one")],
                           env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out_two, _ = two.communicate(timeout=300)
    out_one, _ = one.communicate(timeout=300)
    assert two.returncode == 0, out_two
    assert one.returncode == 0, out_one

    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert (s1["processes"], s2["processes"]) == (1, 2) and s1["steps"] == s2["steps"] == 6

    a = torch.load(tmp_path / "one" / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    b = torch.load(tmp_path / "two" / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert a["data"] == b["data"]  # the same images were seen
    # Not bit-identical: DDP averages per-process gradient means (sum over 8 images / 8, then over 2 ranks / 2)
    # where one process sums 16 images / 16, so float additions happen in another order (~1e-8 relative).
    for key in ("model", "ema"):
        for name, value in a[key].items():
            torch.testing.assert_close(b[key][name], value, rtol=0, atol=1e-6, msg=f"{key}.{name}")
    # the logged loss is the average over both processes, so the two logs agree too
    log = lambda run: [json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
    torch.testing.assert_close(torch.tensor(log("two")), torch.tensor(log("one")), rtol=1e-5, atol=1e-6)
    assert len(log("two")) == 3  # rank 0 alone writes the records (steps 2, 4, 6)
