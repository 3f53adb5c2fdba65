-- Dispatch the next items of the shard, one at a time as by a loop of single dequeues: strict
-- tier priority, then start-time fair queueing among the tenants of the tier, then among the
-- tenant's fairness keys (fq_head), then the key's earliest-due partition head, admitted in the
-- same atomic step: the tenant's step rate and slot, then its pool's and connection's
-- (admit_lib.lua), all taken or none.
-- KEYS[1] = the shard's timers ZSET (it routes the call).
-- ARGV[1..FQ_HEADER] = fq_init; then: lease (ms); how many due timers to promote; how many
-- tenants to look at per item; how many items at most; the kind of item to take ("" any: the
-- call stops, changing nothing of it, at an item of another kind that the fair order gives
-- next); the kinds of item that the caller's credits do not bound (comma-separated, "" none), and
-- how many of those at most, beside the others; the tiers to serve, highest first. With such
-- kinds, a tenant whose head is of the class whose count is reached is set aside for the rest of
-- the call, its start tag kept: it is first in the fair order again once the call ends.
-- Returns {status, item...}: each item {tenant, item, tier, partition, payload, waited ms,
-- attempt, delivery token, lease expiry (ms, Redis clock), connection chosen ("" for none),
-- why it was chosen}; status "again" when a work bound was reached before the call found all it
-- could (call again), else "done".
fq_init(ARGV)
local A = FQ_HEADER
local lease_ms = tonumber(ARGV[A + 1])
local want = tonumber(ARGV[A + 4])
local only_kind = ARGV[A + 5]
local free_kinds = {}
for kind in string.gmatch(ARGV[A + 6], '[^,]+') do free_kinds[kind] = true end
local any_free = next(free_kinds) ~= nil
local free_want = tonumber(ARGV[A + 7])
local FIRST_TIER = A + 8
local timers = fq_gkey('timers')
-- What serve answers for an item of another kind than only_kind: the call ends there.
local STOP = {}
-- What serve answers for an item of a class (free_kinds', or the others) taken as many times as
-- wanted: its tenant is set aside.
local SKIP = {}
local served, served_free = 0, 0
local set_aside = {}
-- At most this many tenants set aside per call: a dispatcher out of credits, with many tenants
-- whose next items need one, looks at no more of them each round.
local MAX_SET_ASIDE = 16

local function room()
  return served < want or (any_free and served_free < free_want)
end

-- The tenants set aside go back where they were, each with its start tag.
local function restore()
  for _, s in ipairs(set_aside) do redis.call('ZADD', s[1], s[2], s[3]) end
  set_aside = {}
end

-- Due timers: those tenants' tiers are looked at again (bounded per call).
for _, member in ipairs(redis.call('ZRANGEBYSCORE', timers, '-inf', fq.now, 'LIMIT', 0, tonumber(ARGV[A + 2]))) do
  redis.call('ZREM', timers, member)
  local tier, tid = fq_split(member)
  redis.call('SREM', fq_gkey('blocked:' .. tier), tid)
  fq_activate(tier, tid)
end

-- The confs of one tenant's admission scopes, read once per call.
local function scopes_of(tid)
  local seen = {}
  return function(field)
    if seen[field] == nil then seen[field] = fq_scope_conf(tid, field) or false end
    return seen[field] or nil
  end
end

-- A head its pool or connection cannot admit now waits: parked on the pool (a freed slot wakes
-- it) and/or looked at again at `d.at`; among the waiters of each queue share it waits on, at
-- the tenant's start tag `tag`. The tenant's other partitions are served meanwhile.
local function park(tid, tier, tag, part, key, due, pool, d)
  local parts = fq_parts(tid, tier, key)
  if d.park then redis.call('ZADD', fq_tkey(tid, 'w:' .. pool), fq_num(due), tier .. '|' .. part) end
  for _, share in ipairs(d.shares or {}) do
    redis.call('ZADD', fq_gkey('sw:' .. tier .. ':' .. share), fq_num(tag), tid .. '|' .. pool)
  end
  if d.at then
    redis.call('ZADD', parts, fq_num(d.at), part)
  else
    redis.call('ZREM', parts, part)
  end
end

-- Take the item's slots (the tenant's, its pool's and connection's: all or none), then charge
-- its rates. Returns cap_acquire's answer (1 taken, 0 a scope was full, -1 a lease conflict).
local function take(tid, id, conf, d)
  local scopes, limits = {}, {}
  if conf.limit >= 0 then scopes[1], limits[1] = fq.tprefix .. tid .. fq.scope, conf.limit end
  for i, key in ipairs((d and d.scopes) or {}) do
    scopes[#scopes + 1], limits[#limits + 1] = key, d.limits[i]
  end
  if #scopes > 0 then
    local taken = cap_acquire(fq_holder_record(tid, id), scopes, limits, FQ_HOLDER .. id, lease_ms, fq.now)
    if taken ~= 1 then return taken end
  end
  if conf.rate > 0 then cap_gcra(fq_rate_key(tid), fq_interval_us(conf), conf.burst, 1, true, fq.now_us) end
  if d then ad_commit(d) end
  return 1
end

-- The item leaves the queue, leased; the tenant moves on in the tier (SFQ). Returns its row.
local function dispatch(tid, tier, tag, conf, part, key, ktag, id, it, d)
  local expiry = fq.now + lease_ms
  local ready = fq_gkey('ready:' .. tier)
  redis.call('ZREM', fq_pkey(tid, tier, part), id)
  redis.call('ZREM', fq_tkey(tid, 'wait:' .. tier), id)
  fq_drop_part(tid, tier, part, key)
  redis.call('HSET', fq_tkey(tid, 'locks'), part, id)
  it.state, it.n, it.lease = 'inflight', (it.n or 0) + 1, expiry
  it.token = redis.call('INCR', fq_tkey(tid, 'seq'))
  it.conn = d and d.conn
  it.share = d and d.share
  local cost = fq_charge(tid, it)
  it.charged, it.at = cost, fq.now_us
  fq_save(tid, id, it)
  redis.call('ZADD', fq_gkey('inflight'), expiry, tid .. '|' .. id)
  redis.call('HINCRBY', fq_tkey(tid, 'flight'), tier, 1)
  -- SFQ: V = start tag of the item in service; the tenant's next start = its finish tag.
  redis.call('SET', fq_gkey('vtime:' .. tier), fq_num(tag))
  local finish = tag + cost / conf.weight
  fq_kserved(tid, tier, key, ktag, cost)
  local next_part, next_due = fq_head(tid, tier)
  if next_part ~= nil and next_due <= fq.now then
    redis.call('ZADD', ready, fq_num(finish), tid)
  else
    fq_leave(tier, tid, finish)
    if next_due ~= nil then fq_set_timer(tier, tid, math.max(next_due, fq.now + 1)) end
  end
  return {tid, id, tier, part, it.payload, math.max(0, fq.now - it.due), it.n, it.token, expiry,
    (d and d.conn) or '', (d and d.why) or ''}
end

-- Serve the tenant's head partition `part` of `tier`, due at `due`: its item's row, or nil when
-- the tenant or the partition had to wait (parked, or on a timer): look at the tier again.
local function serve(tid, tier, tag, part, key, ktag, conf_of)
  local pkey = fq_pkey(tid, tier, part)
  local parts = fq_parts(tid, tier, key)
  local id = redis.call('ZRANGE', pkey, 0, 0)[1]
  local it = id and fq_item(tid, id)
  if not it then
    -- An index entry without its item (never written so): drop it rather than stall.
    if id then redis.call('ZREM', pkey, id) end
    if redis.call('ZCARD', pkey) == 0 then redis.call('ZREM', parts, part) end
    return nil
  end
  if it.due > fq.now then
    -- The partition's score must be its head's due time; never dispatch early on a stale one.
    redis.call('ZADD', parts, fq_num(it.due), part)
    return nil
  end
  if only_kind ~= '' and (it.kind or '') ~= only_kind then return STOP end
  local free = any_free and free_kinds[it.kind or ''] == true
  if (free and served_free >= free_want) or (not free and served >= want) then return SKIP end
  local conf = fq_conf(tid)
  if conf.suspended then
    fq_suspend(tier, tid, tag)
    return nil
  end
  local rate_wait = fq_rate_wait_ms(tid, conf)
  if rate_wait > 0 then
    fq_leave(tier, tid, tag)
    fq_set_timer(tier, tid, fq.now + rate_wait)
    return nil
  end
  if conf.limit >= 0 and cap_in_flight(fq.tprefix .. tid .. fq.scope, fq.now) >= conf.limit then
    fq_block(tier, tid, tag)
    return nil
  end
  local pool = it.scope and conf_of('pool:' .. it.scope)
  local d = pool and ad_decide(tid, it.scope, pool, conf_of)
  if d and not d.ok then
    park(tid, tier, tag, part, key, fq_score(it), it.scope, d)
    return nil
  end
  local taken = take(tid, id, conf, d)
  if taken == -1 then
    return redis.error_reply('fair queue: capacity holder ' .. FQ_HOLDER .. id .. ' holds other scopes')
  elseif taken == 0 then
    fq_block(tier, tid, tag)
    return nil
  end
  if free then served_free = served_free + 1 else served = served + 1 end
  return dispatch(tid, tier, tag, conf, part, key, ktag, id, it, d)
end

-- The next item, or nil when none is eligible, or false when the tenant budget ran out first.
local function next_item()
  local budget = tonumber(ARGV[A + 3])
  for t = FIRST_TIER, #ARGV do
    local tier = ARGV[t]
    local ready = fq_gkey('ready:' .. tier)
    while budget > 0 do
      local top = redis.call('ZRANGE', ready, 0, 0, 'WITHSCORES')
      if top[1] == nil then break end
      budget = budget - 1
      local tid, tag = top[1], tonumber(top[2])
      local part, due, key, ktag = fq_head(tid, tier)
      if part == nil then
        fq_leave(tier, tid, tag)
        if due ~= nil then fq_set_timer(tier, tid, math.max(due, fq.now + 1)) end
      elseif due > fq.now then
        fq_leave(tier, tid, tag)
        fq_set_timer(tier, tid, due)
      elseif redis.call('HEXISTS', fq_tkey(tid, 'locks'), part) == 1 then
        -- Locked by an item of another tier: it comes back when that one leaves flight.
        fq_drop_part(tid, tier, part, key)
      else
        local row = serve(tid, tier, tag, part, key, ktag, scopes_of(tid))
        if row == STOP then return nil end
        if row == SKIP then
          redis.call('ZREM', ready, tid)
          set_aside[#set_aside + 1] = {ready, fq_num(tag), tid}
          if #set_aside >= MAX_SET_ASIDE then return nil end
        elseif row then
          return row
        end
      end
    end
  end
  -- Out of budget: look again in another call, unless tenants were set aside, which that call
  -- would find first again: then the call ends here (a bound on what one passes over).
  if budget == 0 and #set_aside == 0 then return false end
  return nil
end

local out = {'done'}
while room() do
  local item = next_item()
  if item == false then
    out[1] = 'again'
    break
  elseif item == nil then
    break
  elseif item.err then
    restore()
    return item
  end
  out[#out + 1] = item
end
restore()
if room() and redis.call('ZCOUNT', timers, '-inf', fq.now) > 0 then
  out[1] = 'again'
end
fq_wake_if_ready()
return out
