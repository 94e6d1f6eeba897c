"""The ADM centre crop of DiT's data pipeline (ADM: Dhariwal & Nichol 2021, whose crop DiT's ``train.py`` uses).

Its own module so that the object crop (:mod:`dit_core.data.objects`) and the image folder
(:mod:`dit_core.data.images`) can both use it without importing each other.
"""

from __future__ import annotations

import numpy as np
from PIL import Image


def center_crop_arr(pil_image: Image.Image, image_size: int) -> Image.Image:
    """The ADM center crop used by DiT's data pipeline.

    1. While the short side is at least twice ``image_size``, halve the image with a BOX filter (an
       exact average of 2x2 blocks: cheap, and it reduces aliasing).
    2. Resize with BICUBIC so that the short side equals ``image_size`` (sizes rounded to the nearest
       pixel).
    3. Cut the central ``image_size`` x ``image_size`` square.
    """
    if image_size <= 0:
        raise ValueError(f"image_size must be a positive number of pixels, got {image_size}")
    while min(pil_image.size) >= 2 * image_size:
        half = (pil_image.size[0] // 2, pil_image.size[1] // 2)
        pil_image = pil_image.resize(half, resample=Image.BOX)
    factor = image_size / min(pil_image.size)
    new_size = (round(pil_image.size[0] * factor), round(pil_image.size[1] * factor))
    pil_image = pil_image.resize(new_size, resample=Image.BICUBIC)
    arr = np.asarray(pil_image)
    top = (arr.shape[0] - image_size) // 2
    left = (arr.shape[1] - image_size) // 2
    return Image.fromarray(arr[top : top + image_size, left : left + image_size])
