"""The figures drawn by dit_book.figures show the model they are given (chapter 03's Figure 3)."""

from __future__ import annotations

import io

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from dit_core import DiT  # noqa: E402
from dit_book.figures import DiTShape, dit_figure  # noqa: E402
from dit_core.measure.flops import meta_model  # noqa: E402


def _texts(fig) -> str:
    return "\n".join(t.get_text() for ax in fig.axes for t in ax.texts + [ax.title])


def test_dit_xl2_figure_shows_its_sizes_and_renders():
    import matplotlib.pyplot as plt

    fig = dit_figure(meta_model("DiT-XL/2"))
    text = _texts(fig)
    for expected in ("32×32×4", "2×2 patches", "256 tokens × 1152", "28 ×", "16 heads", "1152 → 4608 → 1152",
                     "1152 → 2×2×8 per token", "1000 + null", "1152 → 6×1152", "variance $v$ (Σ)"):
        assert expected in text, f"{expected!r} missing from the figure's text:\n{text}"
    assert len(fig.axes) == 2 and sum(len(ax.patches) for ax in fig.axes) >= 25
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=40)
    assert buffer.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    plt.close(fig)


def test_figure_follows_the_model_it_is_given():
    import matplotlib.pyplot as plt

    tiny = DiT(input_size=8, patch_size=4, in_channels=1, hidden_size=64, depth=3, num_heads=2, num_classes=10,
               learn_sigma=False, class_dropout_prob=0.0)
    text = _texts(fig := dit_figure(tiny))
    for expected in ("8×8×1", "4×4 patches", "4 tokens × 64", "3 ×", "2 heads × 32", "64 → 4×4×1 per token",
                     "(10)"):
        assert expected in text, f"{expected!r} missing from the figure's text:\n{text}"
    assert "Σ" not in text and "null" not in text  # fixed variance, no label dropout
    plt.close(fig)
    assert DiTShape.of(tiny).tokens == 4 and DiTShape.of(tiny).out_channels == 1


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="needs a dit_core.models.DiT"):
        dit_figure(object())
    with pytest.raises(TypeError, match=r"unknown sizes \['depht'\]"):
        dit_figure(depht=3)
    with pytest.raises(ValueError, match="not a multiple of patch_size"):
        dit_figure(input_size=30, patch_size=4)
    with pytest.raises(ValueError, match="either a model or keyword sizes"):
        dit_figure(meta_model("DiT-S/8"), depth=2)
