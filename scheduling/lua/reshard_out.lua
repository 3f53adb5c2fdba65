-- The first step of a tenant's move to another shard (scheduling/resharding.py): fence it here
-- and take it out of this shard's indexes, in one atomic step.
-- KEYS[1] = the tenant's fence in this shard (fence_lib.lua). ARGV[1..FQ_HEADER] = fq_init;
-- ARGV[A + 1] = tenant id.
-- From the fence on, every tenant-side script here answers TENANT_MOVING, and the dispatcher
-- side no longer finds the tenant: nothing of it changes here any more. What the shard's indexes
-- held of it is written to its key fq:moved-out, copied with its other keys and read by
-- reshard_in.lua: its start and finish tags per tier (relative to this shard's virtual time, so
-- that it keeps its place), its timers, its parked tiers, its items in flight with their lease
-- ends (and queue-share slots), and its waits on queue shares.
-- Returns 1, or 0 when the fence was already up (the step run again), or the fence's own answer
-- when the tenant had already moved away from here.
fq_init(ARGV)
local A = FQ_HEADER
local tid = ARGV[A + 1]
local state = redis.call('GET', KEYS[1])
if state == 'MOVING' then return 0 end
if state then return redis.error_reply('TENANT_' .. state) end
redis.call('SET', KEYS[1], 'MOVING')

local out = {tiers = {}, inflight = {}, waiters = {}}
local timers = fq_gkey('timers')
for _, tier in ipairs(fq.tiers) do
  local v, t = fq_vtime(tier), {}
  local ready, finish = fq_gkey('ready:' .. tier), fq_gkey('finish:' .. tier)
  local tag = redis.call('ZSCORE', ready, tid)
  if tag then t.ready = fq_num(tonumber(tag) - v) end
  local last = redis.call('HGET', finish, tid)
  if last then t.finish = fq_num(tonumber(last) - v) end
  if redis.call('SREM', fq_gkey('blocked:' .. tier), tid) == 1 then t.blocked = 1 end
  local at = redis.call('ZSCORE', timers, fq_timer_member(tier, tid))
  if at then t.timer = at end
  redis.call('ZREM', ready, tid)
  redis.call('HDEL', finish, tid)
  redis.call('ZREM', timers, fq_timer_member(tier, tid))
  out.tiers[tier] = t
end

-- Items in flight: each holds its partition's lock.
local inflight = fq_gkey('inflight')
local locks = redis.call('HVALS', fq_tkey(tid, 'locks'))
for _, id in ipairs(locks) do
  local member = tid .. '|' .. id
  local lease = redis.call('ZSCORE', inflight, member)
  if lease then
    redis.call('ZREM', inflight, member)
    local entry = {id, lease}
    local it = fq_item(tid, id)
    if it and it.share then
      local cap = fq_gkey('cap:' .. it.share)
      local slot = redis.call('ZSCORE', cap, FQ_HOLDER .. id)
      if slot then
        entry[3], entry[4] = it.share, slot
        redis.call('ZREM', cap, FQ_HOLDER .. id)
      end
    end
    out.inflight[#out.inflight + 1] = entry
  end
end

-- Waits on queue shares: "<tenant>|<pool>" in sw:<tier>:<share>, for its pools and the shares of
-- its connections.
local pools, shares = {}, {}
local scopes = redis.call('HGETALL', fq_tkey(tid, 'scopes'))
for i = 1, #scopes, 2 do
  local kind, id = string.match(scopes[i], '^(%a+):(.+)$')
  if kind == 'pool' then
    pools[#pools + 1] = id
  elseif kind == 'connection' then
    local share = cjson.decode(scopes[i + 1]).share
    if type(share) == 'string' then shares[share] = true end
  end
end
for _, tier in ipairs(fq.tiers) do
  local v = fq_vtime(tier)
  for share in pairs(shares) do
    local key = fq_gkey('sw:' .. tier .. ':' .. share)
    for _, pool in ipairs(pools) do
      local tag = redis.call('ZSCORE', key, tid .. '|' .. pool)
      if tag then
        out.waiters[#out.waiters + 1] = {tier, share, pool, fq_num(tonumber(tag) - v)}
        redis.call('ZREM', key, tid .. '|' .. pool)
      end
    end
  end
end

redis.call('ZREM', fq_gkey('backlog'), tid)
redis.call('SET', fq_tkey(tid, 'moved-out'), cjson.encode(out))
return 1
