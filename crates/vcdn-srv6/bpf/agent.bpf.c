// SPDX-License-Identifier: GPL-2.0
/* The server agent (6LB's, with the content-aware data-plane paper's LRU
 * filter as its accept policy, §III-A), on every edge and origin host:
 *
 * - `agent` (End.BPF on the host's SID; the kernel has already done End, so
 *   the destination is the next segment and Segments Left counts what is
 *   after this host). A new connection (SYN) with servers left after this
 *   one goes through the LRU filter of chunk ids: a chunk in the filter is
 *   accepted (moved to the front), any other is inserted and the SYN passes
 *   on to the next segment, the origin, untouched. With no server left (the
 *   origin, or a connection the dispatcher steers here) the packet is always
 *   accepted. A non-SYN packet that still hunts (the dispatcher lost its
 *   state) is accepted only where its connection lives. Accepting is
 *   End.DT6: the inner packet goes to the local cache through table
 *   `table` (the kernel's helper cannot deliver locally itself; see
 *   `route.rs`).
 * - `steer_reply` (lwt_xmit on the route to clients): the SYN-ACK of a
 *   connection accepted here is sent through the dispatcher that sent its
 *   SYN, so the dispatcher learns who accepted; every other packet goes
 *   straight to the client.
 *
 * The filter is an LRU hash in slot 0 of an array of maps, so user space can
 * swap in one of another size (its size follows the popularity estimates;
 * see `agent.rs`). Chunk ids of new SYNs are sampled to a ring buffer for
 * those estimates. */
#include "common.h"

char LICENSE[] SEC("license") = "GPL";

enum mode { FILTER = 0, ACCEPT_ALL = 1, REJECT_ALL = 2 };

struct config {
	struct in6_addr sid; /* this host's SID: the source of steered replies */
	__u32 mode;
	__u32 table; /* the table that delivers chunk addresses locally */
};

struct conn {
	struct in6_addr dispatcher;
	__u64 accepted_ns;
};

enum counter {
	C_ACCEPTED,       /* SYNs accepted by the filter */
	C_REJECTED,       /* SYNs passed on to the next segment */
	C_LAST,           /* packets accepted with no server left (origin, steered) */
	C_RECOVERED,      /* hunting packets of a connection that lives here */
	C_PASSED,         /* hunting packets of a connection that does not */
	C_RETRANSMITTED,  /* SYNs of a connection already accepted here */
	C_REPLIES_STEERED,/* SYN-ACKs sent through the dispatcher */
	C_NOT_TCP,        /* dropped */
	C_MALFORMED,      /* dropped: truncated or not vcdn's encapsulation */
	C_UNKNOWN_PREFIX, /* dropped: inner destination not a served /64 */
	C_UNTRUSTED,      /* dropped: outer source not a known dispatcher */
	C_DECAP_FAILED,   /* dropped: the kernel refused End.DT6 */
	C_SAMPLES_LOST,   /* chunk ids the ring buffer had no room for */
	C_ENCAP_FAILED,   /* SYN-ACKs sent direct: the kernel refused the encapsulation */
	N_COUNTERS
};

COUNTER_MAP(stats, N_COUNTERS);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config SEC(".maps");

/* /64s of the chunk addresses this host serves. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u64);
	__type(value, __u32);
} prefixes SEC(".maps");

/* Locators (/64) of the dispatchers allowed to send here. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u64);
	__type(value, __u32);
} dispatchers SEC(".maps");

struct filter {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);   /* chunk id */
	__type(value, __u64); /* last request, ns */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct filter);
} filter_slot SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536); /* set by the loader */
	__type(key, struct flow_key);
	__type(value, struct conn);
} conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18);
} samples SEC(".maps");

static __always_inline struct config *get_config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&config, &zero);
}

/* The LRU filter: 1 if the chunk was requested recently enough to be in it
 * (and it moves to the front), else 0 (and it enters at the front). */
static __always_inline int filter_admits(__u32 mode, __u64 chunk, __u64 now)
{
	if (mode == ACCEPT_ALL)
		return 1;
	if (mode == REJECT_ALL)
		return 0;
	__u32 zero = 0;
	void *lru = bpf_map_lookup_elem(&filter_slot, &zero);
	if (!lru)
		return 0;
	__u64 *seen = bpf_map_lookup_elem(lru, &chunk);
	if (seen) {
		*seen = now;
		return 1;
	}
	bpf_map_update_elem(lru, &chunk, &now, BPF_NOEXIST);
	return 0;
}

static __always_inline void sample(__u64 chunk)
{
	__u64 *slot = bpf_ringbuf_reserve(&samples, sizeof(__u64), 0);
	if (!slot) {
		count(&stats, C_SAMPLES_LOST);
		return;
	}
	*slot = chunk;
	bpf_ringbuf_submit(slot, 0);
}

SEC("lwt_seg6local")
int agent(struct __sk_buff *skb)
{
	struct seen s;
	int r = parse_encapsulated(skb, &s);
	if (r == PARSE_NOT_TCP) {
		count(&stats, C_NOT_TCP);
		return BPF_DROP;
	}
	if (r) {
		count(&stats, C_MALFORMED);
		return BPF_DROP;
	}
	__u64 loc = upper64(&s.outer.saddr);
	if (!bpf_map_lookup_elem(&dispatchers, &loc)) {
		count(&stats, C_UNTRUSTED);
		return BPF_DROP;
	}
	__u64 prefix = upper64(&s.inner.daddr);
	if (!bpf_map_lookup_elem(&prefixes, &prefix)) {
		count(&stats, C_UNKNOWN_PREFIX);
		return BPF_DROP;
	}
	struct config *cfg = get_config();
	if (!cfg)
		return BPF_DROP;

	struct flow_key key = {};
	key.client = s.inner.saddr;
	key.chunk = s.inner.daddr;
	key.client_port = s.tcp.source;
	key.server_port = s.tcp.dest;
	int syn = s.tcp.syn && !s.tcp.ack;
	int known = bpf_map_lookup_elem(&conns, &key) != 0;
	int accept;
	__u64 now = bpf_ktime_get_ns();
	if (s.srh.segments_left == 0) {
		/* Only the chunk address is left: the last candidate, or a
		 * connection the dispatcher steers here. */
		accept = 1;
		count(&stats, C_LAST);
	} else if (syn && known) {
		accept = 1;
		count(&stats, C_RETRANSMITTED);
	} else if (syn) {
		__u64 chunk = lower64(&s.inner.daddr);
		sample(chunk);
		accept = filter_admits(cfg->mode, chunk, now);
		count(&stats, accept ? C_ACCEPTED : C_REJECTED);
	} else {
		accept = known;
		count(&stats, known ? C_RECOVERED : C_PASSED);
	}
	if (!accept)
		return BPF_OK; /* End is done: on to the next segment */
	if (syn && !known) {
		struct conn c = {};
		c.dispatcher = s.outer.saddr;
		c.accepted_ns = now;
		bpf_map_update_elem(&conns, &key, &c, BPF_ANY);
	}
	int table = cfg->table;
	if (bpf_lwt_seg6_action(skb, SEG6_LOCAL_ACTION_END_DT6, &table, sizeof(table))) {
		count(&stats, C_DECAP_FAILED);
		return BPF_DROP;
	}
	return BPF_REDIRECT;
}

struct steer_hdr {
	struct ipv6hdr ip;
	struct srh_head srh;
	struct in6_addr segments[2];
};

SEC("lwt_xmit")
int steer_reply(struct __sk_buff *skb)
{
	struct ipv6hdr ip;
	struct tcphdr tcp;
	if (parse_plain(skb, &ip, &tcp) || !(tcp.syn && tcp.ack))
		return BPF_OK;
	struct flow_key key = {};
	key.client = ip.daddr;
	key.chunk = ip.saddr;
	key.client_port = tcp.dest;
	key.server_port = tcp.source;
	struct conn *c = bpf_map_lookup_elem(&conns, &key);
	struct config *cfg = get_config();
	if (!c || !cfg)
		return BPF_OK;
	struct steer_hdr h = {};
	h.ip.version = 6;
	h.ip.nexthdr = IPPROTO_ROUTING;
	h.ip.hop_limit = 64;
	/* The kernel leaves the outer length to us. */
	h.ip.payload_len = bpf_htons(skb->len + sizeof(h) - IPV6_HDR_LEN);
	h.ip.saddr = cfg->sid;
	h.ip.daddr = c->dispatcher;
	h.srh.nexthdr = IPPROTO_IPV6;
	h.srh.hdrlen = 4;
	h.srh.type = SRH_TYPE;
	h.srh.segments_left = 1;
	h.srh.first_segment = 1;
	h.segments[0] = ip.daddr;
	h.segments[1] = c->dispatcher;
	if (bpf_lwt_push_encap(skb, BPF_LWT_ENCAP_IP, &h, sizeof(h))) {
		count(&stats, C_ENCAP_FAILED);
		return BPF_OK;
	}
	count(&stats, C_REPLIES_STEERED);
	return BPF_LWT_REROUTE;
}
