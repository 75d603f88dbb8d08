--[[
  includes/snapshot.lua: what a heartbeat reads of the record it updates,
  defined once (a library's includes load once per server; a script body
  runs per call).  The heartbeat's field tables (SNAPSHOT_FIELDS,
  INDEX_FIELDS, WHOLE_FIELDS) are in includes/constants, generated from
  scheduler/records.py NodeSnapshot.
]]
-- @include index
-- what a heartbeat reads of the record it updates: PREV, then HB_NODE, the
-- node as decisions read it but for what its bucket id spells (the snapshot's
-- counts and capacities, when it is indexed: includes/index.lua)
local PREV = { 'service_instance_id', 'create_successes', 'roster_mode', 'acked_count', 'static',
  'cluster_id', 'p2p_address', 'generation', 'endpoint', 'roster_digest', 'idx', 'incarnation',
  'forgetting', 'roster_size', 'idx_seen_ms', 'seen_ms' }
local HB_NODE = { 'lingering', 'status', 'cpu_percent', 'memory_used_bytes', 'pending_count',
  'pending_cpu', 'pending_memory_bytes' }
local HB_READ = {}
-- (plain loops: a library's load runs with no globals, not even ipairs)
for i = 1, #PREV do HB_READ[i] = PREV[i] end
for i = 1, #HB_NODE do HB_READ[#PREV + i] = HB_NODE[i] end
