"""``import zcio.netfilterqueue as netfilterqueue``: the names of the ``netfilterqueue`` package."""

from . import COPY_META, COPY_NONE, COPY_PACKET, PROTOCOLS, NetfilterQueue, Packet

__all__ = ["COPY_NONE", "COPY_META", "COPY_PACKET", "PROTOCOLS", "NetfilterQueue", "Packet"]
