-- Admission of an item's pool and connection: the Lua shared by fq_dequeue.lua (which takes
-- what it decides, in the same atomic step as the dispatch) and fq_admit_peek.lua (which only
-- explains it: routing's dry run). Loaded after capacity_lib.lua and fq_lib.lua.
--
-- An item routed to a pool carries the pool's id (it.scope). The pool's conf and its
-- connections' are the tenant's "scopes" hash fields (see fq_lib.lua): the pool's concurrency
-- and rate, its strategy and members ([connection id, weight, priority], in priority order),
-- each connection's concurrency and rate. Admission, for the partition head at dequeue:
--   1. the pool has a free slot and its rate admits a start;
--   2. one of its connections is eligible (breaker not open, a free slot, its rate admits a
--      start), chosen by the pool's strategy among the eligible ones.
-- A connection may also name a *queue share* (a celery connection to a queue of the team's
-- workers that has a number of slots: its conf's share and share_limit): the slots of that
-- queue, counted across every tenant of the shard (key <gprefix>cap:<share>). A connection
-- whose queue is at its slots is not eligible; the head is parked on the pool and recorded in
-- the share's waiters (<gprefix>sw:<tier>:<share>: "<tenant>|<pool>" -> the tenant's start tag),
-- and a freed slot of the queue wakes the waiter with the smallest tag (fq_wake_share), so the
-- queue's slots go to tenants in the fair order, where the team's workers start the work.
-- Then the dispatch takes the slots (with the tenant's, in one cap_acquire: all or none),
-- charges the rates and advances the strategy (ad_commit): a round-robin turn is used once
-- per dispatched attempt, never by a look.
-- Otherwise nothing is taken and the decision says how the partition waits: parked on the
-- pool (woken when a slot of the pool or of one of its connections frees: fq_wake_for) and/or
-- looked at again at a time (a rate, a breaker's cooldown).

-- A pool that waits on nothing that would wake it (a limit of 0, only weightless members) is
-- looked at again after this long (a changed conf also wakes it at once).
local AD_RECHECK_MS = 5000
-- The limit a scope without one is taken with: every dispatch holds a slot of its pool and of its
-- connection, so that their items in flight are counted (least in-flight, the dry run, "why").
local AD_UNLIMITED = 2147483647

local function ad_scope_key(tid, kind, id)
  return fq.tprefix .. tid .. fq.cap .. kind .. ':' .. id
end

local function ad_rate_key(tid, kind, id)
  return fq.tprefix .. tid .. fq.rates .. kind .. ':' .. id
end

local function ad_rr_key(tid, pool)
  return fq.tprefix .. tid .. fq.rr .. pool
end

-- ms until a scope's GCRA limiter admits one start (0: now, or no rate).
local function ad_rate_wait(key, conf)
  local rate = tonumber(conf.rate) or 0
  if rate <= 0 then return 0 end
  local r = cap_gcra(key, 1000000 / rate, tonumber(conf.burst) or 1, 1, false, fq.now_us)
  if r[1] == 1 then return 0 end
  return fq_wait_ms(r[2])
end

-- One member connection as admission sees it now: its slots, its breaker, its rate.
local function ad_member(tid, member, conf_of)
  local c = {id = member[1], weight = tonumber(member[2]) or 0, priority = tonumber(member[3]) or 0}
  c.conf = conf_of('connection:' .. c.id) or {limit = -1, rate = 0}
  c.limit = tonumber(c.conf.limit) or -1
  c.key = ad_scope_key(tid, 'connection', c.id)
  c.live = cap_in_flight(c.key, fq.now)
  local open_until = tonumber(redis.call('HGET', fq.tprefix .. tid .. fq.breaker .. c.id, 'open_until'))
  c.breaker = 'closed'
  if open_until ~= nil then c.breaker = (open_until > fq.now) and 'open' or 'half_open' end
  if c.breaker == 'open' then
    c.eligible, c.wait_at, c.why = false, open_until, 'circuit breaker open'
    return c
  end
  if c.limit >= 0 and c.live >= c.limit then
    c.eligible, c.full, c.why = false, true, 'at its concurrency limit (' .. c.limit .. ')'
    return c
  end
  if c.conf.share then
    c.share_key, c.share_limit = fq_gkey('cap:' .. c.conf.share), tonumber(c.conf.share_limit) or -1
    if c.share_limit >= 0 and cap_in_flight(c.share_key, fq.now) >= c.share_limit then
      c.eligible, c.full, c.share_full = false, true, c.conf.share
      c.why = 'its queue ' .. c.conf.share .. ' at its slots (' .. c.share_limit .. ')'
      return c
    end
  end
  local wait = ad_rate_wait(ad_rate_key(tid, 'connection', c.id), c.conf)
  if wait > 0 then
    c.eligible, c.wait_at, c.why = false, fq.now + wait, 'at its rate limit'
    return c
  end
  c.eligible = true
  c.why = (c.breaker == 'half_open') and 'half-open: trial call' or 'available'
  return c
end

-- Smooth weighted round robin among the eligible members: over any run of dispatches each gets
-- its weight's share, interleaved. Returns the chosen one, why, and the weights to store.
local function ad_weighted(tid, pool, eligible)
  local key = ad_rr_key(tid, pool) .. ':w'
  local total, best, store = 0, nil, {}
  for i, c in ipairs(eligible) do
    local w = math.max(c.weight, 0)
    c.current = (tonumber(redis.call('HGET', key, c.id)) or 0) + w
    total = total + w
    if w > 0 and (best == nil or c.current > eligible[best].current) then best = i end
  end
  if best == nil then return nil, 'every eligible connection has weight 0', nil end
  for i, c in ipairs(eligible) do
    store[#store + 1] = c.id
    store[#store + 1] = fq_num((i == best) and (c.current - total) or c.current)
  end
  local chosen = eligible[best]
  return chosen, 'weighted: ' .. chosen.weight .. ' of ' .. total, {key = key, fields = store}
end

-- The pool's strategy among the eligible members: the chosen one (or nil), why, and what
-- ad_commit stores when the attempt is dispatched.
local function ad_choose(tid, pool, strategy, cands)
  local eligible = {}
  for _, c in ipairs(cands) do
    if c.eligible then eligible[#eligible + 1] = c end
  end
  if #eligible == 0 then return nil, 'no eligible connection in the pool', nil end
  if strategy == 'failover' then
    return eligible[1], 'failover: first available by priority (' .. eligible[1].priority .. ')', nil
  elseif strategy == 'least_inflight' then
    local best = eligible[1]
    for i = 2, #eligible do
      if eligible[i].live < best.live then best = eligible[i] end
    end
    return best, 'least in-flight (' .. best.live .. ')', nil
  elseif strategy == 'weighted' then
    return ad_weighted(tid, pool, eligible)
  end
  local key = ad_rr_key(tid, pool)
  local turn = (tonumber(redis.call('GET', key)) or 0) + 1
  return eligible[(turn % #eligible) + 1], 'round robin: turn ' .. turn, {rr = key}
end

-- Why a pool with no eligible connection waits, and how: parked (a member is only full) and/or
-- looked at again at the earliest time a time-blocked member (breaker, rate) could pass.
local function ad_no_connection(d, cands)
  d.shares = {}
  for _, c in ipairs(cands) do
    if c.full then d.park = true end
    if c.share_full then d.shares[#d.shares + 1] = c.share_full end
    if c.wait_at and (d.at == nil or c.wait_at < d.at) then d.at = c.wait_at end
  end
  if not d.park and d.at == nil then d.at = fq.now + AD_RECHECK_MS end
  return d
end

-- Decide the admission of the tenant's pool `pool` (its conf `p`) now; conf_of(field) gives
-- the connections' confs. Reads only. Returns the decision:
--   ok = true: scopes (keys) and limits to take, rates ({key, conf}) to charge, conn (the
--     chosen connection id or nil), why, and what ad_commit stores;
--   ok = false: park (wait for a slot of the pool) and/or at (look again then), why.
-- Either way `pool_live` and `cands` (the members as seen) explain it.
local function ad_decide(tid, pool, p, conf_of)
  local d = {ok = false, scopes = {}, limits = {}, rates = {}, cands = {}}
  local limit = tonumber(p.limit) or -1
  local pool_key = ad_scope_key(tid, 'pool', pool)
  d.pool_live, d.pool_limit = cap_in_flight(pool_key, fq.now), limit
  if limit >= 0 and d.pool_live >= limit then
    d.park, d.why = true, 'pool at its concurrency limit (' .. limit .. ')'
    if limit == 0 then d.at = fq.now + AD_RECHECK_MS end
    return d
  end
  local pool_rate = ad_rate_key(tid, 'pool', pool)
  local wait = ad_rate_wait(pool_rate, p)
  if wait > 0 then
    d.at, d.why = fq.now + wait, 'pool at its rate limit'
    return d
  end
  for _, member in ipairs(p.members or {}) do
    d.cands[#d.cands + 1] = ad_member(tid, member, conf_of)
  end
  d.scopes[#d.scopes + 1], d.limits[#d.limits + 1] = pool_key, (limit >= 0) and limit or AD_UNLIMITED
  if (tonumber(p.rate) or 0) > 0 then d.rates[#d.rates + 1] = {pool_rate, p} end
  if #d.cands == 0 then
    d.ok, d.why = true, 'the pool has no connections: the step runs without one'
    return d
  end
  local chosen, why, store = ad_choose(tid, pool, p.strategy, d.cands)
  d.why = why
  if chosen == nil then return ad_no_connection(d, d.cands) end
  d.ok, d.conn, d.store = true, chosen.id, store
  d.scopes[#d.scopes + 1], d.limits[#d.limits + 1] = chosen.key, (chosen.limit >= 0) and chosen.limit or AD_UNLIMITED
  if chosen.share_key then
    d.share = chosen.conf.share
    d.scopes[#d.scopes + 1] = chosen.share_key
    d.limits[#d.limits + 1] = (chosen.share_limit >= 0) and chosen.share_limit or AD_UNLIMITED
  end
  if (tonumber(chosen.conf.rate) or 0) > 0 then
    d.rates[#d.rates + 1] = {ad_rate_key(tid, 'connection', chosen.id), chosen.conf}
  end
  return d
end

-- A decision as the read-only scripts answer it (fq_admit_peek.lua, fq_why.lua): {admitted 1/0,
-- connection chosen or "", why, parked on the pool 1/0, look again at (ms) or -1, the pool's live
-- leases, its limit (-1: none), {per member: id, breaker, live leases, limit, eligible 1/0, why,
-- open until (ms) while its breaker is open, else -1}}.
local function ad_view(d)
  local members = {}
  for _, c in ipairs(d.cands) do
    members[#members + 1] = {c.id, c.breaker, c.live, c.limit, c.eligible and 1 or 0, c.why,
      (c.breaker == 'open' and c.wait_at) or -1}
  end
  return {d.ok and 1 or 0, d.conn or '', d.why or '', d.park and 1 or 0, d.at or -1, d.pool_live, d.pool_limit,
    members}
end

-- The attempt was dispatched with what `d` decided: charge its rates, advance its strategy.
local function ad_commit(d)
  for _, r in ipairs(d.rates) do
    local rate = tonumber(r[2].rate)
    cap_gcra(r[1], 1000000 / rate, tonumber(r[2].burst) or 1, 1, true, fq.now_us)
  end
  if d.store == nil then return end
  if d.store.rr then redis.call('INCR', d.store.rr) end
  if d.store.key then redis.call('HSET', d.store.key, unpack(d.store.fields)) end
end
