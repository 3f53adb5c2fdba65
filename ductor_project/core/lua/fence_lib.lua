-- The fence of a tenant that moves between shards (ductor_project/core/tenant_moves.py): every
-- script that acts on one tenant's keys calls fence_check first, with the tenant's fence key in
-- the slot it runs in, and returns what it gives when that is not nil: an error reply, while the
-- tenant's keys are copied out of this shard ("TENANT_MOVING") or after ("TENANT_MOVED <shard>"),
-- so that nothing is written here any more. One GET.
local function fence_check(key)
  local state = redis.call('GET', key)
  if not state then return nil end
  return redis.error_reply('TENANT_' .. state)
end
