"""Atomic writes under trouble: a full disk (simulated: ENOSPC from the file's writes, as a full file system
gives it) is a DiskFullError that names the file, the bytes it needed and what is intact, for a checkpoint, a
text file and a latent extraction; the folder is fsynced after the rename."""

from __future__ import annotations

import errno
import os
import stat

import numpy as np
import pytest
import torch
from PIL import Image

from dit_core import atomic
from dit_core.atomic import DiskFullError, atomic_write, atomic_write_text

from test_train import Blobs, final_state, tiny_config


class FullDisk:
    """Replaces ``atomic._fdopen``: the temporary file accepts ``room`` bytes, then fails with ENOSPC."""

    def __init__(self, room: int):
        self.room = room

    def __call__(self, fd, mode="r", *args, **kw):
        return LimitedFile(os.fdopen(fd, mode, *args, **kw), self)


class LimitedFile:
    def __init__(self, f, disk: FullDisk):
        self.f, self.disk = f, disk

    def write(self, data):
        size = len(data.encode()) if isinstance(data, str) else memoryview(data).nbytes
        if size > self.disk.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.disk.room -= size
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_a_full_disk_names_the_file_and_the_space_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "notes.txt"
    atomic_write_text(target, "old")
    monkeypatch.setattr(atomic, "_fdopen", FullDisk(room=10))
    with pytest.raises(DiskFullError) as info:
        atomic_write_text(target, "x" * 5000)
    err = info.value
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert err.path == target and err.needed == 5000
    assert str(target) in str(err) and "5.0 kB (5,000 bytes)" in str(err) and "free" in str(err)
    assert target.read_text() == "old"  # the old file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]  # and no temporary file is left


def test_torch_save_wraps_the_failed_write_and_the_chain_is_followed(tmp_path, monkeypatch):
    """torch.save reports a failed write as its own RuntimeError; the ENOSPC behind it is found."""
    monkeypatch.setattr(atomic, "_fdopen", FullDisk(room=1000))
    state = {"w": torch.zeros(100_000)}
    with pytest.raises(DiskFullError) as info:
        atomic_write(tmp_path / "big.pt", lambda f: torch.save(state, f), size_hint=400_000)
    assert info.value.needed == 400_000 and info.value.__cause__.errno == errno.ENOSPC
    assert not any(tmp_path.iterdir())


def test_other_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(ZeroDivisionError):
        atomic_write(tmp_path / "x", lambda f: 1 / 0)
    assert not any(tmp_path.iterdir())


def test_the_folder_is_fsynced_after_the_rename(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        return real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    atomic_write_text(tmp_path / "a.txt", "hello")
    assert synced == ["file", "folder"]


def test_a_full_disk_while_saving_a_checkpoint_says_what_is_intact_and_how_to_resume(tmp_path, monkeypatch):
    from dit_core.train import train
    from dit_core.train import state as state_module

    out = tmp_path / "run"
    real = state_module.atomic_write
    calls = []

    def second_save_fails(path, write, **kw):  # room for one checkpoint: the second one fills the disk
        calls.append(path.name)
        if path.name == "last.pt" and calls.count("last.pt") == 2:
            monkeypatch.setattr(atomic, "_fdopen", FullDisk(room=4096))
            try:
                return real(path, write, **kw)
            finally:
                monkeypatch.setattr(atomic, "_fdopen", os.fdopen)
        return real(path, write, **kw)

    monkeypatch.setattr(state_module, "atomic_write", second_save_fails)
    with pytest.raises(DiskFullError) as info:
        train(tiny_config(out, max_steps=4, ckpt_every=2), dataset=Blobs())
    text = str(info.value)
    last = out / "checkpoints" / "last.pt"
    assert f"writing {last} failed" in text
    assert "The file needs about" in text and "bytes)" in text and info.value.needed > 10_000
    assert f"The previous checkpoint {last} (step 2) is intact." in text
    assert f"dit-train --config {out / 'config.yaml'} --resume true" in text
    assert final_state(out)["step"] == 2  # the checkpoint of step 2 survived
    # with room again, the run continues from step 2
    monkeypatch.setattr(state_module, "atomic_write", real)
    summary = train(tiny_config(out, max_steps=4, ckpt_every=2, resume="true"), dataset=Blobs())
    assert summary["steps"] == 4 and summary["steps_this_run"] == 2


def test_dit_train_prints_the_disk_full_message_without_a_traceback(tmp_path, monkeypatch, capsys):
    from dit_core.cli.train import main
    from dit_core.train import loop

    def full(path, ckpt, saved, out):
        raise DiskFullError(path, 123_456_789, 1000, advice="advice here")

    monkeypatch.setattr(loop, "save_or_explain", full)
    data = tmp_path / "imgs"
    for c in ("a", "b"):
        (data / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((8, 8), 40 * i, dtype=np.uint8)).save(data / c / f"{i}.png")
    code = main(["--data-path", str(data), "--image-size", "8", "--channels", "1", "--depth", "1",
                 "--hidden-size", "32", "--num-heads", "2", "--patch-size", "2", "--batch-size", "4",
                 "--max-steps", "1", "--num-workers", "0", "--progress", "false", "--tensorboard", "false",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "dit-train: error: disk full: writing" in err and "123.5 MB" in err and "advice here" in err


def test_latent_extraction_on_a_full_disk_says_how_far_it_got(tmp_path, monkeypatch):
    from dit_core.latents import extract as extract_module
    from dit_core.latents import extract_latents

    from test_latents import tiny_vae

    images = tmp_path / "imgs"
    for c in ("a", "b"):
        (images / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((32, 32, 3), 30 * i, dtype=np.uint8)).save(images / c / f"{i}.png")
    kw = dict(vae=tiny_vae(), vae_name="tiny", image_size=32, batch_size=2, shard_size=4, num_workers=0,
              progress=False, device="cpu", precision="fp32")
    real = os.posix_fallocate if hasattr(os, "posix_fallocate") else None
    opened = []

    def fallocate(fd, offset, size):  # the disk fills when the second shard is opened
        opened.append(size)
        if len(opened) > 2:  # two files (mean, std) per shard
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if real is not None:
            real(fd, offset, size)

    monkeypatch.setattr(extract_module.os, "posix_fallocate", fallocate, raising=False)
    with pytest.raises(DiskFullError) as info:
        extract_latents(images, tmp_path / "lat", **kw)
    text = str(info.value)
    assert "mean-00001.npy.partial" in text and f"({opened[-1]:,} bytes)" in text
    assert "The 4 of 8 images extracted so far are kept" in text and "it resumes at image 4" in text
    monkeypatch.setattr(extract_module.os, "posix_fallocate", fallocate if real is None else real, raising=False)
    opened.clear()
    result = extract_latents(images, tmp_path / "lat", **kw)
    assert result["complete"] and result["num_valid"] == 8
