// SPDX-License-Identifier: GPL-2.0
/* A program the verifier must refuse (it reads past the packet without a
 * bounds check): the loader's test that a refusal is an error carrying the
 * verifier's words, not a panic. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

SEC("lwt_seg6local")
int refused(struct __sk_buff *skb)
{
	unsigned char *p = (unsigned char *)(long)skb->data;
	return p[100];
}
