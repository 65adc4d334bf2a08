"""``import zcio.netfilterqueue as netfilterqueue``: the names of the ``netfilterqueue`` package.

``VERSION`` and ``__version__`` name the netfilterqueue release whose API this module provides
(1.1.0), as a program that checks them expects; zcio's own version is ``zcio.__version__``.
"""

from . import COPY_META, COPY_NONE, COPY_PACKET, PROTOCOLS, NetfilterQueue, Packet

#: The netfilterqueue release whose API this module provides.
__version__ = "1.1.0"
VERSION = (1, 1, 0)

__all__ = [
    "COPY_NONE",
    "COPY_META",
    "COPY_PACKET",
    "PROTOCOLS",
    "NetfilterQueue",
    "Packet",
    "VERSION",
    "__version__",
]
