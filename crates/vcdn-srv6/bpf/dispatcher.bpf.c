// SPDX-License-Identifier: GPL-2.0
/* The dispatcher (6LB's load balancer, content-aware data-plane paper §II-B):
 *
 * - `dispatch` (lwt_in on the route of every service's chunk /64): a
 *   client's packet to a chunk address leaves with an SRv6 encapsulation.
 *   A connection the dispatcher has learnt goes straight to the server that
 *   accepted it (segments: server, chunk address); any other packet gets the
 *   candidate list (edge chosen by rendezvous hashing of the chunk id,
 *   origin, chunk address), or (origin, chunk address) when the service has
 *   no live edge.
 * - `learn` (End.BPF on the dispatcher's own SID): the first reply of an
 *   accepting server (its SYN-ACK, steered here by the server's agent)
 *   teaches the dispatcher who accepted; it is decapsulated and forwarded to
 *   the client. A second server answering for a connection already learnt
 *   is dropped, so a client never sees two SYN-ACKs.
 *
 * The list is pushed in encapsulation mode: the inner packet keeps the chunk
 * address as its destination, which stands for the paper's last segment; the
 * outer SRH lists the servers followed by the chunk address again, so that
 * the last server has a segment left and runs its agent (End.BPF needs one).
 *
 * Flow state is created only by learning, never by a client's SYN, lives in
 * an LRU hash (a flood evicts the oldest state; nothing grows) and expires
 * after an idle time. */
#include "common.h"

char LICENSE[] SEC("license") = "GPL";

/* Buckets of a service's edge table: the chunk id's hash picks one. */
#define BUCKETS 1024
#define MAX_SERVICES 64

struct service {
	__u32 index; /* its table: buckets [index * BUCKETS, +BUCKETS) */
	__u32 edges; /* live edges; 0: straight to the origin */
	struct in6_addr origin;
};

struct edge {
	struct in6_addr sid;
};

enum state { STEER = 1, CLOSING = 2 };

struct flow {
	struct in6_addr server;
	__u64 seen_ns;
	__u32 state;
	__u32 pad;
};

struct config {
	__u64 idle_ns;    /* a learnt connection idle this long is forgotten */
	__u64 closing_ns; /* after the client's FIN */
};

enum counter {
	C_CANDIDATES,     /* packets sent down the candidate list */
	C_STEERED,        /* packets sent straight to the learnt server */
	C_ORIGIN_ONLY,    /* candidate lists without an edge */
	C_LEARNT,         /* connections learnt from a server's SYN-ACK */
	C_CONFLICT,       /* SYN-ACKs of a second server, dropped */
	C_NOT_TCP,        /* dropped: not TCP */
	C_MALFORMED,      /* dropped: truncated or not what vcdn sends */
	C_UNKNOWN_PREFIX, /* dropped: no service has this /64 */
	C_UNKNOWN_SERVER, /* dropped: a reply from a server we do not know */
	C_ENCAP_FAILED,   /* dropped: the kernel refused the encapsulation */
	C_DECAP_FAILED,   /* dropped: the kernel refused the decapsulation */
	C_FLOWS_EXPIRED,  /* learnt connections found idle and forgotten */
	N_COUNTERS
};

COUNTER_MAP(stats, N_COUNTERS);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SERVICES);
	__type(key, __u64); /* the service's /64 */
	__type(value, struct service);
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SERVICES * BUCKETS);
	__type(key, __u32);
	__type(value, struct edge);
} buckets SEC(".maps");

/* Locators (/64) of the servers (edges and origins) whose replies may
 * teach the dispatcher. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u32);
} servers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536); /* set by the loader */
	__type(key, struct flow_key);
	__type(value, struct flow);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config SEC(".maps");

/* The same mixer as `vcdn_policy::hashing::bucket` (splitmix64's
 * finaliser): user space fills each bucket with the rendezvous winner of
 * the bucket's number. */
static __always_inline __u32 bucket_of(__u64 id)
{
	id ^= id >> 30;
	id *= 0xbf58476d1ce4e5b9ULL;
	id ^= id >> 27;
	id *= 0x94d049bb133111ebULL;
	id ^= id >> 31;
	return id & (BUCKETS - 1);
}

struct srh2 {
	struct srh_head h;
	struct in6_addr segments[2];
};

struct srh3 {
	struct srh_head h;
	struct in6_addr segments[3];
};

static __always_inline void srh_init(struct srh_head *h, __u8 n)
{
	h->nexthdr = IPPROTO_IPV6; /* set again by the kernel */
	h->hdrlen = 2 * n;
	h->type = SRH_TYPE;
	h->segments_left = n - 1;
	h->first_segment = n - 1;
	h->flags = 0;
	h->tag = 0;
}

/* Segments are stored last first: [0] is the last one visited. */
static __always_inline int push2(struct __sk_buff *skb, const struct in6_addr *first,
				 const struct in6_addr *chunk)
{
	struct srh2 s = {};
	srh_init(&s.h, 2);
	s.segments[0] = *chunk;
	s.segments[1] = *first;
	return bpf_lwt_push_encap(skb, BPF_LWT_ENCAP_SEG6, &s, sizeof(s));
}

static __always_inline int push3(struct __sk_buff *skb, const struct in6_addr *edge,
				 const struct in6_addr *origin, const struct in6_addr *chunk)
{
	struct srh3 s = {};
	srh_init(&s.h, 3);
	s.segments[0] = *chunk;
	s.segments[1] = *origin;
	s.segments[2] = *edge;
	return bpf_lwt_push_encap(skb, BPF_LWT_ENCAP_SEG6, &s, sizeof(s));
}

static __always_inline struct config *get_config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&config, &zero);
}

SEC("lwt_in")
int dispatch(struct __sk_buff *skb)
{
	struct ipv6hdr ip;
	struct tcphdr tcp;

	int r = parse_plain(skb, &ip, &tcp);
	if (r) {
		count(&stats, r == PARSE_NOT_TCP ? C_NOT_TCP : C_MALFORMED);
		return BPF_DROP;
	}
	__u64 prefix = upper64(&ip.daddr);
	struct service *svc = bpf_map_lookup_elem(&services, &prefix);
	if (!svc) {
		count(&stats, C_UNKNOWN_PREFIX);
		return BPF_DROP;
	}
	struct config *cfg = get_config();
	if (!cfg)
		return BPF_DROP;

	struct flow_key key = {};
	key.client = ip.saddr;
	key.chunk = ip.daddr;
	key.client_port = tcp.source;
	key.server_port = tcp.dest;
	__u64 now = bpf_ktime_get_ns();
	struct flow *f = bpf_map_lookup_elem(&flows, &key);
	if (f) {
		__u64 limit = f->state == CLOSING ? cfg->closing_ns : cfg->idle_ns;
		if (now - f->seen_ns > limit) {
			bpf_map_delete_elem(&flows, &key);
			count(&stats, C_FLOWS_EXPIRED);
			f = 0;
		}
	}
	if (f) {
		struct in6_addr server = f->server;
		f->seen_ns = now;
		if (tcp.rst)
			bpf_map_delete_elem(&flows, &key);
		else if (tcp.fin)
			f->state = CLOSING;
		if (push2(skb, &server, &ip.daddr)) {
			count(&stats, C_ENCAP_FAILED);
			return BPF_DROP;
		}
		count(&stats, C_STEERED);
		return BPF_OK;
	}

	int err;
	struct edge *e = 0;
	if (svc->edges) {
		__u32 b = svc->index * BUCKETS + bucket_of(lower64(&ip.daddr));
		e = bpf_map_lookup_elem(&buckets, &b);
	}
	if (e) {
		err = push3(skb, &e->sid, &svc->origin, &ip.daddr);
	} else {
		count(&stats, C_ORIGIN_ONLY);
		err = push2(skb, &svc->origin, &ip.daddr);
	}
	if (err) {
		count(&stats, C_ENCAP_FAILED);
		return BPF_DROP;
	}
	count(&stats, C_CANDIDATES);
	return BPF_OK;
}

SEC("lwt_seg6local")
int learn(struct __sk_buff *skb)
{
	struct seen s;
	int r = parse_encapsulated(skb, &s);
	if (r == PARSE_NOT_TCP || (r == 0 && !(s.tcp.syn && s.tcp.ack))) {
		count(&stats, C_NOT_TCP);
		return BPF_DROP;
	}
	if (r) {
		count(&stats, C_MALFORMED);
		return BPF_DROP;
	}
	__u64 loc = upper64(&s.outer.saddr);
	if (!bpf_map_lookup_elem(&servers, &loc)) {
		count(&stats, C_UNKNOWN_SERVER);
		return BPF_DROP;
	}
	struct config *cfg = get_config();
	if (!cfg)
		return BPF_DROP;
	struct flow_key key = {};
	key.client = s.inner.daddr;
	key.chunk = s.inner.saddr;
	key.client_port = s.tcp.dest;
	key.server_port = s.tcp.source;
	__u64 now = bpf_ktime_get_ns();
	struct flow *f = bpf_map_lookup_elem(&flows, &key);
	if (f && now - f->seen_ns <= cfg->idle_ns && !same_addr(&f->server, &s.outer.saddr)) {
		count(&stats, C_CONFLICT);
		return BPF_DROP;
	}
	struct flow nf = {};
	nf.server = s.outer.saddr;
	nf.seen_ns = now;
	nf.state = STEER;
	bpf_map_update_elem(&flows, &key, &nf, BPF_ANY);
	count(&stats, C_LEARNT);

	int table = 254; /* main: the route to the client */
	if (bpf_lwt_seg6_action(skb, SEG6_LOCAL_ACTION_END_DT6, &table, sizeof(table))) {
		count(&stats, C_DECAP_FAILED);
		return BPF_DROP;
	}
	return BPF_REDIRECT;
}
