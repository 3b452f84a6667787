/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/* Loss for tests of TCP through the switch: an XDP program for a host's own interface that
 * drops a seeded share of the TCP segments arriving there, SYNs excepted (a lost SYN costs a
 * second's retransmission and proves nothing more). The n-th TCP segment the program sees is
 * dropped when a hash of the seed and n falls under the share, so a run can be replayed as
 * far as the segments arrive in the same order. Kept apart from the fast path: it is attached
 * by tests to the hosts' interfaces, never to the switch's. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

struct impair_cfg {
	__u64 seed;
	__u32 permille; /* segments dropped per thousand */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct impair_cfg);
} impair_cfg SEC(".maps");

/* [0]: TCP segments seen, [1]: dropped. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} impair_counts SEC(".maps");

static __always_inline __u64 mix(__u64 z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

SEC("xdp")
int kvswitch_impair(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) ||
	    ip->protocol != IPPROTO_TCP || ip->ihl != 5)
		return XDP_PASS;
	struct tcphdr *tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end || tcp->syn)
		return XDP_PASS;
	__u32 zero = 0, one = 1;
	struct impair_cfg *cfg = bpf_map_lookup_elem(&impair_cfg, &zero);
	__u64 *seen = bpf_map_lookup_elem(&impair_counts, &zero);
	__u64 *dropped = bpf_map_lookup_elem(&impair_counts, &one);
	if (!cfg || !seen || !dropped)
		return XDP_PASS;
	__u64 n = __sync_fetch_and_add(seen, 1);
	if (mix(cfg->seed ^ mix(n)) % 1000 < cfg->permille) {
		__sync_fetch_and_add(dropped, 1);
		return XDP_DROP;
	}
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
