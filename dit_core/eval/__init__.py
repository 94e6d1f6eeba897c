"""How good are the samples: FID for ImageNet-sized models, and honest numbers for the digits default.

- :mod:`.fid`: the Fréchet distance and FID between sample sets or against reference statistics;
- :mod:`.inception`: the FID Inception-v3 (weights from a local file) and its pool3 features;
- :mod:`.digits`: a classifier fitted to the real digits: class accuracy of samples, Fréchet distance in its
  score space (``python -m dit_core.eval.digits RUN``);
- :mod:`.samples`: reading sample sets (``.npz``, ``.npy``, image folders).

``dit-eval`` is the command line (:mod:`dit_core.cli.eval`).
"""
