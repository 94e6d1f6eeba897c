"""Downloads: each file the GPU track needs, fetched only when asked, verified, and never left half-written.

One function per artifact, each of which also takes a file you already have, so that offline use and the tests
run exactly the code a download runs:

* :func:`imagenette_archive`: ``imagenette2-320.tgz`` (Imagenette, 341,663,724 bytes, checked by its sha256);
* :func:`vae`: Stable Diffusion's VAE (``stabilityai/sd-vae-ft-ema``) from a local folder, the Hugging Face cache,
  or the hub when asked (:func:`dit_core.vae.load_vae`);
* :func:`dit_checkpoint`: the official ``DiT-XL-2-256x256.pt`` / ``DiT-XL-2-512x512.pt`` (sizes not published:
  a file is checked by loading it as an official-layout DiT state dict);
* :func:`inception_weights`: the FID Inception-v3 weights of pytorch-fid (checked by loading them into
  :class:`dit_core.eval.inception.InceptionV3`).

The rule for each: a ``local`` path given is checked and used where it is; else the file in the cache folder
(``$DIT_CACHE``, default ``~/.cache/dit-one-gpu``) is checked and used; else, only when ``download`` is true, the
file is fetched from its URL into a temporary file in the cache folder, checked, and renamed into place (the
temporary names start with ``.<name>.tmp-``, as :mod:`dit_core.atomic` writes them). A download that breaks off,
or a file whose size or checksum is wrong, leaves nothing behind, and every error says where to put the file by
hand, under which name, and how to check it. ``file://`` URLs work too (and ``url=`` points at a mirror).
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A file could not be fetched or did not verify; the message says how to provide it by hand."""


@dataclass(frozen=True)
class Artifact:
    """A file the book can fetch: where from, under which name, and how to know it is the right one."""

    name: str                    # what the user asks for
    url: str
    filename: str
    what: str                    # one line for messages
    size: int | None = None      # bytes, when published
    sha256: str | None = None    # of the whole file, when published
    check_note: str = ""         # how it is verified when there is no checksum

    def expectation(self) -> str:
        parts = []
        if self.size is not None:
            parts.append(f"{self.size:,} bytes")
        if self.sha256:
            parts.append(f"sha256 {self.sha256}")
        if self.check_note:
            parts.append(self.check_note)
        return "; ".join(parts) or "no published size or checksum"


IMAGENETTE = Artifact(
    name="imagenette2-320",
    url="https://s3.amazonaws.com/fast-ai-imageclas/imagenette2-320.tgz",
    filename="imagenette2-320.tgz",
    what="Imagenette, the 320 px release (10 ImageNet classes, 9,469 + 3,925 JPEGs; fast.ai)",
    size=341_663_724,
    # The whole file's sha256 as TensorFlow Datasets records it (checksums.tsv). fast.ai's own md5 covers only the
    # first MiB of the file, so it is not used here.
    sha256="569b4497c98db6dd29f335d1f109cf315fe127053cedf69010d047f0188e158c",
)

DIT_CHECKPOINTS = {
    name: Artifact(
        name=name,
        url=f"https://dl.fbaipublicfiles.com/DiT/models/{name}",
        filename=name,
        what=f"the official DiT-XL/2 weights at {size} px (Peebles & Xie; CC-BY-NC)",
        check_note=("no published size or checksum (about 2.7 GB: 675 M fp32 parameters, an estimate); checked by "
                    f"loading it as an official DiT-XL/2 state dict for {size} px"),
    )
    for name, size in (("DiT-XL-2-256x256.pt", 256), ("DiT-XL-2-512x512.pt", 512))
}


def _inception_artifact() -> Artifact:
    from .eval.inception import INCEPTION_FILE, INCEPTION_URL

    return Artifact(name="inception", url=INCEPTION_URL, filename=INCEPTION_FILE,
                    what="the FID Inception-v3 weights ported by pytorch-fid (Apache-2.0)",
                    check_note="no published size or checksum (about 91 MB); checked by loading it as the FID Inception-v3")


def cache_dir(cache: str | os.PathLike | None = None) -> Path:
    """Where downloads go: ``cache`` if given, else ``$DIT_CACHE``, else ``~/.cache/dit-one-gpu``."""
    return Path(cache or os.environ.get("DIT_CACHE") or "~/.cache/dit-one-gpu").expanduser()


# ----------------------------------------------------------------------------------------------------------
# Verifying, downloading, placing
# ----------------------------------------------------------------------------------------------------------


def sha256_of(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def problem_with(path: Path, artifact: Artifact, check: Callable[[Path], None] | None = None,
                 checksum: bool = True) -> str | None:
    """Why ``path`` is not ``artifact`` (wrong size, wrong sha256, fails ``check``), or None when it is."""
    if not path.is_file():
        return f"{path} is not a file"
    size = path.stat().st_size
    if checksum and artifact.size is not None and size != artifact.size:
        return f"{path} has {size:,} bytes, expected {artifact.size:,} (an interrupted or different download)"
    if checksum and artifact.sha256 and sha256_of(path) != artifact.sha256:
        return f"{path} has {size:,} bytes but its sha256 differs from the published {artifact.sha256}"
    if check is not None:
        try:
            check(path)
        except Exception as err:  # noqa: BLE001 - any failure to load means "not this file"
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            return f"{path} does not load as {artifact.what} ({type(err).__name__}: {first[:300]})"
    return None


def manual_help(artifact: Artifact, target: Path, flag: str | None = None,
                lead: str = "To provide it by hand") -> str:
    """How to put the file in place by hand: where, under which name, how to check it."""
    lines = [
        f"{lead}: on a machine with internet run",
        f"    curl -L -o {artifact.filename} {artifact.url}",
        f"check it ({artifact.expectation()}" + (", e.g. `sha256sum " + artifact.filename + "`)" if artifact.sha256 else ")"),
        f"and put it at {target}" + (f", or pass its path with {flag}." if flag else "."),
    ]
    return "\n".join(lines)


def _download(url: str, tmp: Path, progress: bool, timeout: float) -> None:
    """Stream ``url`` into ``tmp``; raise when the server sends fewer bytes than it announced."""
    with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as f:
        total = response.headers.get("Content-Length")
        total = int(total) if total and total.isdigit() else None
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=tmp.name.split(".tmp-")[0][1:],
                       dynamic_ncols=True)
        got = 0
        try:
            while block := response.read(CHUNK):
                f.write(block)
                got += len(block)
                if bar is not None:
                    bar.update(len(block))
        finally:
            if bar is not None:
                bar.close()
        if total is not None and got != total:
            raise OSError(f"the connection closed after {got:,} of {total:,} bytes")
        f.flush()
        os.fsync(f.fileno())


def fetch(
    artifact: Artifact,
    *,
    local: str | os.PathLike | None = None,
    download: bool = False,
    cache: str | os.PathLike | None = None,
    url: str | None = None,
    check: Callable[[Path], None] | None = None,
    checksum: bool = True,
    flag: str | None = None,
    progress: bool = True,
    timeout: float = 60.0,
) -> Path:
    """The verified path of ``artifact``: ``local`` (a file, or a folder holding ``artifact.filename``), else the
    cached copy, else a download (only when ``download``), verified before it is renamed into the cache.

    ``check(path)`` raises when the file is not what it should be (e.g. it does not load); ``checksum=False``
    skips the size and sha256 comparison (for a file you made yourself). ``flag`` names the option that takes a
    local path, for the error messages.
    """
    target = cache_dir(cache) / artifact.filename
    if local is not None:
        path = Path(local).expanduser()
        if path.is_dir():
            path = path / artifact.filename
        if not path.exists():
            raise DownloadError(f"{artifact.filename} not found at {path}.\n" + manual_help(artifact, target, flag))
        problem = problem_with(path, artifact, check, checksum)
        if problem:
            raise DownloadError(f"{problem}.\n" + manual_help(artifact, target, flag))
        return path
    if target.exists():
        problem = problem_with(target, artifact, check, checksum)
        if problem is None:
            return target
        if not download:
            raise DownloadError(f"the cached file is not usable: {problem}. Delete it and download again, or replace "
                                "it.\n" + manual_help(artifact, target, flag))
    elif not download:
        raise DownloadError(
            f"{artifact.what} is not here ({target} does not exist) and downloading was not asked for.\n"
            "Ask for the download by name (download=True), or "
            + manual_help(artifact, target, flag, lead="provide it by hand")
        )
    source = url or artifact.url
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{artifact.filename}.tmp-", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            _download(source, tmp, progress, timeout)
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
            reason = getattr(err, "reason", None) or err
            raise DownloadError(f"could not download {artifact.filename} from {source} ({type(err).__name__}: "
                                f"{reason}); nothing was kept.\n" + manual_help(artifact, target, flag)) from None
        problem = problem_with(tmp, artifact, check, checksum)
        if problem:
            raise DownloadError(f"the download from {source} is not {artifact.what}: "
                                f"{problem.replace(str(tmp), 'the file')}; nothing was kept.\n"
                                + manual_help(artifact, target, flag))
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


# ----------------------------------------------------------------------------------------------------------
# The artifacts
# ----------------------------------------------------------------------------------------------------------
# Each function below spells out the same keywords of :func:`fetch` (a local file, download, cache, url,
# progress) on purpose: a reader's call documents itself, and a typo is a TypeError, not a lost argument.


def _check_tar(path: Path) -> None:
    import tarfile

    with tarfile.open(path, mode="r|*") as tar:
        first = next(iter(tar), None)
    if first is None:
        raise ValueError("empty archive")


def imagenette_archive(
    archive: str | os.PathLike | None = None,
    download: bool = False,
    cache: str | os.PathLike | None = None,
    url: str | None = None,
    checksum: bool = True,
    progress: bool = True,
) -> Path:
    """The verified ``imagenette2-320.tgz``: ``archive`` if given, else the cached one, else downloaded when
    ``download`` (341,663,724 bytes into the cache folder). ``checksum=False`` accepts an archive in the same
    layout that is not the published file (one made by :func:`dit_core.data.imagenette.make_archive`), checking
    only that it opens as a tar archive."""
    return fetch(IMAGENETTE, local=archive, download=download, cache=cache, url=url, checksum=checksum,
                 check=None if checksum else _check_tar, flag="--archive PATH", progress=progress)


def vae(name_or_path: str | os.PathLike | None = None, download: bool = False, device="cpu"):
    """Stable Diffusion's VAE: a local folder (``save_pretrained`` or ``huggingface-cli download --local-dir``), or a
    hub id found in the Hugging Face cache, or fetched from the hub only when ``download`` is true. Missing weights
    raise :class:`dit_core.vae.VAENotFoundError`, whose message says how to provide them."""
    from .vae import DEFAULT_VAE, load_vae

    return load_vae(name_or_path or DEFAULT_VAE, device=device, local_files_only=not download)


def _dit_check(image_size: int | None):
    def check(path: Path) -> None:
        import torch

        from .checkpoint import check_state_dict, extract_state_dict, infer_config
        from .models import DiT

        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        state, _ = extract_state_dict(ckpt)
        config = infer_config(state)
        with torch.device("meta"):
            model = DiT(**config)
        check_state_dict(model, state)
        if image_size is not None:
            want = dict(depth=28, hidden_size=1152, patch_size=2, input_size=image_size // 8, num_classes=1000)
            got = {k: config[k] for k in want}
            if got != want:
                raise ValueError(f"this is a DiT with {got}, not DiT-XL/2 at {image_size} px ({want})")

    return check


def dit_checkpoint(
    name: str = "DiT-XL-2-256x256.pt",
    local: str | os.PathLike | None = None,
    download: bool = False,
    cache: str | os.PathLike | None = None,
    url: str | None = None,
    progress: bool = True,
) -> Path:
    """The verified official checkpoint ``name`` (``DiT-XL-2-256x256.pt`` or ``DiT-XL-2-512x512.pt``): ``local`` if
    given, else the cached one, else downloaded when ``download``. No size or checksum is published, so the file is
    checked by loading it (memory-mapped, nothing materialised): an official-layout DiT state dict, and for a
    download or the cached copy, DiT-XL/2 at the size its name says. A ``local`` file of another size or depth
    (a test stand-in) is accepted if it loads."""
    if name not in DIT_CHECKPOINTS:
        raise ValueError(f"unknown official checkpoint {name!r}; choose one of {', '.join(DIT_CHECKPOINTS)}")
    size = int(name.split("-")[-1].split("x")[0])
    check = _dit_check(None if local is not None else size)
    return fetch(DIT_CHECKPOINTS[name], local=local, download=download, cache=cache, url=url, check=check,
                 flag="a local path (e.g. OFFICIAL_CKPT in chapter 07, dit-sample --ckpt PATH)", progress=progress)


def _inception_check(path: Path) -> None:
    from .eval.inception import load_inception

    load_inception(path)


def inception_weights(
    local: str | os.PathLike | None = None,
    download: bool = False,
    cache: str | os.PathLike | None = None,
    url: str | None = None,
    progress: bool = True,
) -> Path:
    """The verified FID Inception weights ``pt_inception-2015-12-05-6726825d.pth``: ``local`` (or ``$DIT_INCEPTION``)
    if given, else the cached one (also where pytorch-fid and torch.hub keep it, ``~/.cache/torch/hub/checkpoints``),
    else downloaded when ``download``. Checked by loading them (:func:`dit_core.eval.inception.load_inception`)."""
    artifact = _inception_artifact()
    local = local or os.environ.get("DIT_INCEPTION") or None
    if local is None and not (cache_dir(cache) / artifact.filename).exists():
        hub = Path(os.environ.get("TORCH_HOME", "~/.cache/torch")).expanduser() / "hub" / "checkpoints"
        if (hub / artifact.filename).is_file():
            local = hub / artifact.filename
    try:
        return fetch(artifact, local=local, download=download, cache=cache, url=url, check=_inception_check,
                     flag="--inception PATH (or DIT_INCEPTION=PATH)", progress=progress)
    except DownloadError as err:
        from .eval.inception import INCEPTION_HELP

        raise DownloadError(f"{err}\n{INCEPTION_HELP}") from None


def with_url(artifact: Artifact, url: str) -> Artifact:
    """The same artifact fetched from another ``url`` (a mirror, or a local server in tests)."""
    return dataclasses.replace(artifact, url=url)


__all__ = ["Artifact", "DIT_CHECKPOINTS", "DownloadError", "IMAGENETTE", "cache_dir", "dit_checkpoint", "fetch",
           "imagenette_archive", "inception_weights", "manual_help", "problem_with", "sha256_of", "vae", "with_url"]
