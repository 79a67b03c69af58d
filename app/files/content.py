"""What an uploaded file is, judged from its bytes (never from the name or type the client
declared), and the thumbnail of an image.

Contract:
- :func:`sniff` names a file's content type from its first bytes; what it cannot name is
  ``application/octet-stream``.
- :func:`served_type` is the type a download is served with: the sniffed one when it is on a
  short list that no browser runs as a page or a script (images, PDF, audio, video,
  archives), ``application/octet-stream`` otherwise (HTML, SVG, XML, scripts, text).
- Only PNG, JPEG, GIF and WebP are images (shown inline): :func:`thumbnail` decodes them with
  Pillow (refusing more than ``max_pixels``: no decompression bombs) and re-encodes a WebP
  thumbnail, so what the page shows inline is always bytes Pillow wrote.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Final

import puremagic
from PIL import Image, ImageOps

OCTET_STREAM: Final = "application/octet-stream"
SNIFF_BYTES: Final = 8192
IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
_DOWNLOADABLE: Final = IMAGE_TYPES | frozenset(
    {
        "application/pdf", "application/zip", "application/gzip", "application/x-7z-compressed",
        "application/x-tar", "audio/mpeg", "audio/ogg", "audio/wav", "audio/x-wav", "audio/flac",
        "video/mp4", "video/webm", "video/quicktime", "video/ogg",
    }
)  # fmt: skip
THUMBNAIL_TYPE: Final = "image/webp"


def sniff(head: bytes) -> str:
    """The content type of a file that starts with ``head``."""
    if not head:
        return OCTET_STREAM
    try:
        mime = puremagic.from_string(head, mime=True)
    except (puremagic.PureError, ValueError):
        return OCTET_STREAM
    return mime.lower() if mime else OCTET_STREAM


def served_type(content_type: str) -> str:
    """The type a download of sniffed ``content_type`` is served with."""
    return content_type if content_type in _DOWNLOADABLE else OCTET_STREAM


@dataclass(frozen=True)
class Thumbnail:
    data: bytes  # WebP
    width: int  # of the original image
    height: int


class NotAnImage(Exception):
    """The bytes are not an image Pillow can decode within the limits."""


def thumbnail(data: bytes, box_px: int, max_pixels: int) -> Thumbnail:
    """A WebP thumbnail of image ``data`` that fits in ``box_px`` square (rotated as its EXIF
    says). CPU-bound: run it in a thread. Raises :class:`NotAnImage`."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format not in ("PNG", "JPEG", "GIF", "WEBP"):
                raise NotAnImage(f"not an image format shown inline: {image.format}")
            width, height = image.size
            if width * height > max_pixels:
                raise NotAnImage(f"{width}x{height} is more than {max_pixels} pixels")
            image.seek(0)
            upright = ImageOps.exif_transpose(image)
            upright.thumbnail((box_px, box_px))
            if upright.mode not in ("RGB", "RGBA"):
                upright = upright.convert("RGBA")
            out = io.BytesIO()
            upright.save(out, "WEBP", quality=80)
            return Thumbnail(out.getvalue(), width, height)
    except NotAnImage:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise NotAnImage(f"cannot decode the image: {exc}") from exc
