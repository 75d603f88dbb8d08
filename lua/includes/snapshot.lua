--[[
  includes/snapshot.lua: what a heartbeat reads of the record it updates,
  defined once (a library's includes load once per server; a script body
  runs per call).  The heartbeat's field tables (SNAPSHOT_FIELDS,
  INDEX_FIELDS, WHOLE_FIELDS) are in includes/constants, generated from
  scheduler/records.py NodeSnapshot.
]]
-- what a heartbeat reads of the record it updates
local PREV = { 'service_instance_id', 'create_successes', 'roster_mode', 'acked_count', 'static',
  'cluster_id', 'p2p_address', 'generation', 'endpoint', 'roster_digest', 'idx', 'incarnation',
  'forgetting', 'roster_size' }
