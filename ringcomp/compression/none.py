"""``none``: no compression; the exact algorithms run unchanged."""

from ringcomp.compression.base import Compressor, register


@register
class NoCompression(Compressor):
    """Stands for "no compressor": ``get_compressor`` turns it into None."""

    name = "none"
    aggregation = "exact"

    def nbytes(self, n: int) -> int:
        return 0

    def encode(self, x, key):
        raise TypeError("the 'none' compressor never encodes: the exact algorithms run")

    def decode(self, payload, n, out):
        raise TypeError("the 'none' compressor never decodes: the exact algorithms run")
