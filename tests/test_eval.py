"""Evaluation: the Fréchet distance, FID plumbing with the Inception network, the digits metrics, dit-eval."""

import json

import numpy as np
import pytest
import torch

from dit_core.eval import digits, fid, inception, samples
from dit_core.eval.digits import load_real_digits
from dit_core.sample import save_npz, to_uint8


def test_frechet_distance_closed_forms():
    # 1-D Gaussians: (m1 - m2)^2 + (s1 - s2)^2
    assert fid.frechet_distance([1.0], [[4.0]], [3.0], [[9.0]]) == pytest.approx(4 + 1)
    # commuting (diagonal) covariances: |mu|^2 + sum (sqrt(a) - sqrt(b))^2
    a, b = np.diag([1.0, 4.0, 9.0]), np.diag([4.0, 4.0, 1.0])
    expected = 3.0 + (1 - 2) ** 2 + 0 + (3 - 1) ** 2
    assert fid.frechet_distance(np.ones(3), a, np.zeros(3), b) == pytest.approx(expected)


def test_eigh_and_sqrtm_agree_on_rank_deficient_covariances():
    pytest.importorskip("scipy")
    rng = np.random.default_rng(0)
    f1, f2 = rng.normal(size=(20, 32)), rng.normal(size=(25, 32)) * 1.3 + 0.2  # N < D: singular covariances
    ours = fid.frechet_distance_features(f1, f2)
    theirs = fid.frechet_distance_features(f1, f2, method="sqrtm")
    assert ours == pytest.approx(theirs, rel=1e-4)


def test_fid_of_a_set_with_itself_is_zero_and_grows_with_noise():
    from dit_core.eval.digits import classifier

    real, _ = load_real_digits("all")

    clf = classifier()
    ref = clf.features(real)
    assert fid.frechet_distance_features(ref, ref) == pytest.approx(0, abs=1e-8)
    g = torch.Generator().manual_seed(0)
    distances = []
    for sigma in (0.0, 0.1, 0.3, 0.6, 1.0):
        noisy = (real + sigma * torch.randn(real.shape, generator=g)).clamp(-1, 1)
        distances.append(fid.frechet_distance_features(clf.features(noisy), ref))
    assert distances[0] == pytest.approx(0, abs=1e-8)
    assert all(b > a for a, b in zip(distances, distances[1:])), distances


def test_digits_metrics_on_real_digits():
    images, labels = load_real_digits("val")
    m = digits.digits_metrics(to_uint8(images), labels.numpy())  # uint8 NHWC, as read from an npz
    assert m["class_accuracy"] == pytest.approx(m["classifier_val_accuracy"])
    assert m["class_accuracy"] > 0.95
    assert m["frechet_distance"] == pytest.approx(m["real_floor"], rel=1e-3)  # val against train: the floor
    noise = torch.rand(len(images), 1, 8, 8) * 2 - 1
    assert digits.digits_metrics(noise, labels)["frechet_distance"] > 10 * m["real_floor"]


@pytest.fixture(scope="module")
def inception_file(tmp_path_factory):
    """A random FID Inception saved like the pytorch-fid weights file (no download here). Its batch norms take
    the statistics of one random batch (otherwise the random network's activations die out to zero)."""
    torch.manual_seed(0)
    model = inception.InceptionV3()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = 1.0
    with torch.no_grad():
        model.train()(torch.rand(2, 3, 32, 32))
    path = tmp_path_factory.mktemp("inception") / inception.INCEPTION_FILE
    torch.save(model.state_dict(), path)
    return path


def test_inception_architecture_has_the_fid_network_size():
    # pytorch-fid's FIDInceptionA..E network with its 1008-way fc: 23,850,960 parameters
    assert sum(p.numel() for p in inception.InceptionV3().parameters()) == 23_850_960


def test_missing_inception_weights_say_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.delenv("DIT_INCEPTION", raising=False)
    with pytest.raises(FileNotFoundError, match="pt_inception-2015-12-05"):
        inception.load_inception(None)
    with pytest.raises(FileNotFoundError, match="curl -L"):
        inception.load_inception(tmp_path / "nope.pth")
    bad = tmp_path / "bad.pth"
    torch.save({"conv.weight": torch.zeros(1)}, bad)
    with pytest.raises(ValueError, match="not the FID Inception-v3 weights"):
        inception.load_inception(bad)


def test_fid_pipeline_end_to_end(tmp_path, inception_file):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, size=(4, 16, 16, 3), dtype=np.uint8)
    b = np.clip(a.astype(int) + rng.integers(-60, 60, size=a.shape), 0, 255).astype(np.uint8)
    np.savez(tmp_path / "a.npz", arr_0=a)
    model = inception.load_inception(inception_file)
    same = fid.fid(tmp_path / "a.npz", a, inception=model, save_reference_stats=tmp_path / "ref.npz")
    assert same["fid"] == pytest.approx(0, abs=1e-6) and same["num_samples"] == 4
    other = fid.fid(b, tmp_path / "ref.npz", inception=model)  # against saved statistics
    assert other["fid"] > 1e-3 and other["num_reference"] is None


def test_load_images_formats(tmp_path):
    from PIL import Image

    arr = np.zeros((3, 4, 4, 3), np.uint8)
    arr[1] = 255
    for i, im in enumerate(arr):
        Image.fromarray(im).save(tmp_path / f"{i}.png")
    images, labels = samples.load_images(tmp_path)
    assert images.shape == (3, 4, 4, 3) and labels is None and images[1].min() == 255
    np.save(tmp_path / "x.npy", arr.astype(np.float32))
    with pytest.raises(ValueError, match="uint8"):
        samples.load_images(tmp_path / "x.npy")


def test_dit_eval_cli(tmp_path, capsys, monkeypatch):
    from dit_core.cli.eval import main

    images, labels = load_real_digits("val")
    save_npz(tmp_path / "real.npz", images, labels)
    assert main([str(tmp_path / "real.npz"), "--digits", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["class_accuracy"] > 0.95 and result["num_samples"] == len(labels)
    monkeypatch.delenv("DIT_INCEPTION", raising=False)
    assert main([str(tmp_path / "real.npz"), str(tmp_path / "real.npz")]) == 2
    err = capsys.readouterr().err
    assert "pt_inception" in err and "--digits" in err


def test_running_statistics_equal_those_of_all_features_at_once():
    rng = np.random.default_rng(1)
    f = rng.normal(size=(103, 16)) * rng.uniform(0.1, 3, 16) + rng.uniform(-2, 5, 16)
    running = fid.RunningStatistics()
    for part in (f[:1], f[1:40], f[40:41], f[41:]):
        running.add(part)
    mu, sigma = running.result()
    ref_mu, ref_sigma = fid.feature_statistics(f)
    assert running.n == 103 and np.allclose(mu, ref_mu, rtol=1e-12, atol=1e-12)
    assert np.allclose(sigma, ref_sigma, rtol=1e-10, atol=1e-12)


def test_npz_images_are_read_in_chunks_from_inside_the_file(tmp_path):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, size=(7, 5, 5, 3), dtype=np.uint8)
    np.savez(tmp_path / "s.npz", arr_0=arr)
    chunks = list(samples.iter_images(tmp_path / "s.npz", chunk=3))
    assert [len(c) for c in chunks] == [3, 3, 1] and np.array_equal(np.concatenate(chunks), arr)
    assert all(c.flags.writeable for c in chunks)
    assert np.array_equal(np.concatenate(list(samples.iter_images(tmp_path / "s.npz", chunk=2, limit=3))), arr[:3])
    assert samples.npz_image_shape(tmp_path / "s.npz") == (7, 5, 5, 3)
    np.savez(tmp_path / "f.npz", arr_0=arr.astype(np.float32))
    with pytest.raises(ValueError, match="uint8"):
        next(samples.iter_images(tmp_path / "f.npz"))


def test_reference_statistics_come_from_the_same_network_unless_asked(tmp_path, inception_file, capsys):
    """A reference like ADM's VIRTUAL_imagenet256_labeled.npz: images and mu/sigma that another network made."""
    from dit_core.cli.eval import main

    rng = np.random.default_rng(0)
    ref_images = rng.integers(0, 256, size=(4, 16, 16, 3), dtype=np.uint8)
    ours = np.clip(ref_images.astype(int) + rng.integers(-40, 40, size=ref_images.shape), 0, 255).astype(np.uint8)
    np.savez(tmp_path / "samples.npz", arr_0=ours)
    tf_mu, tf_sigma = rng.normal(size=64), np.eye(64) * 0.5  # "TensorFlow" statistics: not our network's
    np.savez(tmp_path / "adm.npz", arr_0=ref_images, mu=tf_mu, sigma=tf_sigma)
    np.savez(tmp_path / "stats_only.npz", mu=tf_mu, sigma=tf_sigma)
    # which statistics are used does not depend on the network: a fast stand-in with 64 features (the real
    # random-weight Inception, 2048 features, runs in the dit-eval part below)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(48, 64)).eval()
    mu_s, sigma_s, _ = fid.image_statistics(tmp_path / "samples.npz", model)
    mu_r, sigma_r, _ = fid.image_statistics(ref_images, model)

    auto = fid.fid(tmp_path / "samples.npz", tmp_path / "adm.npz", inception=model)  # default: from its images
    assert auto["fid"] == pytest.approx(fid.frechet_distance(mu_s, sigma_s, mu_r, sigma_r), rel=1e-9)
    assert auto["reference_statistics"] == "images" and auto["num_reference"] == 4
    assert len(auto["notes"]) == 1 and "were not used" in auto["notes"][0] and "TensorFlow" in auto["notes"][0]

    stored = fid.fid(tmp_path / "samples.npz", tmp_path / "adm.npz", inception=model, reference_stats="stored")
    assert stored["fid"] == pytest.approx(fid.frechet_distance(mu_s, sigma_s, tf_mu, tf_sigma))
    assert stored["reference_statistics"] == "stored" and "mixes the features of two Inception" in stored["notes"][0]
    only = fid.fid(tmp_path / "samples.npz", tmp_path / "stats_only.npz", inception=model)  # no images: stored
    assert only["fid"] == pytest.approx(stored["fid"]) and "TensorFlow" in only["notes"][0]
    with pytest.raises(ValueError, match="no images"):
        fid.fid(tmp_path / "samples.npz", tmp_path / "stats_only.npz", inception=model, reference_stats="images")

    # statistics we saved ourselves name their network: no note
    fid.save_statistics(tmp_path / "ours.npz", mu_r, sigma_r, 4)
    again = fid.fid(tmp_path / "samples.npz", tmp_path / "ours.npz", inception=model)
    assert again["fid"] == pytest.approx(auto["fid"], rel=1e-9) and not again["notes"]

    # dit-eval says it in plain words (two images a set keep the real network's CPU time short)
    np.savez(tmp_path / "samples.npz", arr_0=ours[:2])
    np.savez(tmp_path / "adm.npz", arr_0=ref_images[:2], mu=np.zeros(2048), sigma=np.eye(2048))
    assert main([str(tmp_path / "samples.npz"), str(tmp_path / "adm.npz"), "--inception", str(inception_file),
                 "--reference-stats", "stored"]) == 0
    out = capsys.readouterr().out
    assert "reference_statistics: stored" in out and "note:" in out and "mixes the features of two Inception" in out
