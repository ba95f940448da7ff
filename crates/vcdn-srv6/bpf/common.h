/* Shared by the dispatcher and the server agent: header layouts, the flow
 * key, counters. Everything here runs in the kernel, on packets that anyone
 * may have sent: every length is checked before it is used. */
#ifndef VCDN_SRV6_COMMON_H
#define VCDN_SRV6_COMMON_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ipv6.h>
#include <linux/seg6.h>
#include <linux/seg6_local.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef IPPROTO_ROUTING
#define IPPROTO_ROUTING 43
#endif
#define SRH_TYPE 4
#define IPV6_HDR_LEN 40
/* The longest segment list vcdn builds: edge, origin, chunk address. */
#define MAX_SEGMENTS 3

/* The SRH's fixed part (the kernel's struct ends in a flexible array). */
struct srh_head {
	__u8 nexthdr;
	__u8 hdrlen;
	__u8 type;
	__u8 segments_left;
	__u8 first_segment;
	__u8 flags;
	__u16 tag;
};

/* One TCP connection, from the client's side: the client's address and
 * port, the chunk address it connected to and that port. */
struct flow_key {
	struct in6_addr client;
	struct in6_addr chunk;
	__u16 client_port;
	__u16 server_port;
	__u32 pad;
};

/* The upper 64 bits of an address: the locator of a server, or the /64 of
 * a service's chunks. */
static __always_inline __u64 upper64(const struct in6_addr *a)
{
	return ((__u64)bpf_ntohl(a->in6_u.u6_addr32[0]) << 32) |
	       bpf_ntohl(a->in6_u.u6_addr32[1]);
}

/* The lower 64 bits: the chunk id (`vcdn name`). */
static __always_inline __u64 lower64(const struct in6_addr *a)
{
	return ((__u64)bpf_ntohl(a->in6_u.u6_addr32[2]) << 32) |
	       bpf_ntohl(a->in6_u.u6_addr32[3]);
}

static __always_inline int same_addr(const struct in6_addr *a, const struct in6_addr *b)
{
	return a->in6_u.u6_addr32[0] == b->in6_u.u6_addr32[0] &&
	       a->in6_u.u6_addr32[1] == b->in6_u.u6_addr32[1] &&
	       a->in6_u.u6_addr32[2] == b->in6_u.u6_addr32[2] &&
	       a->in6_u.u6_addr32[3] == b->in6_u.u6_addr32[3];
}

#define COUNTER_MAP(name, n)                                                   \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                       \
		__uint(max_entries, n);                                        \
		__type(key, __u32);                                            \
		__type(value, __u64);                                          \
	} name SEC(".maps")

static __always_inline void count(void *map, __u32 i)
{
	__u64 *c = bpf_map_lookup_elem(map, &i);
	if (c)
		*c += 1;
}

/* An encapsulated packet as the server agent and the dispatcher's learning
 * SID see it after the kernel's End: outer IPv6, SRH, inner IPv6, TCP.
 * Returns 0 and fills the headers, or -1 when the packet is not that. */
struct seen {
	struct ipv6hdr outer;
	struct srh_head srh;
	struct ipv6hdr inner;
	struct tcphdr tcp;
};

#define PARSE_MALFORMED -1
#define PARSE_NOT_TCP -2

/* A plain IPv6 packet (no extension header) carrying TCP, as clients
 * send and servers answer: 0, PARSE_NOT_TCP or PARSE_MALFORMED. */
static __always_inline int parse_plain(struct __sk_buff *skb, struct ipv6hdr *ip,
				       struct tcphdr *tcp)
{
	if (bpf_skb_load_bytes(skb, 0, ip, sizeof(*ip)) || ip->version != 6)
		return PARSE_MALFORMED;
	if (ip->nexthdr != IPPROTO_TCP)
		return PARSE_NOT_TCP;
	if (bpf_skb_load_bytes(skb, IPV6_HDR_LEN, tcp, sizeof(*tcp)))
		return PARSE_MALFORMED;
	return 0;
}

static __always_inline int parse_encapsulated(struct __sk_buff *skb, struct seen *s)
{
	if (bpf_skb_load_bytes(skb, 0, &s->outer, sizeof(s->outer)))
		return PARSE_MALFORMED;
	if (s->outer.version != 6 || s->outer.nexthdr != IPPROTO_ROUTING)
		return PARSE_MALFORMED;
	if (bpf_skb_load_bytes(skb, IPV6_HDR_LEN, &s->srh, sizeof(s->srh)))
		return PARSE_MALFORMED;
	/* vcdn encapsulates (inner IPv6 after the SRH); a list longer than it
	 * builds, or an inconsistent one, is not ours. */
	__u32 srh_len = ((__u32)s->srh.hdrlen + 1) * 8;
	if (s->srh.type != SRH_TYPE || s->srh.nexthdr != IPPROTO_IPV6 ||
	    s->srh.hdrlen == 0 || s->srh.hdrlen > 2 * MAX_SEGMENTS ||
	    (s->srh.hdrlen & 1) || s->srh.segments_left > s->srh.first_segment ||
	    s->srh.first_segment >= s->srh.hdrlen / 2)
		return PARSE_MALFORMED;
	__u32 inner = IPV6_HDR_LEN + srh_len;
	if (bpf_skb_load_bytes(skb, inner, &s->inner, sizeof(s->inner)))
		return PARSE_MALFORMED;
	if (s->inner.version != 6)
		return PARSE_MALFORMED;
	if (s->inner.nexthdr != IPPROTO_TCP)
		return PARSE_NOT_TCP;
	if (bpf_skb_load_bytes(skb, inner + IPV6_HDR_LEN, &s->tcp, sizeof(s->tcp)))
		return PARSE_MALFORMED;
	return 0;
}

#endif
