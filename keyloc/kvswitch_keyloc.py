"""kvswitch's key-location header, for Python clients.

A datagram to one of the VIP's keyed ports (``vip.keyed_ports``) starts with twelve bytes:
the preamble ``kvl`` and the version 1, then the key's start and end (big-endian, 32 bits
each) as offsets into the payload that follows. kvswitch routes the datagram by those key
bytes with the pool's hash and ring, and removes the header before the server sees it.

    sock = KeyedSocket(("10.0.0.100", 5300))
    sock.send(b"GET user:42", 4, 11)
    reply = sock.recv(2048)

The format is described in docs/keyloc.md.
"""

import socket
import struct

LEN = 12
PREAMBLE = b"kvl\x01"
MAX_KEY = 250


class KeyError_(ValueError):
    """A key the switch would refuse: empty, too long, or not inside the payload."""


def header(start, end):
    """The twelve header bytes for a key at payload[start:end]."""
    return PREAMBLE + struct.pack(">II", start, end)


def attach(payload, start, end):
    """payload with the header for its key at payload[start:end] in front."""
    if not 0 <= start <= end <= len(payload):
        raise KeyError_(f"key {start}..{end} is not inside a payload of {len(payload)} bytes")
    if start == end:
        raise KeyError_("the key is empty")
    if end - start > MAX_KEY:
        raise KeyError_(f"the key is {end - start} bytes; at most {MAX_KEY}")
    return header(start, end) + bytes(payload)


def parse(datagram):
    """(payload, start, end) of a datagram with a header, or ValueError."""
    if len(datagram) < LEN:
        raise ValueError("shorter than the key-location header")
    if datagram[:4] != PREAMBLE:
        raise ValueError("no key-location preamble")
    start, end = struct.unpack(">II", datagram[4:LEN])
    payload = datagram[LEN:]
    attach(payload, start, end)  # the same checks as the switch's
    return payload, start, end


class KeyedSocket:
    """A UDP socket connected to a keyed port of kvswitch's VIP."""

    def __init__(self, vip, bind=("0.0.0.0", 0), timeout=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(bind)
        self.sock.settimeout(timeout)
        self.sock.connect(vip)

    def send(self, payload, start, end):
        """Sends payload, whose key is payload[start:end]; returns the payload bytes sent."""
        return self.sock.send(attach(payload, start, end)) - LEN

    def recv(self, size=65535):
        """One reply, as the server sent it."""
        return self.sock.recv(size)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
