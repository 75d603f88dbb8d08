--[[
  includes/snapshot.lua: the heartbeat's field tables, defined once (a
  library's includes load once per server; a script body runs per call).
]]
local SNAPSHOT_FIELDS = {
  cluster_id = true, version = true, commit = true, status = true,
  allocated_cpu = true, allocated_memory_bytes = true, cpu_percent = true, cpu_count = true,
  memory_used_bytes = true, memory_total_bytes = true, disks = true, sandbox_count = true,
  sandbox_starting_count = true, create_successes = true, create_fails = true,
  reported_at_unix_ms = true, paused_sandbox_count = true, paused_allocated_cpu = true,
  paused_allocated_memory_bytes = true, cpu_family = true, cpu_model = true,
  cpu_model_name = true, cpu_architecture = true, cpu_config_json = true,
  p2p_backend = true, p2p_address = true,
}
-- fields that can move a node in the placement index (or in or out of it);
-- observed utilisation only matters when a ceiling on it is configured
local INDEX_FIELDS = { 'status', 'allocated_cpu', 'allocated_memory_bytes', 'cpu_count',
  'memory_total_bytes', 'sandbox_count', 'sandbox_starting_count', 'paused_sandbox_count',
  'paused_allocated_cpu', 'paused_allocated_memory_bytes' }
local WHOLE_FIELDS = {
  allocated_cpu = true, allocated_memory_bytes = true, cpu_count = true, memory_total_bytes = true,
  sandbox_count = true, sandbox_starting_count = true, paused_sandbox_count = true,
  paused_allocated_cpu = true, paused_allocated_memory_bytes = true, cpu_percent = true,
  memory_used_bytes = true,
}
-- what a heartbeat reads of the record it updates
local PREV = { 'service_instance_id', 'create_successes', 'roster_mode', 'acked_count', 'static',
  'cluster_id', 'p2p_address', 'generation', 'endpoint', 'roster_digest', 'idx', 'incarnation',
  'forgetting' }
