/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/* The fast path's ABI: limits, map layouts and codes shared by fastpath.c and the Rust loader
 * (crates/xdp/src/abi.rs), which checks every number and size here against its own at build
 * time (build.rs) and every map's sizes when it loads the object. */
#ifndef KVSWITCH_FASTPATH_H
#define KVSWITCH_FASTPATH_H

/* memcached's longest key. */
#define FP_MAX_KEY 250
/* Servers the fast path routes to; a larger pool runs in user space. */
#define FP_MAX_SERVERS 1024
/* Ketama points in one copy of the ring (160 per unit of weight); the ring map holds two. */
#define FP_MAX_POINTS 262144
/* Binary search steps: log2(FP_MAX_POINTS) + 1. */
#define FP_RING_STEPS 19
/* Switch ports, the local port included. */
#define FP_MAX_PORTS 256
/* Stations (MAC to port) and hosts (MAC and IPv4 source on a port) mirrored from user space. */
#define FP_MAX_STATIONS 16384
#define FP_MAX_HOSTS 16384
/* Addresses of the switch itself: VIP, agent address, the local port's. */
#define FP_MAX_OWN 64
/* The scratch buffer a key is hashed from: the key, MD5's padding and length (5 blocks). */
#define FP_SCRATCH 320
/* The longest `get` reply the kernel cache answers: one datagram on a 1500-byte MTU. */
#define FP_MAX_REPLY 1400
/* Keys the kernel cache holds at most (when full, further keys are answered by the switch). */
#define FP_MAX_CACHED 16384
/* The longest UDP datagram whose checksum the program checks (a 1500-byte MTU's); a longer
 * request goes up. */
#define FP_MAX_CHECKED 1480
/* The VIP's keyed ports (vip.keyed_ports), routed by the key-location header. */
#define FP_MAX_KEYED_PORTS 16
/* The key-location header's length, and the furthest start of a key in its payload that the
 * program reads (further ones go up). */
#define FP_KEYLOC_LEN 12
#define FP_MAX_KEY_START 2047
/* Meta flags after an mg key that the fast path takes: each at most once. */
#define FP_MAX_META_FLAGS 8

/* Spliced TCP legs whose replies the program may rewrite for their clients (fp_legs). */
#define FP_MAX_LEGS 65536
/* Reply lines and data blocks framed in one segment at most; a segment with more goes up. */
#define FP_FRAME_STEPS 48
/* The longest `VALUE` line the program reads (a 250-byte key fits; at most FP_SCRATCH). */
#define FP_LINE_MAX 300

/* Key hash functions (nutcracker's names). */
#define FP_HASH_MD5 1
#define FP_HASH_FNV1A_64 2
#define FP_HASH_FNV1_64 3
#define FP_HASH_FNV1A_32 4
#define FP_HASH_FNV1_32 5
#define FP_HASH_ONE_AT_A_TIME 6

/* The ring selector in fp_config.ring: the copy in use in the top bit, its length below. */
#define FP_RING_GEN_BIT 0x80000000u

/* Counters (fp_counters, per CPU). */
#define FP_C_FRAMES 0        /* frames the program saw */
#define FP_C_ROUTED 1        /* requests to the VIP routed to their server */
#define FP_C_SWITCHED 2      /* frames switched by MAC (replies included) */
#define FP_C_PASSED 3        /* frames handed to the user-space switch */
#define FP_C_REPLIES 4       /* server replies switched (their source rewritten in l3 mode) */
#define FP_C_REPLY_LIMITED 5 /* server replies dropped: the client's reply bytes ran out */
/* Why frames were passed up (each also counts in FP_C_PASSED). */
#define FP_C_PASS_OFF 6        /* the program is off, or the port is not the switch's */
#define FP_C_PASS_NOT_IPV4 7   /* not unicast IPv4 (ARP, IPv6, broadcast, multicast) */
#define FP_C_PASS_IP_HEADER 8  /* options, a fragment, a bad length or checksum */
#define FP_C_PASS_STRANGER 9   /* a sender the switch has not sent a frame on for, here */
#define FP_C_PASS_TO_SWITCH 10 /* for the switch itself: its addresses, its MAC */
#define FP_C_PASS_REQUEST 11   /* to the VIP, but not one single-key read the program takes */
#define FP_C_PASS_CHECKSUM 12  /* a read whose UDP checksum is wrong */
#define FP_C_PASS_NO_SERVER 13 /* the key's server is not known to be reachable */
#define FP_C_PASS_NO_STATION 14 /* an unknown destination MAC, or one behind the in-port */
#define FP_C_PASS_BLOCKED 15   /* the out-port may not be sent to from XDP */
#define FP_C_CACHE_HITS 16     /* reads answered from the kernel cache */
#define FP_C_PASS_CACHE 17     /* with the cache on, anything but a kernel-cache hit */
#define FP_C_PASS_NO_ROOM 18   /* a kernel-cache hit whose reply the frame has no room for */
#define FP_C_PASS_POOL_CHANGE 19 /* to the VIP while the pool changes: the ring is not the newest */
#define FP_C_KEYED 20          /* requests to a keyed port routed (each also counts in FP_C_ROUTED) */
#define FP_C_PASS_KEYED 21     /* to a keyed port, but a header the program does not take */
#define FP_C_TCP_REPLIES 22     /* spliced TCP reply segments rewritten for their clients */
#define FP_C_PASS_LEG 23       /* from a spliced leg the switch holds, or one the program does not take */
#define FP_C_TCP_REQUESTS 24   /* spliced clients' segments (a `get` or an acknowledgement) sent on to their leg */
#define FP_NUM_COUNTERS 25

/* What a read is, in fp_parse's result. */
#define FP_READ_GET 1
#define FP_READ_GETS 2
#define FP_READ_MG 3
#define FP_READ_BINARY 4
/* Clients with a bucket of reply bytes in the program (least recently used ones go first). */
#define FP_MAX_BUCKETS 65536

struct fp_config {
	__u32 enabled;    /* 0: every frame goes to user space */
	__u32 vip;        /* network order */
	__u32 vip_bcast;  /* the VIP network's broadcast address, network order; 0: none */
	__u8 vip_mac[6];
	__u16 vip_port;   /* network order; 0: no UDP key-value port (a Redis pool) */
	__u32 l3;         /* 1: l3 mode (the server's address written in, the VIP on replies) */
	__u32 hash;       /* FP_HASH_* */
	__u32 ring;       /* FP_RING_GEN_BIT | number of points */
	__u32 cache_only; /* 1: the cache is on: answer kernel-cache hits, pass everything else */
	__u32 tcp_splice; /* not 0: TCP from a server (from the VIP in l2 mode) to this port or
			   * above goes to user space, which rewrites spliced connections' legs */
	__u64 reply_rate;  /* reply bytes a second per client; 0: no limit */
	__u64 reply_burst; /* the most reply bytes at once */
	__u64 ring_version; /* the pool version whose ring is in use: requests to the VIP are
			     * the program's only while it is fp_gate's */
};

struct fp_point {
	__u32 value;  /* the point on the continuum */
	__u32 server; /* index into fp_servers */
};

struct fp_server {
	__u32 ip;       /* network order */
	__u8 mac[6];
	__u16 udp_port; /* network order: its memcached port; 0: none (a Redis server) */
	__u32 port;     /* the switch port it is learned on */
	__u32 valid;    /* 0: its MAC or port is unknown, or it is out: requests go up */
};

struct fp_mac {
	__u8 mac[6];
	__u16 pad;
};

struct fp_host {
	__u8 mac[6];
	__u16 pad;
	__u32 ip; /* network order */
};

struct fp_host_seen {
	__u32 port; /* the switch port the host is on */
	__u32 hit;  /* set by the program, cleared by user space when it refreshes the host */
};

struct fp_server_stats {
	__u64 requests; /* requests routed to it */
	__u64 replies;  /* replies from its memcached port switched */
};

struct fp_bucket {
	__u64 tokens;  /* reply bytes the client may still be sent */
	__u64 last_ns; /* when it was last refilled (bpf_ktime_get_ns) */
};

struct fp_cached {
	__u64 until_ns;  /* the end of the value's lease (bpf_ktime_get_ns) */
	__u32 key_len;
	__u32 reply_len;
	__u32 reply_sum; /* the reply's 16-bit words summed as the program reads them */
	__u32 pad;
	__u8 key[256];
	__u8 reply[FP_MAX_REPLY]; /* the whole text reply to `get KEY` */
};

/* A spliced leg as its target's segments name it: the target's address and port, then the
 * leg's (the client's address, a leg port); network order. */
struct fp_leg_key {
	__u32 src_ip;
	__u32 dst_ip;
	__u16 src_port;
	__u16 dst_port;
};

/* One spliced leg in fp_legs, a memory-mapped array user space reads and writes in place.
 * User space fills the first part while `armed` is 0 and then sets it; the program fills the
 * second while it is set. To take a leg back, user space clears `armed` and waits until
 * `busy` equals `done`: from then the program passes every segment of the leg up, and its
 * part says what it sent. Sequence numbers are in host order. */
struct fp_leg {
	__u32 armed;      /* not 0: the program rewrites the target's reply segments */
	__u32 busy;       /* the program's passes over the leg begun ... */
	__u32 done;       /* ... and ended */
	__u32 in_port;    /* the switch port the target is on */
	struct fp_leg_key key; /* the leg the slot holds now */
	__u8 server_mac[6];
	__u8 client_mac[6];
	__u16 client_port; /* network order */
	__u16 vip_port;    /* network order: the port the client spoke to */
	__u8 target_shift; /* the target's window shift, and the one the client was told */
	__u8 client_shift;
	__u16 pad;
	__u32 vip;        /* network order: the client-facing source address */
	__u32 out_port;   /* the switch port the client is on */
	__u32 seq_from;   /* the first target byte the program may rewrite */
	__u32 seq_off;    /* the target's byte s is the client's s + seq_off */
	__u32 ack_from;   /* the target's acknowledgements carried: ack_from to ack_to */
	__u32 ack_to;
	__u32 ack_off;    /* the target's acknowledgement a is the client's a + ack_off */
	__u32 owed;       /* replies to single-key retrievals owed when armed */
	/* Written by the program. */
	__u32 read;       /* the next target byte to frame (user space starts it at seq_from) */
	__u32 answered;   /* replies framed whole since armed */
	__u32 data;       /* bytes of a data block still to come, its \r\n included */
	__u32 acked;      /* the highest acknowledgement carried */
	__u32 last_ack;   /* the client's acknowledgement last sent, in its space */
	__u32 window;     /* the window last sent */
	__u32 sent;       /* segments sent since armed */
	/* The client's side: set by user space when it hands the leg over; the program moves
	 * next_in to pad and its counts when it sends a client's segment on. */
	__u32 server;       /* the leg's server, by index into fp_servers */
	__u32 next_in;      /* the client's next byte (host order) */
	__u32 requests;     /* `get`s of one key sent on since armed */
	__u32 client_acked; /* the client's highest acknowledgement (its space) */
	__u32 acked_to;     /* the highest acknowledgement the target was sent (its space) */
	__u16 client_window; /* the client's last window, as it sent it */
	__u8 leg_shift;     /* the shift the target expects on windows sent to it */
	__u8 requests_ok;   /* 1: the client's segments may be sent on too */
	/* In the slot fp_leg_clients names for a client (its home): the slot that holds the
	 * client's side now. Moving a client to another leg is then a store, not a map write. */
	__u32 client_slot;
};

struct fp_scratch {
	__u8 buf[FP_SCRATCH];
};

#endif
