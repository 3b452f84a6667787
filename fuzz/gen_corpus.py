#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets: real-looking frames, requests and replies.

The topology is the one of fuzz_targets/switch_process.rs: a client 10.0.0.1 (02:..:01), the
VIP 10.0.0.100 (02:..:64) on memcached's port 11211 with the split agent on 11311, and servers
10.0.0.11-13 (02:..:0b-0d). Every frame has correct IPv4 and UDP checksums unless its name says
otherwise. Run from anywhere; it rewrites fuzz/corpus/<target>/ with deterministic file names.

    python3 fuzz/gen_corpus.py
"""

import os
import shutil
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

BROADCAST = bytes([0xFF] * 6)


def mac(last):
    return bytes([0x02, 0, 0, 0, 0, last])


def ip(*octets):
    return bytes(octets)


CLIENT = (mac(0x01), ip(10, 0, 0, 1))
CLIENT2 = (mac(0x02), ip(10, 0, 0, 2))
VIP = (mac(0x64), ip(10, 0, 0, 100))
SERVERS = [(mac(0x0B), ip(10, 0, 0, 11)), (mac(0x0C), ip(10, 0, 0, 12)), (mac(0x0D), ip(10, 0, 0, 13))]
MC_PORT = 11211
AGENT_PORT = 11311
CLIENT_PORT = 40000


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def eth(dst, src, ethertype, payload):
    return dst + src + struct.pack("!H", ethertype) + payload


def ipv4(src, dst, proto, payload, ttl=64, flags_frag=0x4000, options=b"", ident=0x1234):
    ihl = 5 + len(options) // 4
    total = ihl * 4 + len(payload)
    hdr = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, total, ident, flags_frag, ttl, proto, 0, src, dst)
    hdr += options
    c = csum(hdr)
    hdr = hdr[:10] + struct.pack("!H", c) + hdr[12:]
    return hdr + payload


def udp(src_ip, dst_ip, sport, dport, payload, checksum=True):
    length = 8 + len(payload)
    hdr = struct.pack("!HHHH", sport, dport, length, 0)
    if checksum:
        pseudo = src_ip + dst_ip + struct.pack("!BBH", 0, 17, length)
        c = csum(pseudo + hdr + payload) or 0xFFFF
        hdr = hdr[:6] + struct.pack("!H", c)
    return hdr + payload


def mcudp(body, request_id=0xBEEF, seq=0, total=1):
    return struct.pack("!HHHH", request_id, seq, total, 0) + body


def udp_frame(src, dst, sport, dport, payload, dst_mac=None, checksum=True, **ip_kw):
    (smac, sip), (dmac, dip) = src, dst
    seg = udp(sip, dip, sport, dport, payload, checksum)
    return eth(dst_mac or dmac, smac, 0x0800, ipv4(sip, dip, 17, seg, **ip_kw))


def to_vip(body, **kw):
    return udp_frame(CLIENT, VIP, CLIENT_PORT, MC_PORT, mcudp(body), **kw)


def arp(op, sha, spa, tha, tpa):
    return struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, op, sha, spa, tha, tpa)


def binary(op, key=b"", extras=b"", value=b"", opaque=0xDEADBEEF):
    body = extras + key + value
    return struct.pack("!BBHBBHIIQ", 0x80, op, len(key), len(extras), 0, 0, len(body), opaque, 0) + body


def response(op, key=b"", extras=b"", value=b"", status=0, opaque=0xDEADBEEF):
    body = extras + key + value
    return struct.pack("!BBHBBHIIQ", 0x81, op, len(key), len(extras), 0, status, len(body), opaque, 0) + body


# ------------------------------------------------------------------------------------------
# memcached requests

REQUESTS = {
    "get": b"get key:1\r\n",
    "get_bare_newline": b"get key:1\n",
    "multiget": b"get " + b" ".join(b"key:%d" % i for i in range(10)) + b"\r\n",
    "gets_multi": b"gets key:1 key:2 key:3\r\n",
    "gat": b"gat 300 key:1 key:2\r\n",
    "gats": b"gats -1 key:4\r\n",
    "set": b"set key:1 0 0 5\r\nhello\r\n",
    "set_noreply": b"set key:2 42 3600 3 noreply\r\nabc\r\n",
    "set_binary_data": b"set blob 0 0 6\r\n\r\n\x00\xff\n\r\r\n",
    "add": b"add key:3 0 0 1\r\nx\r\n",
    "replace": b"replace key:3 1 0 2\r\nyz\r\n",
    "append": b"append key:3 0 0 1\r\n!\r\n",
    "prepend": b"prepend key:3 0 0 1\r\n>\r\n",
    "cas": b"cas key:1 0 0 5 12345\r\nworld\r\n",
    "delete": b"delete key:1\r\n",
    "delete_noreply": b"delete key:1 0 noreply\r\n",
    "incr": b"incr counter 1\r\n",
    "decr": b"decr counter 18446744073709551615 noreply\r\n",
    "touch": b"touch key:1 60\r\n",
    "mg": b"mg key:1 v f t\r\n",
    "mg_base64": b"mg a2V5OjE= b v\r\n",
    "mg_quiet_pipeline": b"mg key:1 v q\r\nmg key:2 v q\r\nmn\r\n",
    "ms": b"ms key:1 5 T60 F3\r\nhello\r\n",
    "md": b"md key:1 q\r\n",
    "ma": b"ma counter D5 N0\r\n",
    "mn": b"mn\r\n",
    "me": b"me key:1\r\n",
    "version": b"version\r\n",
    "stats": b"stats\r\n",
    "flush_all": b"flush_all 0 noreply\r\n",
    "verbosity": b"verbosity 1\r\n",
    "pipelined_gets": b"get key:1\r\nget key:1\r\n",
    "pipelined_mixed": b"set key:1 0 0 1\r\na\r\nget key:1\r\ndelete key:1\r\n",
    "bin_get": binary(0x00, b"key:1"),
    "bin_getk": binary(0x0C, b"key:1"),
    "bin_getkq_noop": binary(0x0D, b"key:1") + binary(0x0D, b"key:2") + binary(0x0A),
    "bin_set": binary(0x01, b"key:1", struct.pack("!II", 0, 3600), b"hello"),
    "bin_delete": binary(0x04, b"key:1"),
    "bin_incr": binary(0x05, b"counter", struct.pack("!QQI", 1, 0, 0)),
    "bin_touch": binary(0x1C, b"key:1", struct.pack("!I", 60)),
    "bin_version": binary(0x0B),
    "bin_stat": binary(0x10, b"items"),
    # Errors and limits.
    "unknown_command": b"bogus key:1\r\n",
    "key_too_long": b"get " + b"k" * 251 + b"\r\n",
    "key_max": b"get " + b"k" * 250 + b"\r\n",
    "bad_data_chunk": b"set key:1 0 0 3\r\nabcd\r\n",
    "bad_delta": b"incr counter -1\r\n",
    "bin_bad_args": binary(0x00, b"key:1", b"\0\0\0\0"),
    "bin_unknown_opcode": binary(0x50, b"key:1"),
}

# Prefixes that are still arriving.
TRUNCATED = {
    "trunc_get": REQUESTS["get"][:6],
    "trunc_set_data": REQUESTS["set"][:-4],
    "trunc_bin_header": REQUESTS["bin_getk"][:20],
    "trunc_bin_body": REQUESTS["bin_set"][:-2],
}

# ------------------------------------------------------------------------------------------
# Backend replies to retrievals

REPLIES = {
    "end": b"END\r\n",
    "one_item": b"VALUE key:1 0 5\r\nhello\r\nEND\r\n",
    "items_cas": b"VALUE key:1 0 5 101\r\nhello\r\nVALUE key:2 7 0 102\r\n\r\nEND\r\n",
    "item_crlf_in_data": b"VALUE blob 0 6\r\n\r\n\x00\xff\n\r\r\nEND\r\n",
    "three_items": b"".join(b"VALUE key:%d %d 3\r\nv%02d\r\n" % (i, i, i) for i in range(3)) + b"END\r\n",
    "server_error": b"SERVER_ERROR out of memory storing object\r\n",
    "client_error": b"CLIENT_ERROR bad command line format\r\n",
    "error": b"ERROR\r\n",
    "items_then_error": b"VALUE key:1 0 1\r\na\r\nSERVER_ERROR busy\r\n",
    "trailing_bytes": b"VALUE key:1 0 1\r\na\r\nEND\r\nVALUE",
    "trunc_value_line": b"VALUE key:1 0 5\r\nhel",
    "trunc_line": b"VALUE key:1 0",
    "bad_length": b"VALUE key:1 0 x\r\nhello\r\nEND\r\n",
    "bad_terminator": b"VALUE key:1 0 5\r\nhelloXXEND\r\n",
    "stored": b"STORED\r\n",
    "large_item": b"VALUE big 0 1500\r\n" + bytes(range(256)) * 5 + b"x" * 220 + b"\r\nEND\r\n",
    # Other replies the proxy frames, and stats it merges (as memcached 1.6.18 sends them).
    "mg_va": b"VA 4 f7 t-1 c4 s4 ksession:x O123\r\na\r\nb\r\n",
    "mg_hd": b"HD kmk\r\n",
    "ma_va": b"VA 2 t-1 c7\r\n11\r\n",
    "stats": b"STAT pid 24710\r\nSTAT uptime 6\r\nSTAT version 1.6.18\r\nSTAT rusage_user 0.010229\r\n"
    b"STAT accepting_conns 1\r\nSTAT curr_items 5\r\nSTAT items:1:age 7\r\nEND\r\n",
    "stats_detail_dump": b"PREFIX user get 3 hit 3 set 3 del 1\r\nPREFIX session get 1 hit 1 set 1 del 0\r\nEND\r\n",
    "stats_cachedump": b"ITEM counter [2 b; 0 s]\r\nITEM user:2 [5 b; 0 s]\r\nEND\r\n",
    "stats_reset": b"RESET\r\n",
    "stats_sizes_enable": b"STAT sizes_status enabled\r\n",
    "bin_getk": response(0x0C, b"session:x", b"\x00\x00\x00\x07", b"a\r\nb"),
    "bin_stat": response(0x10, b"pid", value=b"24710") + response(0x10, b"rusage_user", value=b"0.010680")
    + response(0x10, b"curr_items", value=b"5") + response(0x10),
    "bin_stat_not_found": response(0x10, value=b"Not found", status=1),
}


# ------------------------------------------------------------------------------------------
# Frames


def frames():
    out = {}
    for name, body in REQUESTS.items():
        out["vip_" + name] = to_vip(body)
    for name, body in TRUNCATED.items():
        out["vip_" + name] = to_vip(body)

    # The same requests seen with csum_ready set (first byte 0x06: port 0) and with lengths
    # normalised by the harness (first byte 0x0a: port 1).
    for name in ["get", "multiget", "set", "mg", "bin_getk", "gat"]:
        out["vip_csum_ready_" + name] = to_vip(REQUESTS[name], dst_mac=bytes([0x06, 0, 0, 0, 0, 0x64]))
        out["vip_normalise_" + name] = to_vip(REQUESTS[name], dst_mac=bytes([0x0A, 0, 0, 0, 0, 0x64]))
    out["vip_no_udp_checksum"] = to_vip(REQUESTS["get"], checksum=False)
    out["vip_second_client"] = udp_frame(CLIENT2, VIP, 40001, MC_PORT, mcudp(REQUESTS["multiget"]))

    # Frame-header and IP-level oddities addressed to the VIP.
    out["vip_multi_datagram"] = udp_frame(CLIENT, VIP, CLIENT_PORT, MC_PORT, mcudp(REQUESTS["get"], seq=1, total=2))
    out["vip_short_frame_header"] = udp_frame(CLIENT, VIP, CLIENT_PORT, MC_PORT, b"\0\x07\0\0")
    out["vip_ip_options"] = udp_frame(CLIENT, VIP, CLIENT_PORT, MC_PORT, mcudp(REQUESTS["get"]), options=b"\x01\x01\x01\x00")
    out["vip_fragment"] = udp_frame(CLIENT, VIP, CLIENT_PORT, MC_PORT, mcudp(REQUESTS["get"]), flags_frag=0x2000)
    out["vip_ttl1"] = udp_frame(CLIENT, VIP, CLIENT_PORT, MC_PORT, mcudp(REQUESTS["get"]), ttl=1)
    padded = to_vip(b"mn\r\n")
    out["vip_padded_min_frame"] = padded + bytes(max(0, 60 - len(padded)))
    good = to_vip(REQUESTS["get"])
    out["vip_truncated_frame"] = good[: len(good) - 6]
    out["vip_bad_ip_checksum"] = good[:24] + bytes([good[24] ^ 0xFF]) + good[25:]
    out["vip_bad_udp_checksum"] = good[:40] + bytes([good[40] ^ 0xFF]) + good[41:]
    out["vip_other_port"] = udp_frame(CLIENT, VIP, CLIENT_PORT, 11212, mcudp(REQUESTS["get"]))

    # Replies: from a server's memcached port to the client (l3 rewrite to the VIP), and to the
    # split agent port.
    for name in ["one_item", "end", "server_error", "items_cas"]:
        out["reply_to_client_" + name] = udp_frame(SERVERS[0], CLIENT, MC_PORT, CLIENT_PORT, mcudp(REPLIES[name]))
    for i, name in enumerate(["one_item", "end", "three_items", "server_error"]):
        payload = mcudp(REPLIES[name], request_id=i)
        out["reply_to_agent_%s" % name] = udp_frame(SERVERS[i % 3], VIP, MC_PORT, AGENT_PORT, payload)
    big = REPLIES["large_item"]
    out["reply_to_agent_piece0"] = udp_frame(SERVERS[1], VIP, MC_PORT, AGENT_PORT, mcudp(big[:1400], request_id=1, seq=0, total=2))
    out["reply_to_agent_piece1"] = udp_frame(SERVERS[1], VIP, MC_PORT, AGENT_PORT, mcudp(big[1400:], request_id=1, seq=1, total=2))

    # ARP.
    out["arp_who_has_vip"] = eth(BROADCAST, CLIENT[0], 0x0806, arp(1, CLIENT[0], CLIENT[1], bytes(6), VIP[1]))
    out["arp_who_has_server"] = eth(BROADCAST, CLIENT[0], 0x0806, arp(1, CLIENT[0], CLIENT[1], bytes(6), SERVERS[0][1]))
    out["arp_server_reply_to_vip"] = eth(VIP[0], SERVERS[1][0], 0x0806, arp(2, SERVERS[1][0], SERVERS[1][1], VIP[0], VIP[1]))
    out["arp_gratuitous"] = eth(BROADCAST, SERVERS[2][0], 0x0806, arp(1, SERVERS[2][0], SERVERS[2][1], bytes(6), SERVERS[2][1]))
    req = eth(BROADCAST, CLIENT[0], 0x0806, arp(1, CLIENT[0], CLIENT[1], bytes(6), VIP[1]))
    out["arp_padded"] = req + bytes(60 - len(req))
    out["arp_truncated"] = req[:30]
    out["arp_rarp_op"] = eth(BROADCAST, CLIENT[0], 0x0806, arp(3, CLIENT[0], CLIENT[1], bytes(6), VIP[1]))

    # Plain switching between hosts, and frames the switch does not look into.
    out["udp_client_to_server"] = udp_frame(CLIENT, SERVERS[0], CLIENT_PORT, MC_PORT, mcudp(REQUESTS["get"]))
    out["udp_server_to_client_other_port"] = udp_frame(SERVERS[0], CLIENT, 5000, CLIENT_PORT, b"hello")
    tcp = struct.pack("!HHIIBBHHH", CLIENT_PORT, MC_PORT, 1, 0, 0x50, 0x02, 65535, 0, 0)
    out["tcp_syn_to_server"] = eth(SERVERS[0][0], CLIENT[0], 0x0800, ipv4(CLIENT[1], SERVERS[0][1], 6, tcp))
    out["tcp_to_vip"] = eth(VIP[0], CLIENT[0], 0x0800, ipv4(CLIENT[1], VIP[1], 6, tcp))
    icmp = struct.pack("!BBHHH", 8, 0, 0, 1, 1) + b"ping"
    icmp = icmp[:2] + struct.pack("!H", csum(icmp)) + icmp[4:]
    out["icmp_echo_to_vip"] = eth(VIP[0], CLIENT[0], 0x0800, ipv4(CLIENT[1], VIP[1], 1, icmp))
    out["ipv6_multicast"] = eth(bytes([0x33, 0x33, 0, 0, 0, 1]), CLIENT[0], 0x86DD, bytes(40))
    out["vlan_tagged"] = eth(VIP[0], CLIENT[0], 0x8100, struct.pack("!HH", 10, 0x0800) + to_vip(REQUESTS["get"])[14:])
    out["eth_header_only"] = eth(BROADCAST, CLIENT[0], 0x0800, b"")
    out["runt"] = BROADCAST + CLIENT[0][:4]
    return out


def write(target, items):
    d = os.path.join(ROOT, target)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for name, data in sorted(items.items()):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


def main():
    all_frames = frames()
    write("switch_process", all_frames)
    write("wire_frames", all_frames)
    write("memcache_request", {**REQUESTS, **TRUNCATED})
    write("memcache_reply", REPLIES)
    # The proxy_differential target's first byte picks the protocol: 1 for binary, 0 for text.
    streams = {**REQUESTS, **TRUNCATED}
    write(
        "proxy_differential",
        {
            name: bytes([1 if data[:1] == b"\x80" else 0]) + data
            for name, data in streams.items()
        },
    )
    total = 0
    for target in sorted(os.listdir(ROOT)):
        files = os.listdir(os.path.join(ROOT, target))
        size = sum(os.path.getsize(os.path.join(ROOT, target, f)) for f in files)
        total += size
        print("%-18s %3d files %7d bytes" % (target, len(files), size))
    print("total %d bytes" % total)


if __name__ == "__main__":
    main()
