"""The bottom of splitedge: standard library only, imported by every other package.

The one error family (:class:`SplitEdgeError` and its narrow subclasses), the checker of
decoded JSON fields that names the offending field by its path (:mod:`splitedge.fields`),
the one way to replace a file atomically (:mod:`splitedge.files`), and the bundle
contract's words that the lower packages need too (:mod:`splitedge.words`:
the split words ``LOCAL`` and ``OFFLOAD``, the formats and the precisions). ``calibration``
and ``boards`` may import this and nothing else of the project (DESIGN.md, "Parts and where
they run").
"""

from splitedge.errors import SplitEdgeError
from splitedge.words import LOCAL, OFFLOAD

__all__ = ["LOCAL", "OFFLOAD", "SplitEdgeError"]
