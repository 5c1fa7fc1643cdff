/* The egress filter's maps as both sides see them: the BPF programs (egress.bpf.c) and the agent (EgressFilter.cc).
 * Plain C, fixed-width, packed where a key is compared byte by byte. */
#pragma once

#include <linux/types.h>

/* The agent's own network namespace (the node's): processes there are not sandboxes. Index 0 of `config`. */
struct dsec_egress_config {
  __u64 node_netns_cookie;
};

/* A sandbox whose network namespace has a policy, keyed by the namespace's cookie (SO_NETNS_COOKIE). */
struct dsec_egress_sandbox {
  __u32 generation;   /* the policy in force: allow entries carry it, so a new policy replaces the old at once */
  __u32 resolver_ip4; /* the node's resolver as the sandbox reaches it (network order); 0 = none */
  __u32 own_ip4;      /* the sandbox's own address on its link (network order): its own namespace, as loopback */
  __u32 pad;
};

/* An allowed address block: LPM trie key; the value is the rule's prefix length (u8). The prefix always covers cookie,
 * generation and port (112 bits), then prefix_len bits of the address. Port 0 = any port. */
struct dsec_egress_allow_key {
  __u32 prefixlen;
  __u64 netns_cookie;
  __u32 generation;
  __u16 port; /* network order */
  __u32 ip4;  /* network order */
} __attribute__((packed));
#define DSEC_EGRESS_ALLOW_FIXED_BITS 112

/* An address the resolver answered for an allowed name: exact key, with the answer's expiry. */
struct dsec_egress_resolved_key {
  __u64 netns_cookie;
  __u32 generation;
  __u32 ip4;  /* network order */
  __u16 port; /* network order; 0 = any */
  __u16 pad;
};
struct dsec_egress_resolved {
  __u64 expires_boot_ns; /* CLOCK_BOOTTIME */
};

/* Never reachable from a sandbox, whatever its policy: the node's addresses, link-local, other sandboxes. */
struct dsec_egress_never_key {
  __u32 prefixlen;
  __u32 ip4; /* network order */
};

enum dsec_egress_verdict_reason {
  DSEC_EGRESS_NOT_ALLOWED = 1, /* not in the sandbox's policy */
  DSEC_EGRESS_NODE = 2,        /* the node, link-local or another sandbox */
  DSEC_EGRESS_IPV6 = 3,        /* an IPv6 destination: sandboxes have no IPv6 route */
};

/* One refusal, to the agent through the ring buffer. */
struct dsec_egress_event {
  __u64 netns_cookie;
  __u64 time_boot_ns;
  __u32 ip4;      /* network order (0 for IPv6) */
  __u32 ip6[4];   /* network order, IPv6 only */
  __u16 port;     /* network order */
  __u8 sock_type; /* SOCK_STREAM, SOCK_DGRAM */
  __u8 reason;    /* enum dsec_egress_verdict_reason */
  __u8 op;        /* 0 connect, 1 send */
  __u8 pad[3];
};
