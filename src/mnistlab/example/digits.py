"""Digit images of any size, prepared the way MNIST's were: grey, white digit on black, the digit
scaled into a 20 x 20 box (aspect kept, anti-aliased) and placed in a 28 x 28 field so that its
centre of mass sits at the centre (LeCun et al.). Dark-on-light images (a scan, a drawing) are
inverted first. MNIST's own test digits, written out 2 or 3 times larger (either way round) and
prepared here, come back pixel for pixel (all of the first 1,000): the whole image is scaled, so the
faint anti-aliased edge stays, and the centring offsets round as MNIST's did.
"""

import io
import warnings
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, UnidentifiedImageError

from mnistlab.runtime.run.failures import InputError

SUFFIXES = {".png", ".jpg", ".jpeg"}
BOX, FIELD = 20, 28  # the digit's box and the image, in pixels
SHAPE = (1, FIELD, FIELD)  # what load() and decode() give the network for one image: one channel
WIDE = {"I;16": 65535, "I;16B": 65535, "I;16L": 65535, "I": 65535}  # PIL's modes of 16-bit grey (PNG, TIFF): full scale
# A larger image is reduced by a whole factor as it is read, to a longer side of 256-511 pixels: at
# least 12 times the box, so the digit keeps its shape (MNIST's own digits, written at 2-3 times their
# size, are not reduced and come back pixel for pixel).
REDUCED_SIDE = 256


def find(input: Path) -> list[Path]:
    """The image files to classify: ``input`` itself, or the PNG/JPEG files under it, sorted."""
    if input.is_file():
        return [input]
    if not input.is_dir():
        raise InputError(f"input={input}: no such file or folder")
    files = sorted(p for p in input.rglob("*") if p.suffix.lower() in SUFFIXES and p.is_file())
    if not files:
        raise InputError(f"input={input} holds no PNG or JPEG files")
    return files


def load(path: Path, max_pixels: int) -> np.ndarray:
    """The image at ``path``, prepared: float32 (28, 28), 0 (background) to 255 (ink)."""
    return _read(path, str(path), max_pixels)


def decode(body: bytes, max_pixels: int) -> np.ndarray:
    """An image file's bytes (a request's body), prepared as ``load`` prepares a file, as the network
    takes one input: (1, 28, 28), one channel."""
    if not body:
        raise InputError("the input is empty (0 bytes)")
    return _read(io.BytesIO(body), "the input", max_pixels)[None]


def _read(source: Path | BinaryIO, name: str, max_pixels: int) -> np.ndarray:
    """The image in ``source`` (called ``name`` in errors), prepared.

    An image is data from anyone: its size is read from its header and refused above ``max_pixels``
    before anything is decoded (a 150 KB PNG can hold 144 million pixels: 2.8 GB and 10 s), and a
    large one is reduced while it is decoded (JPEG's draft mode) or right after, before it becomes
    floats; digits this large have no detail a 20 x 20 box keeps.
    """
    warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # PIL's own limit: ours is checked below
    try:
        with Image.open(source) as image:
            if (pixels := image.width * image.height) > max_pixels:
                raise InputError(f"{name} has {pixels:,} pixels, over max_pixels={max_pixels:,} (a config value)")
            factor = _reduction(image.size)
            image.draft("L", (image.width // factor, image.height // factor))  # JPEG: decoded at 1/2 to 1/8
            shown: Image.Image = image
            if image.mode in WIDE:  # 16-bit grey: scaled to 0..255, where convert("L") would clip at 255
                shown = Image.fromarray(np.asarray(image, dtype=np.float32) * (255 / WIDE[image.mode]), "F")
            elif image.mode in ("RGBA", "LA", "P"):  # transparency: onto white, as it would be shown
                shown = Image.alpha_composite(Image.new("RGBA", image.size, "white"), image.convert("RGBA"))
            grey = (shown if shown.mode == "F" else shown.convert("L")).reduce(_reduction(shown.size))
    except InputError:
        raise
    except UnidentifiedImageError:
        raise InputError(f"{name} is not an image PIL can read (PNG, JPEG)") from None
    except (OSError, Image.DecompressionBombError, ValueError) as err:  # cut short, corrupt
        raise InputError(f"{name} is not an image PIL can read (PNG, JPEG): {err}") from None
    return prepare(np.asarray(grey, dtype=np.float32))


def _reduction(size: tuple[int, int]) -> int:
    """The whole factor that brings the longer side down to no less than REDUCED_SIDE pixels."""
    return max(1, max(size) // REDUCED_SIDE)


def prepare(grey: np.ndarray) -> np.ndarray:
    border = np.concatenate([grey[0], grey[-1], grey[:, 0], grey[:, -1]])
    if np.median(border) > 127:  # a light background: a dark digit
        grey = 255 - grey
    if grey.max() <= 0:
        return np.zeros((FIELD, FIELD), np.float32)  # blank: nothing to centre
    rows, columns = np.nonzero(grey > 0.1 * grey.max())  # the digit's box, without faint specks
    scale = BOX / max(rows.max() - rows.min() + 1, columns.max() - columns.min() + 1)
    # The whole image scaled, not the box alone: the faint anti-aliased edge outside it stays.
    size = (max(1, round(grey.shape[1] * scale)), max(1, round(grey.shape[0] * scale)))
    small = np.asarray(Image.fromarray(grey.astype(np.float32)).resize(size, Image.Resampling.BOX), dtype=np.float32)
    y, x = np.mgrid[: small.shape[0], : small.shape[1]]
    mass = small.sum()
    shift = (round(FIELD / 2 - (y * small).sum() / mass), round(FIELD / 2 - (x * small).sum() / mass))
    field = np.zeros((FIELD, FIELD), np.float32)
    target = tuple(slice(max(0, d), min(FIELD, n + d)) for d, n in zip(shift, small.shape, strict=True))
    source = tuple(slice(t.start - d, t.stop - d) for t, d in zip(target, shift, strict=True))
    field[target] = small[source]
    return field
