"""dit_core.downloads: one function per artifact, a local-file route, verified, never half-written.

Offline: files are served from 127.0.0.1 by a small HTTP server (which can also cut a download short) or read
through file:// URLs; the published artifacts are replaced by small files with their own size and checksum.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import threading
from pathlib import Path

import pytest
import torch

from dit_core import downloads
from dit_core.downloads import DownloadError, fetch


class _Handler(http.server.BaseHTTPRequestHandler):
    files: dict = {}  # path -> (bytes, mode): mode "ok", "truncate" (announces more than it sends), "404"

    def do_GET(self):  # noqa: N802 - the http.server name
        data, mode = self.files.get(self.path, (b"", "404"))
        if mode == "404":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2] if mode == "truncate" else data)
        if mode == "truncate":
            self.wfile.flush()
            self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", _Handler.files
    httpd.shutdown()


def _artifact(data: bytes, url: str, **kw) -> downloads.Artifact:
    return downloads.Artifact(name="blob", url=url, filename="blob.bin", what="a test blob", size=len(data),
                              sha256=hashlib.sha256(data).hexdigest(), **kw)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_download_verifies_and_renames_into_place(server, tmp_path):
    base, files = server
    data = bytes(range(256)) * 5000
    files["/blob.bin"] = (data, "ok")
    art = _artifact(data, base + "/blob.bin")
    with pytest.raises(DownloadError, match="downloading was not asked for") as err:
        fetch(art, cache=tmp_path)  # never downloads unless asked
    assert str(tmp_path / "blob.bin") in str(err.value) and "curl -L -o blob.bin" in str(err.value)
    path = fetch(art, cache=tmp_path, download=True, progress=False)
    assert path == tmp_path / "blob.bin" and path.read_bytes() == data
    assert _leftovers(tmp_path) == ["blob.bin"]
    files["/blob.bin"] = (b"changed", "ok")
    assert fetch(art, cache=tmp_path, download=True) == path and path.read_bytes() == data  # the cache is used


def test_truncated_and_corrupt_downloads_leave_nothing(server, tmp_path):
    base, files = server
    data = b"x" * 300_000
    files["/cut.bin"] = (data, "truncate")
    art = _artifact(data, base + "/cut.bin")
    with pytest.raises(DownloadError, match="could not download blob.bin") as err:
        fetch(art, cache=tmp_path, download=True, progress=False, timeout=10)
    assert "300,000 bytes" in str(err.value) and str(tmp_path / "blob.bin") in str(err.value)
    assert _leftovers(tmp_path) == []
    corrupt = b"y" * len(data)  # the right size, the wrong bytes
    files["/corrupt.bin"] = (corrupt, "ok")
    with pytest.raises(DownloadError, match="sha256 differs") as err:
        fetch(dataclasses.replace(art, url=base + "/corrupt.bin"), cache=tmp_path, download=True, progress=False)
    assert art.sha256 in str(err.value) and _leftovers(tmp_path) == []
    with pytest.raises(DownloadError, match="HTTPError"):
        fetch(dataclasses.replace(art, url=base + "/missing.bin"), cache=tmp_path, download=True, progress=False)
    assert _leftovers(tmp_path) == []


def test_file_urls_local_files_and_bad_cached_copies(tmp_path):
    data = b"weights" * 1000
    src = tmp_path / "src" / "blob.bin"
    src.parent.mkdir()
    src.write_bytes(data)
    art = _artifact(data, src.as_uri())
    cache = tmp_path / "cache"
    assert fetch(art, cache=cache, download=True, progress=False).read_bytes() == data  # file:// works
    assert fetch(art, local=src.parent, cache=tmp_path / "other") == src  # a folder holding the file, used in place
    short = tmp_path / "short.bin"
    short.write_bytes(data[:-1])
    with pytest.raises(DownloadError, match="expected 7,000"):
        fetch(art, local=short)
    (cache / "blob.bin").write_bytes(b"z" * len(data))  # a damaged cached copy
    with pytest.raises(DownloadError, match="cached file is not usable"):
        fetch(art, cache=cache)
    assert fetch(art, cache=cache, download=True, progress=False).read_bytes() == data  # replaced when asked


def test_imagenette_archive_is_checked_against_the_published_size(tmp_path):
    from dit_core.data.imagenette import make_archive

    fake = make_archive(tmp_path / "imagenette2-320.tgz", 1, 1, short_side=24)
    with pytest.raises(DownloadError, match="expected 341,663,724") as err:
        downloads.imagenette_archive(archive=fake)
    assert downloads.IMAGENETTE.sha256 in str(err.value) and "--archive PATH" in str(err.value)
    assert downloads.imagenette_archive(archive=fake, checksum=False) == fake  # one you made: layout only
    (tmp_path / "junk.tgz").write_bytes(b"not a tar archive")
    with pytest.raises(DownloadError, match="does not load"):
        downloads.imagenette_archive(archive=tmp_path / "junk.tgz", checksum=False)
    with pytest.raises(DownloadError, match="could not download"):  # a download that fails leaves nothing
        downloads.imagenette_archive(download=True, cache=tmp_path / "c", url=(tmp_path / "nothing.tgz").as_uri(),
                                     progress=False)
    assert _leftovers(tmp_path / "c") == []


def test_dit_checkpoint_is_verified_by_loading(tmp_path):
    from dit_book.track import standins

    paths = standins(tmp_path / "s")
    assert downloads.dit_checkpoint(local=paths["official"]) == paths["official"]
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "DiT-XL-2-256x256.pt").write_bytes(paths["official"].read_bytes())
    with pytest.raises(DownloadError, match="not DiT-XL/2 at 256 px"):  # the cached copy must be the named model
        downloads.dit_checkpoint(cache=cache)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(paths["official"].read_bytes()[:5000])
    with pytest.raises(DownloadError, match="does not load") as err:
        downloads.dit_checkpoint(local=cut)
    assert "dl.fbaipublicfiles.com/DiT/models/DiT-XL-2-256x256.pt" in str(err.value)
    with pytest.raises(ValueError, match="unknown official checkpoint"):
        downloads.dit_checkpoint("DiT-XL-2-1024.pt")


def test_inception_weights_reuse_the_missing_weights_message(tmp_path, monkeypatch):
    from dit_core.eval.inception import INCEPTION_FILE, InceptionV3, load_inception

    monkeypatch.delenv("DIT_INCEPTION", raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(DownloadError, match="dit-eval ... --inception PATH"):
        downloads.inception_weights(cache=tmp_path / "cache")
    hub = tmp_path / "torch" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    torch.save(InceptionV3().state_dict(), hub / INCEPTION_FILE)  # where pytorch-fid's download puts it
    path = downloads.inception_weights(cache=tmp_path / "cache")
    assert path == hub / INCEPTION_FILE and isinstance(load_inception(path), InceptionV3)
    torch.save({"fc.weight": torch.zeros(2)}, tmp_path / "wrong.pth")
    with pytest.raises(DownloadError, match="is not the FID Inception-v3 weights"):
        downloads.inception_weights(local=tmp_path / "wrong.pth")


def test_vae_comes_from_a_local_folder_or_says_how_to_get_it(tmp_path, monkeypatch):
    from dit_core.vae import VAENotFoundError, random_vae

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    random_vae("tiny").save_pretrained(tmp_path / "vae")
    assert downloads.vae(tmp_path / "vae").config.latent_channels == 4
    with pytest.raises(VAENotFoundError, match="huggingface-cli download"):
        downloads.vae("stabilityai/sd-vae-ft-ema", download=False)
