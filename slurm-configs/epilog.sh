#!/bin/sh
# slurm.conf `Epilog=/usr/local/share/dsec/slurm-configs/epilog.sh` (or call it from your site's epilog), only
# where spank_dsec.so is NOT in plugstack.conf: the plugin's job epilog does the same on every node.
#
# Destroys what the ending job's dsec fleet agents left on this node (sandboxes, their cgroups, processes,
# network namespaces and veths, layer mounts), found from the claims the agents leave in /run/dsec/jobs; works
# with the agents dead. Never fails the epilog (a failed epilog drains the node); what it did goes to syslog.
DSEC=${DSEC:-dsec}
out=$("$DSEC" node cleanup --job "$SLURM_JOB_ID" 2>&1)
logger -t dsec-epilog -- "$out" 2>/dev/null || true
exit 0
