/* Egress policy of container sandboxes, enforced where a socket names its destination: connect() and
 * sendmsg()/sendto() of IPv4 and IPv6 sockets. Attached once to the cgroup v2 directory above every sandbox of the
 * node. A process in the node's own network namespace is not a sandbox and is let through; one in a namespace with
 * an entry in `sandboxes` is held to that policy; one in any other namespace (a sandbox without a network link, or
 * one whose policy is not installed yet or any more) reaches only its own loopback: the filter fails closed. A
 * refused call fails with EPERM and is reported.
 * Sandboxes cannot leave their namespace (seccomp refuses new namespaces and they hold no other namespace's fd). */
#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "EgressMaps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 65536);
  __type(key, __u64);
  __type(value, struct dsec_egress_sandbox);
  __uint(map_flags, BPF_F_NO_PREALLOC);
} sandboxes SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_LPM_TRIE);
  __uint(max_entries, 1048576); /* 256 rules per sandbox at most, two generations during a change */
  __type(key, struct dsec_egress_allow_key);
  __type(value, __u8);
  __uint(map_flags, BPF_F_NO_PREALLOC);
} allow SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1048576); /* 256 per sandbox at most (EgressFilter::kMaxResolvedPerSandbox) */
  __type(key, struct dsec_egress_resolved_key);
  __type(value, struct dsec_egress_resolved);
  __uint(map_flags, BPF_F_NO_PREALLOC);
} resolved SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_LPM_TRIE);
  __uint(max_entries, 4096);
  __type(key, struct dsec_egress_never_key);
  __type(value, __u8);
  __uint(map_flags, BPF_F_NO_PREALLOC);
} never SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct dsec_egress_config);
} config SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 256 * 1024);
} events SEC(".maps");

static __always_inline void report(struct bpf_sock_addr *ctx, __u64 cookie, __u32 ip4, const __u32 *ip6, __u16 port,
                                   __u8 reason, __u8 op) {
  struct dsec_egress_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) return; /* the agent is behind: the call is refused all the same */
  __builtin_memset(e, 0, sizeof(*e));
  e->netns_cookie = cookie;
  e->time_boot_ns = bpf_ktime_get_boot_ns();
  e->ip4 = ip4;
  if (ip6) {
    e->ip6[0] = ip6[0];
    e->ip6[1] = ip6[1];
    e->ip6[2] = ip6[2];
    e->ip6[3] = ip6[3];
  }
  e->port = port;
  e->sock_type = (__u8)ctx->type;
  e->reason = reason;
  e->op = op;
  bpf_ringbuf_submit(e, 0);
}

/* The lookups EgressDecision.h decides with, on the maps above. */
#define DSEC_EGRESS_ENV void *
static __always_inline int dsec_egress_allow_prefix(void *env, struct dsec_egress_allow_key *key) {
  __u8 *prefix = bpf_map_lookup_elem(&allow, key); /* the value: the matching block's prefix length */
  return prefix ? *prefix : -1;
}
static __always_inline int dsec_egress_never_listed(void *env, struct dsec_egress_never_key *key) {
  return bpf_map_lookup_elem(&never, key) != 0;
}
static __always_inline __u64 dsec_egress_resolved_expiry(void *env, struct dsec_egress_resolved_key *key) {
  struct dsec_egress_resolved *hit = bpf_map_lookup_elem(&resolved, key);
  return hit ? hit->expires_boot_ns : 0;
}
static __always_inline __u64 dsec_egress_now_boot_ns(void *env) { return bpf_ktime_get_boot_ns(); }
#include "EgressDecision.h"

/* 1 = let the call through. */
static __always_inline int check_ip4(struct bpf_sock_addr *ctx, __u64 cookie, const struct dsec_egress_sandbox *sb,
                                     __u32 ip4, __u16 port, __u8 op) {
  int verdict = dsec_egress_decide4(0, cookie, sb, ip4, port);
  if (verdict == DSEC_EGRESS_ALLOWED) return 1;
  report(ctx, cookie, ip4, 0, port, (__u8)verdict, op);
  return 0;
}

/* A process whose namespace has no policy: the node's own processes pass, others keep to their loopback. */
static __always_inline int without_policy(__u64 cookie, int loopback) {
  __u32 zero = 0;
  struct dsec_egress_config *cfg = bpf_map_lookup_elem(&config, &zero);
  if (cfg && cfg->node_netns_cookie == cookie) return 1;
  return loopback;
}

static __always_inline int check4(struct bpf_sock_addr *ctx, __u8 op) {
  __u64 cookie = bpf_get_netns_cookie(ctx);
  struct dsec_egress_sandbox *sb = bpf_map_lookup_elem(&sandboxes, &cookie);
  if (!sb) return without_policy(cookie, (bpf_ntohl(ctx->user_ip4) >> 24) == 127);
  return check_ip4(ctx, cookie, sb, ctx->user_ip4, (__u16)ctx->user_port, op);
}

static __always_inline int check6(struct bpf_sock_addr *ctx, __u8 op) {
  __u64 cookie = bpf_get_netns_cookie(ctx);
  struct dsec_egress_sandbox *sb = bpf_map_lookup_elem(&sandboxes, &cookie);
  __u32 ip6[4] = {ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3]};
  __u16 port = (__u16)ctx->user_port;
  /* ::1, and ::ffff:127.x.y.z: the sandbox's own loopback */
  int loopback = ip6[0] == 0 && ip6[1] == 0 &&
                 ((ip6[2] == 0 && ip6[3] == bpf_htonl(1)) ||
                  (ip6[2] == bpf_htonl(0xffff) && (bpf_ntohl(ip6[3]) >> 24) == 127));
  if (!sb) return without_policy(cookie, loopback);
  if (loopback) return 1;
  /* ::ffff:a.b.c.d on a dual-stack socket goes out as IPv4: the IPv4 policy decides */
  if (ip6[0] == 0 && ip6[1] == 0 && ip6[2] == bpf_htonl(0xffff)) return check_ip4(ctx, cookie, sb, ip6[3], port, op);
  report(ctx, cookie, 0, ip6, port, DSEC_EGRESS_IPV6, op);
  return 0;
}

SEC("cgroup/connect4")
int dsec_connect4(struct bpf_sock_addr *ctx) { return check4(ctx, 0); }

SEC("cgroup/sendmsg4")
int dsec_sendmsg4(struct bpf_sock_addr *ctx) { return check4(ctx, 1); }

SEC("cgroup/connect6")
int dsec_connect6(struct bpf_sock_addr *ctx) { return check6(ctx, 0); }

SEC("cgroup/sendmsg6")
int dsec_sendmsg6(struct bpf_sock_addr *ctx) { return check6(ctx, 1); }
