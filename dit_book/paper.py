"""The DiT paper's own numbers, as plain data, for chapter 7c to read beside the digits through the same code.

Source: W. Peebles and S. Xie, *Scalable Diffusion Models with Transformers*, ICCV 2023, arXiv:2212.09748 v2,
Table 4 ("Details of all DiT models", in the appendix). Each model there is trained at 256x256 on ImageNet for
400K steps of batch 256 at a learning rate of 1e-4; "FID-50K here is computed *without* classifier-free guidance"
and "Parameter and flop counts exclude the VAE model". Flops are the paper's Gflops: forward multiply-adds of one
image (:mod:`dit_core.measure.flops` counts the same and agrees to three figures).

Only what the table prints is here; every number was checked against the paper's text, and the rows that the
chapter does not use (DiT-XL/2 trained longer, and at 512 px) are left out. :data:`QUOTES` holds the sentences the
chapter quotes, verbatim. :func:`scaling_rows` and :func:`design_rows` put the table in the shape of
:func:`dit_book.findings.summarize_curves`'s rows (one "seed", one scored step, 400K), so that
:func:`~dit_book.findings.correlations`, :func:`~dit_book.findings.trade_offs`,
:func:`~dit_book.findings.ordering` and :func:`~dit_book.findings.compute_to` read the paper as they read the
digits.
"""

from __future__ import annotations

SOURCE = ("Peebles & Xie, Scalable Diffusion Models with Transformers, arXiv:2212.09748 v2, Table 4 "
          "(FID-50K without guidance at 400K steps, batch 256)")
STEPS = 400_000
BATCH_SIZE = 256

#: Table 4's twelve adaLN-Zero models: name -> (Gflops, parameters in millions, FID-50K at 400K steps).
SCALING = {
    "DiT-S/8": (0.36, 33, 153.60),
    "DiT-S/4": (1.41, 33, 100.41),
    "DiT-S/2": (6.06, 33, 68.40),
    "DiT-B/8": (1.42, 131, 122.74),
    "DiT-B/4": (5.56, 130, 68.38),
    "DiT-B/2": (23.01, 130, 43.47),
    "DiT-L/8": (5.01, 459, 118.87),
    "DiT-L/4": (19.70, 458, 45.64),
    "DiT-L/2": (80.71, 458, 23.33),
    "DiT-XL/8": (7.39, 676, 106.41),
    "DiT-XL/4": (29.05, 675, 43.01),
    "DiT-XL/2": (118.64, 675, 19.47),
}

#: Table 4's four block designs, all DiT-XL/2: design -> (Gflops, parameters in millions, FID-50K at 400K steps),
#: in the order of the paper's Fig. 5 legend.
DESIGNS = {
    "in-context": (119.37, 449, 35.24),
    "cross-attention": (137.62, 598, 26.14),
    "adaln": (118.56, 600, 25.21),
    "adaln-zero": (118.64, 675, 19.47),
}

#: The paper's words the chapter quotes (Sec. 3.2, Sec. 5 and the captions of Figs. 5, 8 and 9), verbatim: whole
#: sentences, or the part of one that the chapter quotes.
QUOTES = {
    "fig5": "adaLN-Zero outperforms cross-attention and in-context conditioning at all stages of training.",
    "half": "At 400K training iterations, the FID achieved with the adaLN-Zero model is nearly half that of the "
            "in-context model, demonstrating that the conditioning mechanism critically affects model quality.",
    "init": "Initialization is also important—adaLN-Zero, which initializes each DiT block as the identity "
            "function, significantly outperforms vanilla adaLN.",
    "cross_cost": "Cross-attention adds the most Gflops to the model, roughly a 15% overhead.",
    "cross_block": "We concatenate the embeddings of t and c into a length-two sequence, separate from the image "
                   "token sequence.",
    "scaling": "increasing model size and decreasing patch size yields considerably improved diffusion models",
    "similar": "different DiT configs obtain similar FID values when their total Gflops are similar (e.g., DiT-S/2 "
               "and DiT-B/4)",
    "correlation": "a strong negative correlation between model Gflops and FID-50K",
    "params": "The results of Figure 6 suggest that parameter counts do not uniquely determine the quality of a DiT "
              "model.",
    "compute": "small DiT models, even when trained longer, eventually become compute-inefficient relative to "
               "larger DiT models trained for fewer steps",
    "xl4": "For example, XL/4 is outperformed by XL/2 after roughly 10^10 Gflops.",
    "training_compute": "We estimate training compute as model Gflops · batch size · training steps · 3, where the "
                        "factor of 3 roughly approximates the backwards pass as being twice as compute-heavy as the "
                        "forward pass.",
    "sizes": "Following ViT, we use standard transformer configs that jointly scale N, d and attention heads.",
}

#: Table 1: depth N, width d and heads of the four configurations (S to B widens only: the same 12 blocks).
CONFIGS = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}


def _row(name: str, gflops: float, params_m: float, fid: float) -> dict:
    point = {"step": STEPS, "median": fid, "min": fid, "max": fid, "seeds": 1}
    missing = {"step": STEPS, "median": float("nan"), "min": float("nan"), "max": float("nan"), "seeds": 0}
    return {"variant": name, "seeds": 1, "params": params_m * 1e6, "gflops": gflops, "batch_size": BATCH_SIZE,
            "max_steps": STEPS, "fd": [point], "accuracy": [missing], "final_fd": point, "final_accuracy": missing,
            "train_gflop": 3.0 * gflops * BATCH_SIZE * STEPS, "source": SOURCE}


def scaling_rows() -> list[dict]:
    """Table 4's twelve models as rows of the digits' analysis (``fd`` holds FID-50K; no class accuracy)."""
    return [_row(name, *values) for name, values in SCALING.items()]


def design_rows() -> list[dict]:
    """Table 4's four DiT-XL/2 block designs as rows of the digits' analysis."""
    return [_row(name, *values) for name, values in DESIGNS.items()]
