"""The declared torch floor is true: ``dit_core`` imports and trains with AdamW on a torch without
``torch.optim.Muon`` (PyTorch before 2.9), and asking for ``optimizer: muon`` there gives a clear message.

The older torch is simulated in a fresh interpreter by removing ``torch.optim.Muon`` before ``dit_core`` is
imported; the pyproject and the conda environment must declare the same floor.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

WITHOUT_MUON = textwrap.dedent("""
    import importlib, pkgutil, sys
    import torch

    if hasattr(torch.optim, "Muon"):  # a torch before 2.9 (an older torch runs this as it is)
        del torch.optim.Muon
    import dit_core

    failed = {}
    for mod in pkgutil.walk_packages(dit_core.__path__, "dit_core."):
        if mod.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(mod.name)
        except Exception as err:
            failed[mod.name] = f"{type(err).__name__}: {err}"
    print("FAILED", sorted(failed))
    print("MUON_IMPORT", failed.get("dit_core.train.muon"))

    from dit_core.train import ConfigError, make_config, train

    class Blobs(torch.utils.data.Dataset):
        num_classes, sample_shape, flip = 3, (1, 8, 8), False

        def __init__(self):
            self.x = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(0)).clamp(-1, 1)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], i % 3

    tiny = dict(model="DiT-S/2", depth=2, hidden_size=32, num_heads=2, image_size=8, channels=1, flip=False,
                batch_size=8, num_workers=0, tensorboard=False, progress=False, sample_at_end=False,
                log_every=1000, diffusion_steps=100, mixed_precision="fp32", max_steps=3, out=sys.argv[1])
    summary = train(make_config(None, tiny), dataset=Blobs())
    print("ADAMW_STEPS", summary["steps"], summary["final_loss"] == summary["final_loss"])
    try:
        train(make_config(None, dict(tiny, optimizer="muon", out=sys.argv[1] + "-muon")), dataset=Blobs())
    except ConfigError as err:
        print("MUON_TRAIN", err)
""")


def run_without_muon(tmp_path) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-c", WITHOUT_MUON, str(tmp_path / "run")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def line(out: str, tag: str) -> str:
    return next(row[len(tag) + 1:] for row in out.splitlines() if row.startswith(tag + " "))


def test_dit_core_imports_and_trains_adamw_without_torch_muon(tmp_path):
    out = run_without_muon(tmp_path)
    # every module but the one that builds on torch.optim.Muon imports
    assert line(out, "FAILED") == "['dit_core.train.muon']"
    assert "torch>=2.9" in line(out, "MUON_IMPORT") and "--optimizer adamw" in line(out, "MUON_IMPORT")
    # the trainer (whose optimizer module names Muon) trains with AdamW: 3 steps, a finite loss
    assert line(out, "ADAMW_STEPS") == "3 True"
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()
    # optimizer muon: a ConfigError that names the torch release it needs, before anything is built
    muon = line(out, "MUON_TRAIN")
    assert "optimizer muon needs torch>=2.9 (torch.optim.Muon)" in muon and "pip install" in muon
    assert not (tmp_path / "run-muon").exists()


def declared_floor(text: str) -> str:
    found = re.findall(r"torch>=([0-9.]+)", text)
    assert len(found) == 1, found
    return found[0]


def test_pyproject_and_conda_declare_the_same_torch_floor():
    pyproject = declared_floor((REPO / "pyproject.toml").read_text())
    conda = declared_floor((REPO / "environment.yml").read_text())
    assert pyproject == conda
    # Muon needs a newer torch than the floor: the trainer imports it only for optimizer muon
    assert version(pyproject) < (2, 9)


def version(text: str) -> tuple:
    return tuple(int(part) for part in text.split(".")[:2])


def test_the_floor_is_not_below_what_diffusers_asks_for():
    """diffusers (the VAE, DPM-Solver++, the diffusers export) names its own torch floor in its torch extra;
    the installed release's floor must not be above ours."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        wanted = [re.search(r"torch>=([0-9.]+)", r) for r in requires("diffusers") or [] if r.startswith("torch>=")]
    except PackageNotFoundError:
        pytest.skip("diffusers is not installed")
    ours = version(declared_floor((REPO / "pyproject.toml").read_text()))
    for match in filter(None, wanted):
        assert version(match.group(1)) <= ours, f"diffusers asks for torch>={match.group(1)}; pyproject says {ours}"
