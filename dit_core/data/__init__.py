"""Data for DiT: ImageFolder reading with the ADM crop and flips, the dataset check, the digits default, own folders.

- :mod:`dit_core.data.images`: :class:`ImageFolderDataset`, :func:`load_image`; :mod:`dit_core.data.crop`: the ADM
  :func:`center_crop_arr`;
- :mod:`dit_core.data.check`: :func:`check_dataset` and its report (``dit-data check ROOT``);
- :mod:`dit_core.data.digits`: :func:`export_digits` (``dit-data digits OUT``);
- :mod:`dit_core.data.imagenette`: :func:`prepare_imagenette` (``dit-data imagenette OUT``), ten ImageNet classes
  with their ImageNet-1k labels through a label map (:func:`read_label_map`);
- :mod:`dit_core.data.shapes` and :mod:`dit_core.data.bench`: made-up folders to measure the own-images path
  (``dit-data shapes``, ``dit-data bench``);
- :mod:`dit_core.data.objects`: where a file's object is, and the crop that keeps it (``crop: object``);
- :mod:`dit_core.data.probe`: what a folder says before training: the mirror test behind ``flip: auto``, the share
  of objects a centre crop would cut, the objects' size.

Latent-space training reads pre-extracted VAE latents instead: see :mod:`dit_core.latents`.
"""

from .check import ACTIONS, DatasetReport, Problem, check_dataset, format_report, plant_bad_files
from .digits import export_digits
from .images import (
    IMG_EXTENSIONS,
    LABEL_MAP,
    ImageFolderDataset,
    LabelMap,
    center_crop_arr,
    find_classes,
    load_image,
    present_labels,
    read_label_map,
    to_tensor,
    write_label_map,
)
from .imagenette import prepare_imagenette

__all__ = [
    "ACTIONS",
    "DatasetReport",
    "IMG_EXTENSIONS",
    "ImageFolderDataset",
    "LABEL_MAP",
    "LabelMap",
    "Problem",
    "center_crop_arr",
    "check_dataset",
    "export_digits",
    "find_classes",
    "format_report",
    "load_image",
    "plant_bad_files",
    "prepare_imagenette",
    "present_labels",
    "read_label_map",
    "to_tensor",
    "write_label_map",
]
