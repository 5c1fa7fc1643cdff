/* The egress decision for one IPv4 destination of a sandbox with a policy, written once and compiled twice: into the
 * BPF programs (egress.bpf.c), which judge every connect and send, and into the agent (EgressFilter::allows), which
 * cuts the connections a new policy refuses. Both read the same maps, so they cannot disagree.
 *
 * The includer defines, before including this file, four lookups on its own view of the maps (env is whatever it
 * needs to reach them):
 *   static __always_inline int dsec_egress_allow_prefix(DSEC_EGRESS_ENV env, struct dsec_egress_allow_key *key);
 *     the prefix length of the allow entry that covers key, or -1
 *   static __always_inline int dsec_egress_never_listed(DSEC_EGRESS_ENV env, struct dsec_egress_never_key *key);
 *   static __always_inline __u64 dsec_egress_resolved_expiry(DSEC_EGRESS_ENV env,
 *                                                             struct dsec_egress_resolved_key *key);  0 = none
 *   static __always_inline __u64 dsec_egress_now_boot_ns(DSEC_EGRESS_ENV env);  CLOCK_BOOTTIME
 * Addresses and ports are in network order throughout, as the maps and the kernel's context hold them. */
#pragma once

#include <bpf/bpf_endian.h>

#include "EgressMaps.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

#define DSEC_EGRESS_ALLOWED 0

static __always_inline int dsec_egress_resolved_allows(DSEC_EGRESS_ENV env, __u64 cookie, __u32 generation, __u32 ip4,
                                                       __u16 port) {
  /* The whole key, trailing padding included: the hash compares every byte, and an initializer leaves the padding
   * as the stack had it (the lookup then missed or hit at random). */
  struct dsec_egress_resolved_key key;
  __builtin_memset(&key, 0, sizeof(key));
  key.netns_cookie = cookie;
  key.generation = generation;
  key.ip4 = ip4;
  key.port = port;
  __u64 expiry = dsec_egress_resolved_expiry(env, &key);
  if (expiry == 0) {
    key.port = 0;
    expiry = dsec_egress_resolved_expiry(env, &key);
  }
  return expiry != 0 && expiry > dsec_egress_now_boot_ns(env);
}

/* DSEC_EGRESS_ALLOWED, or why not (enum dsec_egress_verdict_reason). */
static __always_inline int dsec_egress_decide4(DSEC_EGRESS_ENV env, __u64 cookie, const struct dsec_egress_sandbox *sb,
                                               __u32 ip4, __u16 port) {
  if ((bpf_ntohl(ip4) >> 24) == 127) return DSEC_EGRESS_ALLOWED; /* the sandbox's own loopback */
  /* Its own link address is its own namespace too, though the subnet it is in is closed (never) to it. */
  if (sb->own_ip4 != 0 && ip4 == sb->own_ip4) return DSEC_EGRESS_ALLOWED;
  if (sb->resolver_ip4 != 0 && ip4 == sb->resolver_ip4 && port == bpf_htons(53)) return DSEC_EGRESS_ALLOWED;
  struct dsec_egress_allow_key key;
  __builtin_memset(&key, 0, sizeof(key));
  key.prefixlen = DSEC_EGRESS_ALLOW_FIXED_BITS + 32;
  key.netns_cookie = cookie;
  key.generation = sb->generation;
  key.port = port;
  key.ip4 = ip4;
  int listed = dsec_egress_allow_prefix(env, &key);
  if (listed < 0) {
    key.port = 0;
    listed = dsec_egress_allow_prefix(env, &key);
  }
  struct dsec_egress_never_key never_key;
  __builtin_memset(&never_key, 0, sizeof(never_key));
  never_key.prefixlen = 32;
  never_key.ip4 = ip4;
  if (dsec_egress_never_listed(env, &never_key)) {
    /* Only an address listed on its own (a /32 rule) opens one of these; a block such as 0.0.0.0/0 never does,
     * nor does a name that resolved to one. */
    return listed == 32 ? DSEC_EGRESS_ALLOWED : DSEC_EGRESS_NODE;
  }
  if (listed >= 0) return DSEC_EGRESS_ALLOWED;
  if (dsec_egress_resolved_allows(env, cookie, sb->generation, ip4, port)) return DSEC_EGRESS_ALLOWED;
  return DSEC_EGRESS_NOT_ALLOWED;
}
