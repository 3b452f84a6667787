/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/* kvswitch's fast path: an XDP program on the switch's ports that routes single-key memcached
 * reads to the VIP by key and switches unicast IPv4 frames between stations the user-space
 * switch already knows, exactly as it would. Every frame it is not sure of (ARP, writes, split
 * gets, anything malformed, strangers, anything an operator's entry may touch) is passed to
 * the user-space switch unchanged: XDP_PASS is always a safe answer. It learns nothing and
 * decides nothing user space has not published in its maps. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "fastpath.h"


/* The settings every decision reads: VIP, mode, hash, the ring in use; written by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_config);
} fp_cfg SEC(".maps");

/* The newest pool version any path may route by: user space (the pool's fence) raises it
 * before the pool publishes a version, so a request to the VIP goes up from then until the
 * ring of that version is in use (fp_config.ring_version). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} fp_gate SEC(".maps");

/* Two copies of the ketama continuum, sorted by value; fp_config.ring says which is in use. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * FP_MAX_POINTS);
	__type(key, __u32);
	__type(value, struct fp_point);
} fp_ring SEC(".maps");

/* Requests routed on the arc of each point of each copy of the ring (the hashes up to and
 * including the point's value), for the controller's bounded loads; user space reads it
 * through a memory mapping. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 2 * FP_MAX_POINTS);
	__type(key, __u32);
	__type(value, __u64);
} fp_arc_hits SEC(".maps");

/* The pool's servers by index: address, MAC, port; valid only when user space could send there. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_MAX_SERVERS);
	__type(key, __u32);
	__type(value, struct fp_server);
} fp_servers SEC(".maps");

/* A server's address to its index, for its replies. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_SERVERS);
	__type(key, __u32);
	__type(value, __u32);
} fp_server_ips SEC(".maps");

/* The interface a frame arrives on to its switch port number. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_PORTS);
	__type(key, __u32);
	__type(value, __u32);
} fp_ports SEC(".maps");

/* A switch port to the interface frames leave by; 0 while the port may not be sent to directly
 * (an egress rate, or a port without the program). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_MAX_PORTS);
	__type(key, __u32);
	__type(value, __u32);
} fp_port_ifindex SEC(".maps");

/* Learned stations: destination MAC to switch port, as the user-space l2 table has them. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_STATIONS);
	__type(key, struct fp_mac);
	__type(value, __u32);
} fp_stations SEC(".maps");

/* Senders user space has switched a frame from: (MAC, IPv4 source) and their port. A frame from
 * anyone else goes up, so learning and the source check see it first. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_HOSTS);
	__type(key, struct fp_host);
	__type(value, struct fp_host_seen);
} fp_hosts SEC(".maps");

/* The switch's own addresses (VIP, agent, local port): frames to them other than routed reads go up. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_OWN);
	__type(key, __u32);
	__type(value, __u32);
} fp_own SEC(".maps");

/* Per-server request and reply counts, added into the switch's own by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FP_MAX_SERVERS);
	__type(key, __u32);
	__type(value, struct fp_server_stats);
} fp_server_stats SEC(".maps");

/* What the program did with frames (FP_C_*). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FP_NUM_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} fp_counters SEC(".maps");

/* Reply bytes per client for the replies sent from here: the switch's rate and burst, in
 * buckets of the program's own (a client whose replies take both paths gets both). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FP_MAX_BUCKETS);
	__type(key, __u32);
	__type(value, struct fp_bucket);
} fp_buckets SEC(".maps");

/* The kernel cache: a copy of the user-space cache's answers to `get` of one key, by key hash,
 * filled and dropped only by user space, in the cache's own order (a key is dropped before
 * any write to it is forwarded). Not preallocated: a replaced or deleted entry is freed only
 * after every program that may hold it has finished, so an answer is never read torn. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, FP_MAX_CACHED);
	__type(key, __u32);
	__type(value, struct fp_cached);
} fp_cache SEC(".maps");

/* Each switch port's AF_XDP socket (with `switch.datapath = "af_xdp"`): where frames for the
 * user-space switch go instead of the kernel's stack. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, FP_MAX_PORTS);
	__type(key, __u32);
	__type(value, __u32);
} fp_xsks SEC(".maps");

/* The key being hashed, copied out of the frame, with room for MD5's padding. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_scratch);
} fp_scratch SEC(".maps");

/* The VIP's keyed ports (network order): datagrams to them carry the key-location header. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_KEYED_PORTS);
	__type(key, __u32);
	__type(value, __u32);
} fp_keyed SEC(".maps");

/* The switch port the last frame sent on left by: how tests see where a frame went. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} fp_last_port SEC(".maps");

/* Spliced legs by the addresses and ports their targets' segments carry: the leg's slot in
 * fp_legs. Written by user space when it first hands a leg over, removed when it lets it go. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_LEGS);
	__type(key, struct fp_leg_key);
	__type(value, __u32);
} fp_leg_slots SEC(".maps");

/* Spliced connections by their client's address and port (network order, as struct
 * fp_leg_key's source half): the client's home slot, whose client_slot names the slot of the
 * leg that holds the client's side. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_MAX_LEGS);
	__type(key, __u64);
	__type(value, __u32);
} fp_leg_clients SEC(".maps");

/* The legs themselves, shared with user space through a memory mapping (struct fp_leg). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, FP_MAX_LEGS);
	__type(key, __u32);
	__type(value, struct fp_leg);
} fp_legs SEC(".maps");

#define ETH_LEN 14
#define IP_LEN 20
#define UDP_LEN 8
#define MC_LEN 8
/* Where a memcached request starts: Ethernet, a 20-byte IPv4 header, UDP, the frame header. */
#define BODY_OFF (ETH_LEN + IP_LEN + UDP_LEN + MC_LEN)

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&fp_counters, &which);
	if (c)
		*c += 1;
}

/* Hands the frame, unchanged, to the user-space switch, counting why. */
static __always_inline int pass(__u32 why)
{
	count(FP_C_PASSED);
	count(why);
	return XDP_PASS;
}

static __always_inline __u32 fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum;
}

/* RFC 1624, eqn. 3: a checksum after a 32-bit field went from `from` to `to` (both network
 * order), as the user-space pipeline computes it, so a wrong checksum stays wrong. */
static __always_inline __u16 csum_replace(__u16 check, __u32 from, __u32 to)
{
	__u32 sum = (__u16)~bpf_ntohs(check);
	sum += (__u16)~bpf_ntohs(from & 0xffff) + (__u16)~bpf_ntohs(from >> 16);
	sum += bpf_ntohs(to & 0xffff) + bpf_ntohs(to >> 16);
	return bpf_htons((__u16)~fold(sum));
}

static __always_inline void set_ip(struct iphdr *ip, struct udphdr *udp, __u32 *field, __u32 to)
{
	__u32 from = *field;
	*field = to;
	ip->check = csum_replace(ip->check, from, to);
	if (udp->check) {
		__u16 c = csum_replace(udp->check, from, to);
		udp->check = c ? c : 0xffff;
	}
}

/* The 16-bit one's-complement sum of the 20-byte IPv4 header at `ip`, complemented: 0 for
 * a header whose checksum is right, and the checksum to store when its field is 0. */
static __always_inline __u16 ip_checksum(struct iphdr *ip)
{
	__u16 *w = (__u16 *)ip;
	__u32 sum = 0;
#pragma unroll
	for (int i = 0; i < IP_LEN / 2; i++)
		sum += w[i];
	return ~fold(sum);
}

/* The UDP checksum of a datagram of `len` bytes (at most FP_MAX_CHECKED; a longer one is not
 * right), checked as the user-space switch checks it: 0 means none. */
/* Whether the `len` bytes of a UDP or TCP (`proto`) header and payload at `p`, after the
 * 20-byte IPv4 header `ip`, sum right with the pseudo-header (at most FP_MAX_CHECKED bytes;
 * a longer one is not right). */
static __always_inline int l4_sum_ok(struct iphdr *ip, __u8 *p, __u32 len, void *end, __u8 proto)
{
	if (len > FP_MAX_CHECKED)
		return 0;
	__u32 sum = (ip->saddr & 0xffff) + (ip->saddr >> 16) + (ip->daddr & 0xffff) +
		    (ip->daddr >> 16) + bpf_htons(proto) + bpf_htons(len);
	for (__u32 i = 0; i < FP_MAX_CHECKED / 2; i++) {
		if (2 * i + 1 >= len)
			break;
		if (p + 2 * i + 2 > (__u8 *)end)
			return 0;
		sum += *(__u16 *)(p + 2 * i);
		if (!(i & 0xff))
			sum = fold(sum); /* no carry lost, however long the datagram */
	}
	if (len & 1) {
		__u32 last = len - 1;
		/* Kept from the compiler, which may know the bound; the verifier needs to see it. */
		asm volatile("" : "+r"(last));
		if (last > FP_MAX_CHECKED)
			return 0;
		if (p + last + 1 > (__u8 *)end)
			return 0;
		sum += p[last]; /* the odd byte, padded with zero, little-endian */
	}
	return fold(sum) == 0xffff;
}

/* The UDP checksum of a datagram of `len` bytes, checked as the user-space switch checks it:
 * 0 means none. */
static __always_inline int udp_ok(struct iphdr *ip, struct udphdr *udp, __u32 len, void *end)
{
	if (!udp->check)
		return 1;
	return l4_sum_ok(ip, (__u8 *)udp, len, end, IPPROTO_UDP);
}

/* --- Key hashes, byte for byte nutcracker's (kv::HashFn). Bytes widen as x86's signed char. */

#define WIDEN(b) ((__u32)(__s32)(__s8)(b))

static __always_inline __u32 hash_fnv(const __u8 *k, __u32 len, __u32 kind)
{
	__u64 h64 = 0xcbf29ce484222325ULL;
	__u32 h = kind == FP_HASH_FNV1A_64 ? 0x84222325u : 0x811c9dc5u;
	for (__u32 i = 0; i < FP_MAX_KEY; i++) {
		if (i >= len)
			break;
		__u32 b = WIDEN(k[i]);
		switch (kind) {
		case FP_HASH_FNV1_64:
			h64 = (h64 * 0x100000001b3ULL) ^ (__u64)(__s64)(__s32)b;
			break;
		case FP_HASH_FNV1A_64:
			h = (h ^ b) * 0x000001b3u;
			break;
		case FP_HASH_FNV1_32:
			h = (h * 0x01000193u) ^ b;
			break;
		default:
			h = (h ^ b) * 0x01000193u;
		}
	}
	return kind == FP_HASH_FNV1_64 ? (__u32)h64 : h;
}

static __always_inline __u32 hash_one_at_a_time(const __u8 *k, __u32 len)
{
	__u32 h = 0;
	for (__u32 i = 0; i < FP_MAX_KEY; i++) {
		if (i >= len)
			break;
		h += WIDEN(k[i]);
		h += h << 10;
		h ^= h >> 6;
	}
	h += h << 3;
	h ^= h >> 11;
	return h + (h << 15);
}

#define ROTL(x, c) (((x) << (c)) | ((x) >> (32 - (c))))
#define MD5_STEP(f, a, b, c, d, k, s, t)                                                           \
	a += f(b, c, d) + m[k] + t;                                                                \
	a = b + ROTL(a, s)
#define MD5_F(x, y, z) ((z) ^ ((x) & ((y) ^ (z))))
#define MD5_G(x, y, z) ((y) ^ ((z) & ((x) ^ (y))))
#define MD5_H(x, y, z) ((x) ^ (y) ^ (z))
#define MD5_I(x, y, z) ((y) ^ ((x) | ~(z)))

static __noinline void md5_block(__u32 *st, const __u8 *blk)
{
	__u32 m[16];
#pragma unroll
	for (int i = 0; i < 16; i++)
		m[i] = blk[4 * i] | blk[4 * i + 1] << 8 | blk[4 * i + 2] << 16 |
		       (__u32)blk[4 * i + 3] << 24;
	__u32 a = st[0], b = st[1], c = st[2], d = st[3];
	MD5_STEP(MD5_F, a, b, c, d, 0, 7, 0xd76aa478); MD5_STEP(MD5_F, d, a, b, c, 1, 12, 0xe8c7b756);
	MD5_STEP(MD5_F, c, d, a, b, 2, 17, 0x242070db); MD5_STEP(MD5_F, b, c, d, a, 3, 22, 0xc1bdceee);
	MD5_STEP(MD5_F, a, b, c, d, 4, 7, 0xf57c0faf); MD5_STEP(MD5_F, d, a, b, c, 5, 12, 0x4787c62a);
	MD5_STEP(MD5_F, c, d, a, b, 6, 17, 0xa8304613); MD5_STEP(MD5_F, b, c, d, a, 7, 22, 0xfd469501);
	MD5_STEP(MD5_F, a, b, c, d, 8, 7, 0x698098d8); MD5_STEP(MD5_F, d, a, b, c, 9, 12, 0x8b44f7af);
	MD5_STEP(MD5_F, c, d, a, b, 10, 17, 0xffff5bb1); MD5_STEP(MD5_F, b, c, d, a, 11, 22, 0x895cd7be);
	MD5_STEP(MD5_F, a, b, c, d, 12, 7, 0x6b901122); MD5_STEP(MD5_F, d, a, b, c, 13, 12, 0xfd987193);
	MD5_STEP(MD5_F, c, d, a, b, 14, 17, 0xa679438e); MD5_STEP(MD5_F, b, c, d, a, 15, 22, 0x49b40821);
	MD5_STEP(MD5_G, a, b, c, d, 1, 5, 0xf61e2562); MD5_STEP(MD5_G, d, a, b, c, 6, 9, 0xc040b340);
	MD5_STEP(MD5_G, c, d, a, b, 11, 14, 0x265e5a51); MD5_STEP(MD5_G, b, c, d, a, 0, 20, 0xe9b6c7aa);
	MD5_STEP(MD5_G, a, b, c, d, 5, 5, 0xd62f105d); MD5_STEP(MD5_G, d, a, b, c, 10, 9, 0x02441453);
	MD5_STEP(MD5_G, c, d, a, b, 15, 14, 0xd8a1e681); MD5_STEP(MD5_G, b, c, d, a, 4, 20, 0xe7d3fbc8);
	MD5_STEP(MD5_G, a, b, c, d, 9, 5, 0x21e1cde6); MD5_STEP(MD5_G, d, a, b, c, 14, 9, 0xc33707d6);
	MD5_STEP(MD5_G, c, d, a, b, 3, 14, 0xf4d50d87); MD5_STEP(MD5_G, b, c, d, a, 8, 20, 0x455a14ed);
	MD5_STEP(MD5_G, a, b, c, d, 13, 5, 0xa9e3e905); MD5_STEP(MD5_G, d, a, b, c, 2, 9, 0xfcefa3f8);
	MD5_STEP(MD5_G, c, d, a, b, 7, 14, 0x676f02d9); MD5_STEP(MD5_G, b, c, d, a, 12, 20, 0x8d2a4c8a);
	MD5_STEP(MD5_H, a, b, c, d, 5, 4, 0xfffa3942); MD5_STEP(MD5_H, d, a, b, c, 8, 11, 0x8771f681);
	MD5_STEP(MD5_H, c, d, a, b, 11, 16, 0x6d9d6122); MD5_STEP(MD5_H, b, c, d, a, 14, 23, 0xfde5380c);
	MD5_STEP(MD5_H, a, b, c, d, 1, 4, 0xa4beea44); MD5_STEP(MD5_H, d, a, b, c, 4, 11, 0x4bdecfa9);
	MD5_STEP(MD5_H, c, d, a, b, 7, 16, 0xf6bb4b60); MD5_STEP(MD5_H, b, c, d, a, 10, 23, 0xbebfbc70);
	MD5_STEP(MD5_H, a, b, c, d, 13, 4, 0x289b7ec6); MD5_STEP(MD5_H, d, a, b, c, 0, 11, 0xeaa127fa);
	MD5_STEP(MD5_H, c, d, a, b, 3, 16, 0xd4ef3085); MD5_STEP(MD5_H, b, c, d, a, 6, 23, 0x04881d05);
	MD5_STEP(MD5_H, a, b, c, d, 9, 4, 0xd9d4d039); MD5_STEP(MD5_H, d, a, b, c, 12, 11, 0xe6db99e5);
	MD5_STEP(MD5_H, c, d, a, b, 15, 16, 0x1fa27cf8); MD5_STEP(MD5_H, b, c, d, a, 2, 23, 0xc4ac5665);
	MD5_STEP(MD5_I, a, b, c, d, 0, 6, 0xf4292244); MD5_STEP(MD5_I, d, a, b, c, 7, 10, 0x432aff97);
	MD5_STEP(MD5_I, c, d, a, b, 14, 15, 0xab9423a7); MD5_STEP(MD5_I, b, c, d, a, 5, 21, 0xfc93a039);
	MD5_STEP(MD5_I, a, b, c, d, 12, 6, 0x655b59c3); MD5_STEP(MD5_I, d, a, b, c, 3, 10, 0x8f0ccc92);
	MD5_STEP(MD5_I, c, d, a, b, 10, 15, 0xffeff47d); MD5_STEP(MD5_I, b, c, d, a, 1, 21, 0x85845dd1);
	MD5_STEP(MD5_I, a, b, c, d, 8, 6, 0x6fa87e4f); MD5_STEP(MD5_I, d, a, b, c, 15, 10, 0xfe2ce6e0);
	MD5_STEP(MD5_I, c, d, a, b, 6, 15, 0xa3014314); MD5_STEP(MD5_I, b, c, d, a, 13, 21, 0x4e0811a1);
	MD5_STEP(MD5_I, a, b, c, d, 4, 6, 0xf7537e82); MD5_STEP(MD5_I, d, a, b, c, 11, 10, 0xbd3af235);
	MD5_STEP(MD5_I, c, d, a, b, 2, 15, 0x2ad7d2bb); MD5_STEP(MD5_I, b, c, d, a, 9, 21, 0xeb86d391);
	st[0] += a;
	st[1] += b;
	st[2] += c;
	st[3] += d;
}

/* The first word of the key's MD5 digest, little-endian (nutcracker's md5 key hash). The key
 * is in s->buf[0..len]; the rest of the buffer is overwritten with MD5's padding. */
static __always_inline __u32 hash_md5(struct fp_scratch *s, __u32 len)
{
	if (len > FP_MAX_KEY)
		return 0;
	__u32 blocks = (len + 8) / 64 + 1;
	/* Zero the padding of the blocks used only: the bytes after the key up to a word
	 * boundary, then whole words. */
	__u32 aligned = (len + 7) & ~7u;
	__u64 *words = (__u64 *)s->buf;
	__u32 last = len / 8;
	barrier_var(last); /* so the mask below stays, on the register that indexes */
	if (len & 7) /* keep the key's bytes of its last word (little-endian: the low ones) */
		words[last & 31] &= (1ULL << (8 * (len & 7))) - 1;
	for (__u32 w = 0; w < FP_SCRATCH / 8; w++) {
		if (w >= blocks * 8)
			break;
		if (w < aligned / 8)
			continue;
		words[w] = 0;
	}
	barrier_var(len);
	if (len > FP_MAX_KEY)
		return 0;
	s->buf[len] = 0x80;
	__u64 bits = (__u64)len * 8;
	__u32 at = blocks * 64 - 8;
	barrier_var(at); /* so the check below stays, on the register the stores use */
	if (at > FP_SCRATCH - 8)
		return 0;
	__u8 *tail = s->buf + at;
	barrier_var(tail);
#pragma unroll
	for (int i = 0; i < 8; i++)
		tail[i] = bits >> (8 * i);
	__u32 st[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
	for (__u32 b = 0; b < FP_SCRATCH / 64; b++) {
		if (b >= blocks)
			break;
		md5_block(st, s->buf + b * 64);
	}
	return st[0];
}

/* A global function: the verifier checks it once for any length, not once per key length. */
__noinline __u32 fp_key_hash(__u32 len, __u32 kind)
{
	__u32 zero = 0;
	struct fp_scratch *s = bpf_map_lookup_elem(&fp_scratch, &zero);
	if (!s || len == 0 || len > FP_MAX_KEY)
		return 0;
	if (kind == FP_HASH_MD5)
		return hash_md5(s, len);
	if (kind == FP_HASH_ONE_AT_A_TIME)
		return hash_one_at_a_time(s->buf, len);
	return hash_fnv(s->buf, len, kind);
}

/* --- The request: one single-key read that the user-space parser would route to the key's
 * server. Anything else is 0 (go up). On success the key is in s->buf and its length returned. */

/* A text key at `at` (from the body's start): bytes 0x21..0x7e up to a space or CR, copied to
 * the scratch buffer. Returns its length, with bit 16 set when a space ends it, or 0. */
__noinline __u32 fp_text_key(struct xdp_md *ctx, __u32 at)
{
	void *end = (void *)(long)ctx->data_end;
	__u8 *p = (__u8 *)(long)ctx->data + BODY_OFF;
	__u32 zero = 0;
	struct fp_scratch *s = bpf_map_lookup_elem(&fp_scratch, &zero);
	if (!s)
		return 0;
	__u8 *q = p + (at & 0xf); /* callers pass 3 to 5; the mask bounds it for the verifier */
	for (__u32 i = 0; i <= FP_MAX_KEY; i++, q++) {
		barrier_var(q);
		if (q + 1 > (__u8 *)end)
			return 0;
		__u8 c = *q;
		if (c == ' ' || c == '\r')
			return i ? i | (c == ' ') << 16 : 0;
		if (c < 0x21 || c > 0x7e || i == FP_MAX_KEY)
			return 0;
		s->buf[i] = c;
	}
	return 0;
}

/* The flags of `mg <key>` the fast path takes (v k f s t c h l), one bit per letter from 'a',
 * each at most once: they change the reply, never where the request goes, and memcached
 * accepts every one alone. */
#define META_FLAGS                                                                                \
	(1u << ('v' - 'a') | 1u << ('k' - 'a') | 1u << ('f' - 'a') | 1u << ('s' - 'a') |           \
	 1u << ('t' - 'a') | 1u << ('c' - 'a') | 1u << ('h' - 'a') | 1u << ('l' - 'a'))

/* What follows a text key at `at`: for `mg`, flags (" v", " k", ...), then CR LF. Returns
 * where the request ends, or 0. The flags are checked without a branch per letter, so the
 * verifier follows one path per flag count, not one per combination. */
__noinline __u32 fp_text_tail(struct xdp_md *ctx, __u32 at, __u32 meta)
{
	void *end = (void *)(long)ctx->data_end;
	__u8 *body = (__u8 *)(long)ctx->data + BODY_OFF;
	at &= 0x1ff; /* at most 5 + FP_MAX_KEY from the caller; the mask bounds it for the verifier */
	__u32 seen = 0, bad = 0;
	__u8 *p = body + at;
	for (int f = 0; f < FP_MAX_META_FLAGS + 1; f++, at += 2, p += 2) {
		barrier_var(p);
		if (p + 2 > (__u8 *)end)
			return 0;
		__u8 c0 = p[0], c1 = p[1];
		if (c0 == '\r')
			return c1 == '\n' && !bad ? at + 2 : 0;
		if (!meta || c0 != ' ')
			return 0;
		__u32 letter = (__u32)c1 - 'a';
		__u32 bit = letter < 26 ? (1u << letter) & META_FLAGS : 0;
		bad |= (seen & bit) | (bit == 0);
		seen |= bit;
	}
	return 0;
}

/* The furthest a key may start from the frame's start, as a mask (a key-location header's
 * key starts at most FP_MAX_KEY_START into its payload). */
#define KEY_OFF_MASK 4095

/* Copies the `len`-byte key at `off` from the frame's start to the scratch buffer; returns
 * `len`, or 0 when the frame does not hold it. Global, as the others. */
__noinline __u32 fp_copy_key(struct xdp_md *ctx, __u32 off, __u32 len)
{
	void *end = (void *)(long)ctx->data_end;
	__u8 *data = (__u8 *)(long)ctx->data;
	__u32 zero = 0;
	struct fp_scratch *s = bpf_map_lookup_elem(&fp_scratch, &zero);
	if (!s || len == 0 || len > FP_MAX_KEY || off > KEY_OFF_MASK)
		return 0;
	barrier_var(off); /* so the mask below stays: it bounds the offset for the verifier */
	__u8 *q = data + (off & KEY_OFF_MASK);
	for (__u32 i = 0; i < FP_MAX_KEY; i++, q++) {
		if (i >= len)
			break;
		barrier_var(q);
		if (q + 1 > (__u8 *)end)
			return 0;
		s->buf[i] = *q;
	}
	return len;
}

/* The key of a binary GET, GETQ, GETK or GETKQ: no extras, a body that is exactly the key, no
 * cas. Copied to the scratch buffer; returns its length, or 0. */
__noinline __u32 fp_binary_key(struct xdp_md *ctx)
{
	void *end = (void *)(long)ctx->data_end;
	__u8 *body = (__u8 *)(long)ctx->data + BODY_OFF;
	if (body + 24 > (__u8 *)end)
		return 0;
	__u8 op = body[1];
	if (body[0] != 0x80 || (op != 0x00 && op != 0x09 && op != 0x0c && op != 0x0d))
		return 0;
	__u32 klen = (__u32)body[2] << 8 | body[3];
	if (klen == 0 || klen > FP_MAX_KEY || body[4] || body[5] || body[6] || body[7])
		return 0;
	__u32 blen = (__u32)body[8] << 24 | (__u32)body[9] << 16 | (__u32)body[10] << 8 | body[11];
	if (blen != klen)
		return 0;
	for (int i = 16; i < 24; i++)
		if (body[i])
			return 0;
	return fp_copy_key(ctx, BODY_OFF + 24, klen);
}

/* The request after the memcached frame header when it is one single-key read the user-space
 * parser routes to the key's server: its length in bytes above bit 16, what read it is
 * (FP_READ_*) in bits 8 to 15 and its key's length below (the key in the scratch buffer), or
 * 0 (go up). */
static __always_inline __u32 parse_read(struct xdp_md *ctx)
{
	void *end = (void *)(long)ctx->data_end;
	__u8 *body = (__u8 *)(long)ctx->data + BODY_OFF;
	if (body + 5 > (__u8 *)end)
		return 0;
	if (body[0] == 0x80) {
		__u32 klen = fp_binary_key(ctx);
		return klen ? (24 + klen) << 16 | FP_READ_BINARY << 8 | klen : 0;
	}
	__u32 at, meta = 0, kind = FP_READ_GET;
	if (body[0] == 'g' && body[1] == 'e' && body[2] == 't' && body[3] == ' ') {
		at = 4;
	} else if (body[0] == 'g' && body[1] == 'e' && body[2] == 't' && body[3] == 's' &&
		   body[4] == ' ') {
		at = 5;
		kind = FP_READ_GETS;
	} else if (body[0] == 'm' && body[1] == 'g' && body[2] == ' ') {
		at = 3;
		meta = 1;
		kind = FP_READ_MG;
	} else {
		return 0;
	}
	__u32 key = fp_text_key(ctx, at);
	__u32 klen = key & 0xffff;
	if (!klen || klen > FP_MAX_KEY || ((key >> 16) && !meta))
		return 0; /* a second key, or a trailing space: the parser's business */
	__u32 used = fp_text_tail(ctx, at + klen, meta);
	return used ? used << 16 | kind << 8 | klen : 0;
}

/* Whether the UDP checksum of the `len`-byte datagram is right (see udp_ok); global, as above. */
__noinline int fp_udp_ok(struct xdp_md *ctx, __u32 len)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + ETH_LEN;
	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end)
		return 0;
	return udp_ok(ip, udp, len, end);
}

/* The server owning `hash`: the first point at or after it, wrapping to the first; `point` is
 * that point's slot in fp_ring (and fp_arc_hits). */
static __always_inline int locate(struct fp_config *cfg, __u32 hash, __u32 *server, __u32 *point)
{
	__u32 n = cfg->ring & ~FP_RING_GEN_BIT;
	__u32 base = cfg->ring & FP_RING_GEN_BIT ? FP_MAX_POINTS : 0;
	if (n == 0 || n > FP_MAX_POINTS)
		return 0;
	__u32 lo = 0, hi = n;
	for (int i = 0; i < FP_RING_STEPS; i++) {
		if (lo >= hi)
			break;
		__u32 mid = lo + (hi - lo) / 2;
		__u32 k = base + mid;
		struct fp_point *p = bpf_map_lookup_elem(&fp_ring, &k);
		if (!p)
			return 0;
		if (p->value < hash)
			lo = mid + 1;
		else
			hi = mid;
	}
	__u32 k = base + (lo >= n ? 0 : lo);
	struct fp_point *p = bpf_map_lookup_elem(&fp_ring, &k);
	if (!p)
		return 0;
	*server = p->server;
	*point = k;
	return 1;
}

/* One request routed on the arc of the point in slot `point`. */
static __always_inline void count_arc(__u32 point)
{
	__u64 *hits = bpf_map_lookup_elem(&fp_arc_hits, &point);
	if (hits)
		__sync_fetch_and_add(hits, 1);
}

/* Whether frames may leave by `port` from here (see fp_port_ifindex). */
static __always_inline int sendable(__u32 port)
{
	__u32 *ifindex = bpf_map_lookup_elem(&fp_port_ifindex, &port);
	return ifindex && *ifindex;
}

/* Sends the frame out of `out_port`; the caller checked sendable(out_port). */
static __always_inline int send(struct xdp_md *ctx, __u32 in_port, __u32 out_port)
{
	__u32 zero = 0;
	/* TX needs what a redirect to the port needs (a veth's peer ready for XDP frames). */
	__u32 *ifindex = bpf_map_lookup_elem(&fp_port_ifindex, &out_port);
	if (!ifindex || !*ifindex)
		return XDP_ABORTED; /* callers check sendable() first; never reached */
	__u32 *last = bpf_map_lookup_elem(&fp_last_port, &zero);
	if (last)
		*last = out_port;
	/* Back out of the in-port by redirect too, not XDP_TX: a veth wakes its peer for frames
	 * sent with XDP_TX only when the peer runs XDP itself, so they would wait there for the
	 * next frame; a redirect always wakes it. */
	return bpf_redirect(*ifindex, 0);
}

/* Whether a reply of `bytes` may go to `client` now: a token bucket of cfg->reply_rate bytes a
 * second holding at most cfg->reply_burst, full for a client not seen before. */
static __always_inline int reply_allowed(struct fp_config *cfg, __u32 client, __u64 bytes)
{
	if (!cfg->reply_rate)
		return 1;
	__u64 now = bpf_ktime_get_ns();
	struct fp_bucket *b = bpf_map_lookup_elem(&fp_buckets, &client);
	if (!b) {
		struct fp_bucket fresh = {.tokens = cfg->reply_burst, .last_ns = now};
		bpf_map_update_elem(&fp_buckets, &client, &fresh, BPF_ANY);
		b = bpf_map_lookup_elem(&fp_buckets, &client);
		if (!b)
			return 1;
	}
	__u64 elapsed = now - b->last_ns;
	if (elapsed > 0) {
		/* At most a second's worth at a time: no overflow (user space keeps the rate under
		 * 2^34), and a second fills any burst worth having. */
		if (elapsed > 1000000000ULL)
			elapsed = 1000000000ULL;
		__u64 tokens = b->tokens + elapsed * cfg->reply_rate / 1000000000ULL;
		b->tokens = tokens > cfg->reply_burst ? cfg->reply_burst : tokens;
		b->last_ns = now;
	}
	if (b->tokens < bytes)
		return 0;
	b->tokens -= bytes;
	return 1;
}

static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return *(__u32 *)a == *(__u32 *)b && *(__u16 *)(a + 4) == *(__u16 *)(b + 4);
}

/* Whether the kernel cache's entry `c` holds the key in the scratch buffer (`klen` bytes):
 * two keys may share a hash. */
__noinline int fp_same_key(struct fp_cached *c, __u32 klen)
{
	__u32 zero = 0;
	struct fp_scratch *s = bpf_map_lookup_elem(&fp_scratch, &zero);
	if (!s || !c || c->key_len != klen || klen > FP_MAX_KEY)
		return 0;
	for (__u32 i = 0; i < FP_MAX_KEY; i++) {
		if (i >= klen)
			break;
		if (c->key[i] != s->buf[i])
			return 0;
	}
	return 1;
}

/* A `get` of one key that the kernel cache holds, under its lease: answered from the VIP out
 * of the port it came in on, in the bytes the user-space switch sends from its cache
 * (memcached's reply in one datagram; IPv4 with DF, TTL 64, id 0; a full UDP checksum). */
static __always_inline int answer_cached(struct xdp_md *ctx, struct fp_config *cfg, __u32 in_port,
					 __u32 hash, __u32 klen)
{
	/* One lookup: the key is compared, and the answer read, on the same entry. */
	struct fp_cached *c = bpf_map_lookup_elem(&fp_cache, &hash);
	if (!c || c->until_ns <= bpf_ktime_get_ns() || !fp_same_key(c, klen))
		return pass(FP_C_PASS_CACHE);
	__u32 rlen = c->reply_len;
	if (rlen == 0 || rlen > FP_MAX_REPLY)
		return pass(FP_C_PASS_CACHE);
	if (!sendable(in_port))
		return pass(FP_C_PASS_BLOCKED);
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip + 1);
	__u8 *mc = (__u8 *)(udp + 1);
	if (mc + MC_LEN > (__u8 *)end)
		return pass(FP_C_PASS_CACHE);
	__u8 client_mac[6];
	__builtin_memcpy(client_mac, eth->h_source, 6);
	__u32 client_ip = ip->saddr;
	__u16 client_port = udp->source;
	__u16 request_id = *(__u16 *)mc;
	__u32 frame_len = BODY_OFF + rlen;
	int delta = (int)frame_len - (int)(end - data);
	/* Room at the end, else at the front (the driver keeps XDP_PACKET_HEADROOM there): the
	 * whole frame is written anew below. A helper that fails leaves the frame as it was. */
	if (bpf_xdp_adjust_tail(ctx, delta) && (delta < 0 || bpf_xdp_adjust_head(ctx, -delta)))
		return pass(FP_C_PASS_NO_ROOM);
	/* From here the frame is the reply: it leaves or is dropped, never passed up. */
	if (!reply_allowed(cfg, client_ip, frame_len)) {
		count(FP_C_REPLY_LIMITED);
		return XDP_DROP;
	}
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	udp = (void *)(ip + 1);
	mc = (__u8 *)(udp + 1);
	if (mc + MC_LEN > (__u8 *)end)
		return XDP_DROP;
	rlen &= 0x7ff;
	if (rlen > FP_MAX_REPLY || bpf_xdp_store_bytes(ctx, BODY_OFF, c->reply, rlen))
		return XDP_DROP;
	__builtin_memcpy(eth->h_dest, client_mac, 6);
	__builtin_memcpy(eth->h_source, cfg->vip_mac, 6);
	eth->h_proto = bpf_htons(ETH_P_IP);
	__u16 udp_len = UDP_LEN + MC_LEN + rlen;
	ip->version = 4;
	ip->ihl = 5;
	ip->tos = 0;
	ip->tot_len = bpf_htons(IP_LEN + udp_len);
	ip->id = 0;
	ip->frag_off = bpf_htons(0x4000);
	ip->ttl = 64;
	ip->protocol = IPPROTO_UDP;
	ip->check = 0;
	ip->saddr = cfg->vip;
	ip->daddr = client_ip;
	ip->check = ip_checksum(ip);
	udp->source = cfg->vip_port;
	udp->dest = client_port;
	udp->len = bpf_htons(udp_len);
	udp->check = 0;
	*(__u16 *)mc = request_id;
	*(__u16 *)(mc + 2) = 0;
	*(__u16 *)(mc + 4) = bpf_htons(1);
	*(__u16 *)(mc + 6) = 0;
	__u32 sum = (cfg->vip & 0xffff) + (cfg->vip >> 16) + (client_ip & 0xffff) +
		    (client_ip >> 16) + bpf_htons(IPPROTO_UDP) + udp->len;
	sum += udp->source + udp->dest + udp->len;
	sum += request_id + bpf_htons(1);
	sum += (c->reply_sum & 0xffff) + (c->reply_sum >> 16);
	__u16 check = ~fold(sum);
	udp->check = check ? check : 0xffff;
	__u32 zero = 0;
	__u32 *last = bpf_map_lookup_elem(&fp_last_port, &zero);
	if (last)
		*last = in_port;
	count(FP_C_CACHE_HITS);
	/* See send(): redirected, not XDP_TX, so the client's end is woken at once. */
	__u32 *ifindex = bpf_map_lookup_elem(&fp_port_ifindex, &in_port);
	if (!ifindex || !*ifindex)
		return XDP_DROP; /* checked by sendable() above; never reached */
	return bpf_redirect(*ifindex, 0);
}

/* Whether the ring in use is of the newest pool version any path may route by. Read before
 * the ring selector: user space switches copies under the old stamp and stamps after. */
static __always_inline int ring_current(struct fp_config *cfg)
{
	__u32 zero = 0;
	__u64 *gate = bpf_map_lookup_elem(&fp_gate, &zero);
	return gate && *gate == cfg->ring_version;
}

/* Whether a request to the VIP has a sender the parser stage refuses (or is not to the VIP's
 * MAC): the switch counts and drops those. */
static __always_inline int refused_sender(struct fp_config *cfg, struct ethhdr *eth,
					  struct iphdr *ip, struct udphdr *udp)
{
	if (!mac_eq(eth->h_dest, cfg->vip_mac) || udp->source == 0)
		return 1;
	__u32 src = ip->saddr;
	__u8 first = src & 0xff;
	return src == 0 || src == 0xffffffff || src == cfg->vip_bcast || first == 127 ||
	       (first & 0xf0) == 0xe0 || bpf_map_lookup_elem(&fp_own, &src);
}

/* A request to the VIP's memcached port: routed to its key's server, or passed up. */
static __always_inline int route(struct xdp_md *ctx, struct fp_config *cfg, __u32 in_port,
				 struct ethhdr *eth, struct iphdr *ip, struct udphdr *udp)
{
	void *end = (void *)(long)ctx->data_end;
	/* While the pool changes, the switch routes (and answers from its cache) by its view:
	 * nothing here may follow an older ring than a write the switch sent on. */
	if (!ring_current(cfg))
		return pass(FP_C_PASS_POOL_CHANGE);
	if (refused_sender(cfg, eth, ip, udp))
		return pass(FP_C_PASS_REQUEST);
	__u32 ulen = bpf_ntohs(udp->len);
	__u8 *mc = (__u8 *)(udp + 1);
	if (mc + MC_LEN > (__u8 *)end)
		return pass(FP_C_PASS_REQUEST);
	/* One datagram: sequence 0, total 1 (the reserved field is memcached's business). */
	if (mc[2] || mc[3] || mc[4] || mc[5] != 1)
		return pass(FP_C_PASS_REQUEST);
	__u32 parsed = parse_read(ctx);
	__u32 used = parsed >> 16, kind = (parsed >> 8) & 0xff, klen = parsed & 0xff;
	if (!parsed || klen > FP_MAX_KEY || used + UDP_LEN + MC_LEN != ulen)
		return pass(FP_C_PASS_REQUEST);
	if (!fp_udp_ok(ctx, ulen))
		return pass(FP_C_PASS_CHECKSUM);
	__u32 hash = fp_key_hash(klen, cfg->hash);
	if (cfg->cache_only) {
		if (kind != FP_READ_GET)
			return pass(FP_C_PASS_CACHE);
		return answer_cached(ctx, cfg, in_port, hash, klen);
	}
	__u32 server, point;
	if (!locate(cfg, hash, &server, &point))
		return pass(FP_C_PASS_NO_SERVER);
	struct fp_server *srv = bpf_map_lookup_elem(&fp_servers, &server);
	if (!srv || !srv->valid)
		return pass(FP_C_PASS_NO_SERVER);
	if (!sendable(srv->port))
		return pass(FP_C_PASS_BLOCKED); /* before any rewrite: a passed frame is unchanged */
	__builtin_memcpy(eth->h_dest, srv->mac, 6);
	if (cfg->l3)
		set_ip(ip, udp, &ip->daddr, srv->ip);
	int verdict = send(ctx, in_port, srv->port);
	struct fp_server_stats *st = bpf_map_lookup_elem(&fp_server_stats, &server);
	if (st)
		st->requests += 1;
	count_arc(point);
	count(FP_C_ROUTED);
	return verdict;
}

/* Where a keyed datagram's payload starts: Ethernet, IPv4, UDP, the key-location header. */
#define KEYED_OFF (ETH_LEN + IP_LEN + UDP_LEN + FP_KEYLOC_LEN)
/* The headers a keyed datagram keeps: Ethernet, IPv4, UDP. */
#define KEPT_LEN (ETH_LEN + IP_LEN + UDP_LEN)

static __always_inline int keyed_port(__u16 port)
{
	__u32 k = port;
	return bpf_map_lookup_elem(&fp_keyed, &k) != 0;
}

/* A datagram to one of the VIP's keyed ports: routed to the server of the key its
 * key-location header points at, the header removed (lengths and checksums updated
 * incrementally, as the switch's strip_udp_payload does), or passed up unchanged. */
static __always_inline int route_keyed(struct xdp_md *ctx, struct fp_config *cfg, __u32 in_port)
{
	if (!ring_current(cfg))
		return pass(FP_C_PASS_POOL_CHANGE);
	if (cfg->cache_only)
		return pass(FP_C_PASS_CACHE);
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip + 1);
	__u8 *h = (__u8 *)(udp + 1);
	if (h + FP_KEYLOC_LEN > (__u8 *)end)
		return pass(FP_C_PASS_KEYED);
	if (refused_sender(cfg, eth, ip, udp))
		return pass(FP_C_PASS_REQUEST);
	__u32 ulen = bpf_ntohs(udp->len);
	if (ulen < UDP_LEN + FP_KEYLOC_LEN || h[0] != 'k' || h[1] != 'v' || h[2] != 'l' || h[3] != 1)
		return pass(FP_C_PASS_KEYED);
	__u32 start = (__u32)h[4] << 24 | (__u32)h[5] << 16 | (__u32)h[6] << 8 | h[7];
	__u32 kend = (__u32)h[8] << 24 | (__u32)h[9] << 16 | (__u32)h[10] << 8 | h[11];
	__u32 plen = ulen - UDP_LEN - FP_KEYLOC_LEN;
	if (start >= kend || kend > plen || kend - start > FP_MAX_KEY || start > FP_MAX_KEY_START)
		return pass(FP_C_PASS_KEYED);
	if (!fp_udp_ok(ctx, ulen))
		return pass(FP_C_PASS_CHECKSUM);
	__u32 klen = fp_copy_key(ctx, KEYED_OFF + start, kend - start);
	if (!klen)
		return pass(FP_C_PASS_KEYED);
	__u32 hash = fp_key_hash(klen, cfg->hash);
	__u32 server, point;
	if (!locate(cfg, hash, &server, &point))
		return pass(FP_C_PASS_NO_SERVER);
	struct fp_server *srv = bpf_map_lookup_elem(&fp_servers, &server);
	if (!srv || !srv->valid)
		return pass(FP_C_PASS_NO_SERVER);
	if (!sendable(srv->port))
		return pass(FP_C_PASS_BLOCKED);
	/* The kept headers, with the lengths and checksums they leave with. */
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (data + KEPT_LEN + FP_KEYLOC_LEN > end)
		return pass(FP_C_PASS_KEYED);
	__u8 kept[KEPT_LEN];
	__builtin_memcpy(kept, data, KEPT_LEN);
	h = (__u8 *)data + KEPT_LEN;
	struct iphdr *kip = (void *)(kept + ETH_LEN);
	struct udphdr *kudp = (void *)(kept + ETH_LEN + IP_LEN);
	__u16 tot = bpf_ntohs(kip->tot_len), ntot = tot - FP_KEYLOC_LEN;
	__u32 sum = (__u16)~bpf_ntohs(kip->check) + (__u16)~tot + ntot;
	kip->tot_len = bpf_htons(ntot);
	kip->check = bpf_htons((__u16)~fold(sum));
	__u16 nulen = ulen - FP_KEYLOC_LEN;
	kudp->len = bpf_htons(nulen);
	if (kudp->check) {
		sum = (__u16)~bpf_ntohs(kudp->check) + 2 * ((__u16)~(__u16)ulen + (__u32)nulen);
#pragma unroll
		for (int i = 0; i < FP_KEYLOC_LEN; i += 2)
			sum += (__u16)~(__u16)((__u32)h[i] << 8 | h[i + 1]);
		__u16 c = (__u16)~fold(sum);
		kudp->check = bpf_htons(c ? c : 0xffff);
	}
	if (bpf_xdp_adjust_head(ctx, FP_KEYLOC_LEN))
		return pass(FP_C_PASS_KEYED);
	/* From here the frame is the request without its header: it leaves or is dropped. */
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (data + KEPT_LEN > end)
		return XDP_DROP;
	__builtin_memcpy(data, kept, KEPT_LEN);
	eth = data;
	ip = (void *)(eth + 1);
	udp = (void *)(ip + 1);
	__builtin_memcpy(eth->h_dest, srv->mac, 6);
	if (cfg->l3)
		set_ip(ip, udp, &ip->daddr, srv->ip);
	int verdict = send(ctx, in_port, srv->port);
	struct fp_server_stats *st = bpf_map_lookup_elem(&fp_server_stats, &server);
	if (st)
		st->requests += 1;
	count_arc(point);
	count(FP_C_ROUTED);
	count(FP_C_KEYED);
	return verdict;
}

#define TCP_LEN 20
/* Where a TCP segment's payload starts when its header has no options. */
#define TCP_BODY_OFF (ETH_LEN + IP_LEN + TCP_LEN)
#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_PSH 0x08
#define TCP_ACK 0x10

/* Whether the TCP segment after the 20-byte IPv4 header, `len` bytes of it (at most
 * FP_MAX_CHECKED), has a right checksum. */
__noinline int fp_tcp_ok(struct xdp_md *ctx, __u32 len)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + ETH_LEN;
	__u8 *p = (__u8 *)(ip + 1);
	if (p + TCP_LEN > (__u8 *)end || len < TCP_LEN)
		return 0;
	return l4_sum_ok(ip, p, len, end, IPPROTO_TCP);
}

/* How far fp_value_line has read a `VALUE` line: kept between the steps of bpf_loop. */
struct value_scan {
	__u32 n;      /* bytes of the line loaded into the scratch buffer */
	__u32 field;  /* the line's field under way after `VALUE ` (key, flags, bytes, cas) */
	__u32 digits; /* digits of the bytes field so far */
	__u32 prev;   /* the byte before */
	__u64 bytes;  /* the data block's length so far */
	__u64 result; /* set once the line ends: see fp_value_line */
};

/* One byte of a `VALUE` line (bpf_loop's step): 1 stops the scan. */
static long value_step(__u32 i, struct value_scan *v)
{
	__u32 zero = 0;
	struct fp_scratch *s = bpf_map_lookup_elem(&fp_scratch, &zero);
	__u32 at = i + 6;
	if (!s || at >= v->n)
		return 1;
	asm volatile("" : "+r"(at));
	if (at >= FP_SCRATCH)
		return 1;
	__u8 c = s->buf[at];
	if (c == '\n') {
		if (v->prev == '\r' && v->field >= 2 && v->field <= 3 && v->digits)
			v->result = (__u64)(at + 1) << 32 | (v->bytes + 2);
		return 1;
	}
	if (v->prev == '\r')
		return 1;
	if (c == ' ') {
		if (v->prev == ' ')
			return 1;
		v->field += 1;
	} else if (c != '\r' && v->field == 2) {
		if (c < '0' || c > '9' || v->digits >= 9)
			return 1;
		v->digits += 1;
		v->bytes = v->bytes * 10 + (c - '0');
	}
	v->prev = c;
	return 0;
}

/* The `VALUE <key> <flags> <bytes>[ <cas>]\r\n` line at payload offset `off`, whole within
 * the segment's `plen` bytes: its length in the high half, its data block's (with the \r\n
 * after it) in the low half; 0 for anything else, or a line the segment cuts. */
__noinline __u64 fp_value_line(struct xdp_md *ctx, __u32 off, __u32 plen)
{
	__u32 zero = 0;
	struct fp_scratch *s = bpf_map_lookup_elem(&fp_scratch, &zero);
	if (!s || off >= plen || plen > 0xffff)
		return 0;
	__u64 n = plen - off;
	if (n > FP_LINE_MAX)
		n = FP_LINE_MAX;
	asm volatile("" : "+r"(n));
	if (n < 8 || n > FP_LINE_MAX || bpf_xdp_load_bytes(ctx, TCP_BODY_OFF + off, s->buf, n))
		return 0;
	if (s->buf[0] != 'V' || s->buf[1] != 'A' || s->buf[2] != 'L' || s->buf[3] != 'U' ||
	    s->buf[4] != 'E' || s->buf[5] != ' ')
		return 0;
	struct value_scan v = {.n = n, .prev = ' '};
	bpf_loop(FP_LINE_MAX - 6, value_step, &v, 0);
	return v.result;
}

/* Where a leg's replies stand: replies owed and framed, and a data block's bytes to come. */
struct reply_frame {
	__u32 owed;
	__u32 answered;
	__u32 data;
};

/* Reads a segment's `plen` reply bytes on from `f`, as the switch's framer reads replies to
 * single-key retrievals (`VALUE` lines, their data blocks, `END`): 0 when they are anything
 * else, or run past a line the segment cuts or past FP_FRAME_STEPS, or past what is owed. */
static __noinline int frame_replies(struct xdp_md *ctx, __u32 plen, struct reply_frame *f)
{
	__u32 p = 0;
	for (int step = 0; step < FP_FRAME_STEPS; step++) {
		if (p >= plen)
			return 1;
		__u32 rest = plen - p;
		if (f->data) {
			__u32 take = rest < f->data ? rest : f->data;
			f->data -= take;
			p += take;
			continue;
		}
		if (f->answered >= f->owed || rest < 5)
			return 0;
		__u8 end[5];
		if (bpf_xdp_load_bytes(ctx, TCP_BODY_OFF + p, end, 5))
			return 0;
		if (end[0] == 'E' && end[1] == 'N' && end[2] == 'D' && end[3] == '\r' && end[4] == '\n') {
			f->answered += 1;
			p += 5;
			continue;
		}
		__u64 line = fp_value_line(ctx, p, plen);
		if (!line)
			return 0;
		p += line >> 32;
		f->data = line & 0xffffffff;
	}
	return p >= plen;
}

/* Adds the change of one 16-bit word (as stored) to a checksum's complemented sum. */
static __always_inline __u32 sum_change(__u32 sum, __u16 from, __u16 to)
{
	return sum + (__u16)~from + to;
}

/* A TCP segment's new numbers, all in network order: `*addr` (its IP source or destination)
 * becomes `to_addr`, then the ports, sequence and acknowledgement numbers and window; both
 * checksums updated for what changed (RFC 1624). */
struct tcp_rewrite {
	__u32 addr;
	__u16 source;
	__u16 dest;
	__u32 seq;
	__u32 ack;
	__u16 window;
};

static __always_inline void rewrite_tcp(struct iphdr *ip, struct tcphdr *tcp, __u32 *addr,
					 const struct tcp_rewrite *to)
{
	__u32 sum = (__u16)~tcp->check;
	if (*addr != to->addr) {
		sum = sum_change(sum, *addr & 0xffff, to->addr & 0xffff);
		sum = sum_change(sum, *addr >> 16, to->addr >> 16);
		ip->check = csum_replace(ip->check, *addr, to->addr);
		*addr = to->addr;
	}
	sum = sum_change(sum, tcp->source, to->source);
	sum = sum_change(sum, tcp->dest, to->dest);
	sum = sum_change(sum, tcp->seq & 0xffff, to->seq & 0xffff);
	sum = sum_change(sum, tcp->seq >> 16, to->seq >> 16);
	sum = sum_change(sum, tcp->ack_seq & 0xffff, to->ack & 0xffff);
	sum = sum_change(sum, tcp->ack_seq >> 16, to->ack >> 16);
	sum = sum_change(sum, tcp->window, to->window);
	tcp->check = ~fold(sum);
	tcp->source = to->source;
	tcp->dest = to->dest;
	tcp->seq = to->seq;
	tcp->ack_seq = to->ack;
	tcp->window = to->window;
}

/* A reply segment from the target of a leg user space handed over: framed, rewritten into
 * the client's connection (addresses, ports, sequence and acknowledgement numbers, window,
 * MACs) and sent to the client, or passed up unchanged. */
static __always_inline int leg_reply(struct xdp_md *ctx, struct fp_config *cfg, __u32 in_port,
				     struct fp_leg *leg)
{
	if (!*(volatile __u32 *)&leg->armed)
		return pass(FP_C_PASS_LEG);
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end)
		return pass(FP_C_PASS_LEG);
	__u8 flags = ((__u8 *)tcp)[13];
	/* The slot may have been given to another leg since it was looked up. */
	if (leg->key.src_ip != ip->saddr || leg->key.dst_ip != ip->daddr ||
	    leg->key.src_port != tcp->source || leg->key.dst_port != tcp->dest)
		return pass(FP_C_PASS_LEG);
	if (in_port != leg->in_port || !mac_eq(eth->h_source, leg->server_mac) || tcp->doff != 5 ||
	    !(flags & TCP_ACK) || (flags & ~(TCP_ACK | TCP_PSH)))
		return pass(FP_C_PASS_LEG);
	__u32 tot = bpf_ntohs(ip->tot_len);
	if (tot <= IP_LEN + TCP_LEN || tot - IP_LEN > FP_MAX_CHECKED)
		return pass(FP_C_PASS_LEG);
	__u32 plen = tot - IP_LEN - TCP_LEN;
	__u32 seq = bpf_ntohl(tcp->seq), ack = bpf_ntohl(tcp->ack_seq);
	if ((__s32)(ack - leg->ack_from) < 0 || (__s32)(leg->ack_to - ack) < 0)
		return pass(FP_C_PASS_LEG);
	__u32 out = leg->out_port;
	if (!sendable(out))
		return pass(FP_C_PASS_BLOCKED);
	if (!fp_tcp_ok(ctx, tot - IP_LEN))
		return pass(FP_C_PASS_CHECKSUM);
	int fresh = seq == leg->read;
	/* Owed: what was owed when armed, and the requests sent on since. */
	struct reply_frame f = {
		.owed = leg->owed + leg->requests, .answered = leg->answered, .data = leg->data};
	if (fresh) {
		if (!frame_replies(ctx, plen, &f))
			return pass(FP_C_PASS_LEG);
	} else if ((__s32)(seq - leg->seq_from) < 0 || (__s32)(leg->read - (seq + plen)) < 0) {
		/* Neither the next bytes nor bytes sent since armed: the switch places them. */
		return pass(FP_C_PASS_LEG);
	}
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end)
		return pass(FP_C_PASS_LEG);
	__u32 window = ((__u32)bpf_ntohs(tcp->window) << (leg->target_shift & 15)) >>
		       (leg->client_shift & 15);
	if (window > 0xffff)
		window = 0xffff;
	__u32 client_ack = ack + leg->ack_off;
	struct tcp_rewrite to = {
		.addr = leg->vip,
		.source = leg->vip_port,
		.dest = leg->client_port,
		.seq = bpf_htonl(seq + leg->seq_off),
		.ack = bpf_htonl(client_ack),
		.window = bpf_htons(window),
	};
	rewrite_tcp(ip, tcp, &ip->saddr, &to);
	__builtin_memcpy(eth->h_dest, leg->client_mac, 6);
	__builtin_memcpy(eth->h_source, cfg->vip_mac, 6);
	if (fresh) {
		leg->read = seq + plen;
		leg->answered = f.answered;
		leg->data = f.data;
	}
	if ((__s32)(ack - leg->acked) > 0)
		leg->acked = ack;
	leg->last_ack = client_ack;
	leg->window = window;
	leg->sent += 1;
	count(FP_C_TCP_REPLIES);
	return send(ctx, in_port, out);
}

/* A client's segment on a flow whose leg user space handed over with its requests: a `get` or
 * `gets` of one key of that leg's server, whole in the segment, or an acknowledgement that
 * moves the leg on; rewritten into the leg (addresses, ports, numbers, window, MACs) and sent
 * to the server, or passed up unchanged. */
static __always_inline int leg_request(struct xdp_md *ctx, struct fp_config *cfg, __u32 in_port,
				       struct fp_leg *leg)
{
	if (!*(volatile __u32 *)&leg->armed || !leg->requests_ok)
		return pass(FP_C_PASS_TO_SWITCH);
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end)
		return pass(FP_C_PASS_TO_SWITCH);
	if (leg->key.dst_ip != ip->saddr || leg->client_port != tcp->source ||
	    leg->vip_port != tcp->dest || leg->vip != ip->daddr)
		return pass(FP_C_PASS_TO_SWITCH);
	__u8 flags = ((__u8 *)tcp)[13];
	if (in_port != leg->out_port || !mac_eq(eth->h_source, leg->client_mac) || tcp->doff != 5 ||
	    !(flags & TCP_ACK) || (flags & ~(TCP_ACK | TCP_PSH)))
		return pass(FP_C_PASS_TO_SWITCH);
	__u32 tot = bpf_ntohs(ip->tot_len);
	if (tot < IP_LEN + TCP_LEN || tot - IP_LEN > FP_MAX_CHECKED)
		return pass(FP_C_PASS_TO_SWITCH);
	__u32 plen = tot - IP_LEN - TCP_LEN;
	__u32 seq = bpf_ntohl(tcp->seq), ack = bpf_ntohl(tcp->ack_seq);
	/* The acknowledgement must fall in the leg's run of replies: the target's by one offset. */
	__u32 run_start = leg->seq_from + leg->seq_off, sent = leg->read + leg->seq_off;
	if ((__s32)(ack - run_start) < 0 || (__s32)(sent - ack) < 0)
		return pass(FP_C_PASS_TO_SWITCH);
	__u32 to_ack = ack - leg->seq_off;
	if ((__s32)(to_ack - leg->acked_to) < 0)
		to_ack = leg->acked_to;
	if (seq != leg->next_in)
		return pass(FP_C_PASS_TO_SWITCH);
	if (plen == 0) {
		/* An acknowledgement alone goes on only when it moves the leg on. */
		if (to_ack == leg->acked_to)
			return pass(FP_C_PASS_TO_SWITCH);
	} else {
		if (plen > 5 + FP_MAX_KEY + 2)
			return pass(FP_C_PASS_TO_SWITCH);
		/* `get <key>\r\n` or `gets <key>\r\n`, exactly the segment. The text helpers count
		 * from a UDP request's body, 4 bytes before a TCP payload. */
		__u8 head[5];
		if (bpf_xdp_load_bytes(ctx, TCP_BODY_OFF, head, 5))
			return pass(FP_C_PASS_TO_SWITCH);
		__u32 at;
		if (head[0] == 'g' && head[1] == 'e' && head[2] == 't' && head[3] == ' ')
			at = 4 + 4;
		else if (head[0] == 'g' && head[1] == 'e' && head[2] == 't' && head[3] == 's' &&
			 head[4] == ' ')
			at = 5 + 4;
		else
			return pass(FP_C_PASS_TO_SWITCH);
		__u32 key = fp_text_key(ctx, at);
		__u32 klen = key & 0xffff;
		if (!klen || klen > FP_MAX_KEY || (key >> 16))
			return pass(FP_C_PASS_TO_SWITCH);
		__u32 used = fp_text_tail(ctx, at + klen, 0);
		if (used != plen + 4)
			return pass(FP_C_PASS_TO_SWITCH);
		if (!ring_current(cfg))
			return pass(FP_C_PASS_POOL_CHANGE);
		__u32 hash = fp_key_hash(klen, cfg->hash);
		__u32 server, point;
		if (!locate(cfg, hash, &server, &point) || server != leg->server)
			return pass(FP_C_PASS_TO_SWITCH);
		count_arc(point);
	}
	if (!sendable(leg->in_port))
		return pass(FP_C_PASS_BLOCKED);
	if (!fp_tcp_ok(ctx, tot - IP_LEN))
		return pass(FP_C_PASS_CHECKSUM);
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end)
		return pass(FP_C_PASS_TO_SWITCH);
	__u16 raw_window = bpf_ntohs(tcp->window);
	/* A target that did not take the client's window scale reads windows unscaled. */
	__u32 window = (__u32)raw_window << (leg->leg_shift & 15);
	if (window > 0xffff)
		window = 0xffff;
	struct tcp_rewrite to = {
		.addr = leg->key.src_ip,
		.source = leg->key.dst_port,
		.dest = leg->key.src_port,
		.seq = bpf_htonl(seq - leg->ack_off),
		.ack = bpf_htonl(to_ack),
		.window = bpf_htons(window),
	};
	rewrite_tcp(ip, tcp, &ip->daddr, &to);
	__builtin_memcpy(eth->h_dest, leg->server_mac, 6);
	if (plen) {
		leg->next_in = seq + plen;
		leg->ack_to += plen;
		leg->requests += 1;
		__u32 idx = leg->server;
		struct fp_server_stats *st = bpf_map_lookup_elem(&fp_server_stats, &idx);
		if (st)
			st->requests += 1;
	}
	if ((__s32)(ack - leg->client_acked) > 0)
		leg->client_acked = ack;
	leg->client_window = raw_window;
	leg->acked_to = to_ack;
	count(FP_C_TCP_REQUESTS);
	return send(ctx, in_port, leg->in_port);
}

/* A spliced connection's TCP segment, sent on by the program when user space handed it the
 * leg, else passed up unchanged: from a server to a leg port (a reply, found in fp_leg_slots
 * by its addresses and ports), or from a client to the VIP (`from_client`: found in
 * fp_leg_clients by the client's address and port). */
static __always_inline int spliced(struct xdp_md *ctx, struct fp_config *cfg, __u32 in_port,
				   int from_client)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + ETH_LEN;
	struct tcphdr *tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end)
		return pass(from_client ? FP_C_PASS_TO_SWITCH : FP_C_PASS_IP_HEADER);
	__u32 *slot;
	__u32 held;
	if (from_client) {
		__u64 client = (__u64)ip->saddr | (__u64)tcp->source << 32;
		__u32 *home = bpf_map_lookup_elem(&fp_leg_clients, &client);
		struct fp_leg *h = home ? bpf_map_lookup_elem(&fp_legs, home) : 0;
		if (!h)
			return pass(FP_C_PASS_TO_SWITCH);
		/* The leg is checked against the segment's ends before it is used. */
		held = *(volatile __u32 *)&h->client_slot;
		slot = &held;
	} else {
		struct fp_leg_key key = {
			.src_ip = ip->saddr,
			.dst_ip = ip->daddr,
			.src_port = tcp->source,
			.dst_port = tcp->dest,
		};
		slot = bpf_map_lookup_elem(&fp_leg_slots, &key);
	}
	struct fp_leg *leg = slot ? bpf_map_lookup_elem(&fp_legs, slot) : 0;
	if (!leg)
		return pass(FP_C_PASS_TO_SWITCH);
	/* Counted in and out, so that user space taking the leg back knows when no pass is
	 * under way. The atomic adds order the reads and writes between them on x86, where they
	 * are locked instructions; a leg's segments are taken on one receive queue, one at a
	 * time (the switch's veths have one). */
	__sync_fetch_and_add(&leg->busy, 1);
	int verdict = from_client ? leg_request(ctx, cfg, in_port, leg)
				  : leg_reply(ctx, cfg, in_port, leg);
	__sync_fetch_and_add(&leg->done, 1);
	return verdict;
}

/* What the program does with a frame that arrived on switch port `in_port`: XDP_PASS hands
 * it, unchanged, to the switch. */
static __always_inline int decide(struct xdp_md *ctx, __u32 in_port)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 zero = 0;
	struct fp_config *cfg = bpf_map_lookup_elem(&fp_cfg, &zero);
	if (!cfg || !cfg->enabled)
		return pass(FP_C_PASS_OFF);

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || (eth->h_dest[0] & 1))
		return pass(FP_C_PASS_NOT_IPV4);
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end)
		return pass(FP_C_PASS_IP_HEADER);
	/* A 20-byte header, not a fragment, a length the frame holds, a right checksum. */
	if (ip->version != 4 || ip->ihl != 5 || (ip->frag_off & bpf_htons(0x3fff)) ||
	    (void *)ip + bpf_ntohs(ip->tot_len) > end || bpf_ntohs(ip->tot_len) < IP_LEN ||
	    ip_checksum(ip) != 0)
		return pass(FP_C_PASS_IP_HEADER);
	struct fp_host host = {.ip = ip->saddr};
	__builtin_memcpy(host.mac, eth->h_source, 6);
	struct fp_host_seen *seen = bpf_map_lookup_elem(&fp_hosts, &host);
	if (!seen || seen->port != in_port)
		return pass(FP_C_PASS_STRANGER);
	if (!seen->hit)
		seen->hit = 1;

	struct udphdr *udp = (void *)(ip + 1);
	int is_udp = ip->protocol == IPPROTO_UDP;
	if (is_udp) {
		if ((void *)(udp + 1) > end || bpf_ntohs(udp->len) < UDP_LEN ||
		    bpf_ntohs(udp->len) != bpf_ntohs(ip->tot_len) - IP_LEN)
			return pass(FP_C_PASS_IP_HEADER);
	}
	__u32 dst = ip->daddr;
	if (dst == cfg->vip) {
		if ((void *)(udp + 1) > end)
			return pass(FP_C_PASS_TO_SWITCH);
		if (is_udp && cfg->vip_port && udp->dest == cfg->vip_port)
			return route(ctx, cfg, in_port, eth, ip, udp);
		if (is_udp && keyed_port(udp->dest))
			return route_keyed(ctx, cfg, in_port);
		if (ip->protocol == IPPROTO_TCP && cfg->tcp_splice && !cfg->cache_only)
			return spliced(ctx, cfg, in_port, 1);
		return pass(FP_C_PASS_TO_SWITCH);
	}
	if (bpf_map_lookup_elem(&fp_own, &dst) || mac_eq(eth->h_dest, cfg->vip_mac))
		return pass(FP_C_PASS_TO_SWITCH);
	/* A spliced connection's segments from its server are rewritten by the switch. */
	if (cfg->tcp_splice && ip->protocol == IPPROTO_TCP) {
		/* The ports are the first four bytes of TCP's header as of UDP's. */
		if ((void *)(udp + 1) > end)
			return pass(FP_C_PASS_IP_HEADER);
		if (bpf_ntohs(udp->dest) >= cfg->tcp_splice &&
		    (bpf_map_lookup_elem(&fp_server_ips, &ip->saddr) ||
		     (!cfg->l3 && ip->saddr == cfg->vip)))
			return spliced(ctx, cfg, in_port, 0);
	}
	/* With the cache on, the switch must see every server's reply (fills, writes' ends). */
	if (cfg->cache_only)
		return pass(FP_C_PASS_CACHE);
	/* SwitchKV's encoded queries carry a locally administered MAC no station has. */
	struct fp_mac to = {};
	__builtin_memcpy(to.mac, eth->h_dest, 6);
	__u32 *out = bpf_map_lookup_elem(&fp_stations, &to);
	if (!out || *out == in_port)
		return pass(FP_C_PASS_NO_STATION);
	if (!sendable(*out))
		return pass(FP_C_PASS_BLOCKED);
	if (is_udp) {
		if ((void *)(udp + 1) > end)
			return pass(FP_C_PASS_IP_HEADER);
		__u32 src = ip->saddr;
		__u32 *idx = bpf_map_lookup_elem(&fp_server_ips, &src);
		struct fp_server *srv = idx ? bpf_map_lookup_elem(&fp_servers, idx) : 0;
		/* From its memcached port, or a keyed port (a keyed service's answer). */
		int reply = srv && ((srv->udp_port && udp->source == srv->udp_port) ||
				    keyed_port(udp->source));
		if (!reply && src == cfg->vip && !cfg->l3)
			reply = (cfg->vip_port && udp->source == cfg->vip_port) ||
				keyed_port(udp->source);
		if (reply) {
			if (!reply_allowed(cfg, ip->daddr, (__u64)(end - data))) {
				count(FP_C_REPLY_LIMITED);
				return XDP_DROP;
			}
			if (srv && cfg->l3)
				set_ip(ip, udp, &ip->saddr, cfg->vip);
			int verdict = send(ctx, in_port, *out);
			if (srv) {
				struct fp_server_stats *st = bpf_map_lookup_elem(&fp_server_stats, idx);
				if (st)
					st->replies += 1;
			}
			count(FP_C_REPLIES);
			return verdict;
		}
	}
	int verdict = send(ctx, in_port, *out);
	count(FP_C_SWITCHED);
	return verdict;
}

SEC("xdp")
int kvswitch_fastpath(struct xdp_md *ctx)
{
	count(FP_C_FRAMES);
	__u32 ifindex = ctx->ingress_ifindex;
	__u32 *port = bpf_map_lookup_elem(&fp_ports, &ifindex);
	if (!port)
		return pass(FP_C_PASS_OFF);
	__u32 in_port = *port;
	int verdict = decide(ctx, in_port);
	/* To the switch: through the port's AF_XDP socket when it has one, else the kernel's
	 * stack (where its AF_PACKET socket reads it). */
	if (verdict == XDP_PASS)
		return bpf_redirect_map(&fp_xsks, in_port, XDP_PASS);
	return verdict;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
