--[[
  cpu_config-6.lua: per-cluster CPU config intersection bookkeeping, run
  after each heartbeat (docs/contract.md, "CPU configs").

  Runtimes send their CPU template only until their first successful
  heartbeat; heartbeat-5.lua keeps it in node:<id> cpu_config_json.  Here each
  cluster tracks which nodes it has and the digest of each node's config,
  and counts its distinct configs (cpucfg-configs:<cluster>).  Once every
  member has one, the client computes the intersection (in Python,
  scheduler/store/cpuconfig.py) from the configs this call lists, and stores
  it for the current epoch; each member then gets it exactly once, on its
  next heartbeat.  A node joining the cluster or changing its config bumps
  the epoch, which drops the result and every delivery mark at once (a new
  node whose config another member has keeps the result: the intersection
  is the same); a restarted node (new service instance) loses only its own
  mark.  Members whose node left or moved are pruned without a new epoch: on
  the events that remove or move them (includes/nodes.lua, heartbeat.lua),
  and, while the round waits for a config, by a bounded prune step per
  ingest (cpucfg-missing:<cluster>, the members without a config, sampled),
  so a heartbeat's part is O(1) whatever the cluster's size, and so is the
  round's computation while the counts are exact: it reads the distinct
  configs, not the members.  Once nothing is missing, one heartbeat is
  handed the round's computation (a lease of COMPUTE_LEASE_MS); the others
  answer none until it is stored.

  KEYS[1..5]  base, policy, nodes, stats, expiry
  KEYS[6]     cpucfg:<cluster>  hash:
                m:<node>     digest of the member's config, "" = none yet,
                             "stored" = has one of unknown digest
                missing      members without a config
                epoch        bumped on join / change
                result       intersection JSON for result_epoch ("" = invalid input)
                result_epoch the epoch result belongs to
                sent:<node>  epoch last delivered to the member
                counted      the epoch up to which cpucfg-configs:<cluster> is
                             exact (a replica of an older version moves the
                             epoch without counting: the next computation goes
                             over every member and counts again)
                narrow       "1" once a member left whose config no other member
                             has (its count), until the round is computed again
                             (no result kept meanwhile)
                extend_epoch, extend_by  a round a new member with a config no
                             member had started from a current result (kept
                             in `result`): computed from that result and
                             extend_by's config alone
                compute_epoch, compute_until  the computation's lease (ms)
  ARGV[1]     op | op: "ingest" (after a heartbeat) | "store" (a computed result)
  ARGV[2]     node_id
  ARGV[3]     cluster_id
  ARGV[4]     digest | epoch: ingest: the digest of the config this heartbeat
              carried ("" = none); store: the epoch the result was computed for
  ARGV[5]     restarted | result: ingest: "1" when the node restarted;
              store: the result JSON ("" = invalid)

  Returns {kind "deliver", config (JSON)} | {kind "none"} |
          {kind "compute", epoch, configs...} (configs: node, config, node, config, ...:
          each counted config once, node ""; or, counts not exact, one member
          per config digest and every member of unknown digest; or the result
          so far, node "", and a new member's config)
  Errors: NO_POLICY (no policy)
  Writes: KEYS[6]; cpucfg-missing:<cluster>, cpucfg-configs:<cluster>
          (derived from KEYS[6], the same hash slot; cpucfg-configs holds
          n:<digest>, the members with that config, and c:<digest>, the
          config); node:<id> cpu_config_digest, cpucfg_cluster
]]
-- @include cpu_config
return cpu_config_one(ctx, ARGV, KEYS[6])
