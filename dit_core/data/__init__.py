"""Data for DiT: ImageFolder reading with the ADM crop and flips, the dataset check, the digits default.

- :mod:`dit_core.data.images`: :class:`ImageFolderDataset`, :func:`center_crop_arr`, :func:`load_image`;
- :mod:`dit_core.data.check`: :func:`check_dataset` and its report (``dit-data check ROOT``);
- :mod:`dit_core.data.digits`: :func:`export_digits` (``dit-data digits OUT``).

Latent-space training reads pre-extracted VAE latents instead: see :mod:`dit_core.latents`.
"""

from .check import ACTIONS, DatasetReport, Problem, check_dataset, format_report, plant_bad_files
from .digits import export_digits
from .images import (
    IMG_EXTENSIONS,
    ImageFolderDataset,
    center_crop_arr,
    find_classes,
    load_image,
    to_tensor,
)

__all__ = [
    "ACTIONS",
    "DatasetReport",
    "IMG_EXTENSIONS",
    "ImageFolderDataset",
    "Problem",
    "center_crop_arr",
    "check_dataset",
    "export_digits",
    "find_classes",
    "format_report",
    "load_image",
    "plant_bad_files",
    "to_tensor",
]
