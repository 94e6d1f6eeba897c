"""How good are the samples: FID for ImageNet-sized models, and honest numbers for the digits default.

- :mod:`.fid`: the Fréchet distance and FID between sample sets or against reference statistics;
- :mod:`.inception`: the FID Inception-v3 (weights from a local file) and its pool3 features;
- :mod:`.digits`: a classifier fitted to the real digits: class accuracy of samples, Fréchet distance in its
  score space (``python -m dit_core.eval.digits RUN``);
- :mod:`.samples`: reading sample sets (``.npz``, ``.npy``, image folders);
- :mod:`.classwise`: one path from samples per class to class accuracy and a Fréchet distance, for any judge;
  the judges of the CPU track's folders: :mod:`.shapes`, :mod:`.bench` (the test bench, with mirrored and cut
  objects), :mod:`.folder` (any folder, fitted on its own files);
- :mod:`.guidance`: the guidance chosen for a run's folder after training.

``dit-eval`` is the command line (:mod:`dit_core.cli.eval`).
"""
