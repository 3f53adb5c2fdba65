-- The tiered fair queue: the Lua shared by every fq_*.lua script. scheduling/fair_queue/layout.py
-- prepends capacity_lib.lua and then this file to each script body (ductor_project/core/scripts.py).
--
-- Every script gets the same FQ_HEADER ARGV first (fq_init): the shard's tenant-key prefix
-- ("{s<n>}:t:"), the tenant-relative suffixes of the fair-queue namespace (":fq:"), of the
-- tenant's step scope, of a capacity holder record and of the step-rate limiter, the
-- shard's global fair-queue prefix ("{s<n>}:g:fq:"), the tiers, highest first, comma
-- separated, then the tenant-relative prefixes of capacity scopes (":cap:"), of rate
-- limiters (":rate:"), of connection breakers (":breaker:"), of a pool's round-robin
-- state (":rr:") and the tenant's fence (":moved", fence_lib.lua), then how items are charged: the cost mode ("time" or "items"), the most
-- one item is charged (ms) and what a kind of item nobody has measured yet is estimated at
-- (ms), and "1" when the call is one of a worker's handoff round trip, whose ready-wakes wait
-- for its dequeue (fq_wake), else "0". Python derives all of them from ductor_project.core.keys and .capacity,
-- scheduling.circuit and tenants.models.Tier, so key formats and tiers live there; a script
-- reads tenant ids from the shard's global indexes and builds those tenants' keys as
-- prefix .. id .. suffix. All of them carry the shard's hash tag: a script stays in one
-- Redis Cluster slot.
--
-- Tenant keys (<prefix><tenant>:fq:...):
--   conf               HASH  weight, max_concurrency (-1: none), rate_per_s (0: none), burst,
--                            suspended (1/0), status_version (the tenant row it was read from)
--   items              HASH  item -> JSON {tier, partition, cost, payload, state, due, n
--                            (deliveries so far), lease, token (of the delivery in flight),
--                            again, again_payload, scope (its pool), conn (the connection its
--                            dispatch holds), kind, order (its order key, ms), charged (what
--                            its dispatch charged), at (when it was dispatched, µs), key (its
--                            fairness key, absent for ""), fails (its handler's failures in a
--                            row, fq_nack)}; state is "waiting" or "inflight"
--   est                HASH  kind -> the tenant's moving average of that kind's work (ms)
--   seq                STRING the last delivery token (tokens are unique per tenant)
--   parts:<tier>       ZSET  unlocked partition of no fairness key -> score of its head in that tier
--                            (fq_score); parts:<tier>:<key> the same for fairness key <key>
--   kready:<tier>      ZSET  fairness key -> its start tag: keys with a due head (the second level)
--   ktimers:<tier>     ZSET  fairness key -> when its earliest head falls due (keys not due yet)
--   kfin:<tier>        ZSET  fairness key -> finish tag of its last service, while above kv
--   kv:<tier>          STRING the tenant's key virtual time: the start tag of its last dispatch
--   kw                 HASH  fairness key -> weight (1 when absent), written by enqueue
--   pkey               HASH  partition -> its fairness key, for partitions of a key other than ""
--   p:<tier>:<part>    ZSET  waiting item -> due time
--   wait:<tier>        ZSET  waiting item -> due time (the tenant's backlog, for stats)
--   locks              HASH  partition -> the item of it that is in flight
--   flight             HASH  tier -> items in flight
--   scopes             HASH  "pool:<id>" -> JSON {limit, rate, burst, strategy, members:
--                            [[connection id, weight, priority], ...]}; "connection:<id>" ->
--                            JSON {limit, rate, burst, pools: [pool ids]} (-1 / 0: none);
--                            written from the routing table by enqueue and configure
--   w:<pool>           ZSET  "<tier>|<partition>" -> head due: partitions parked until a slot
--                            of the pool (or of one of its connections, or of a connection's
--                            queue share) frees
-- Global keys of the shard (<gprefix>...), the only ones that cross tenants:
--   ready:<tier>       ZSET  tenant -> start tag (backlogged, due and, last we looked, admitted)
--   timers             ZSET  "<tier>|<tenant>" -> when to look at that tenant's tier again
--   blocked:<tier>     SET   tenants parked at their concurrency ceiling, or suspended
--   finish:<tier>      HASH  tenant -> finish tag of its last service (while not ready)
--   vtime:<tier>       STRING virtual time: the start tag of the last dispatch
--   inflight           ZSET  "<tenant>|<item>" -> lease expiry
--   cap:<share>        ZSET  the slots of a queue share in flight (a capacity scope, admit_lib.lua)
--   sw:<tier>:<share>  ZSET  "<tenant>|<pool>" -> start tag: tenants with heads parked on that
--                            pool because the share's queue was at its slots
--   wake               LIST  one token while there is new ready work (dispatchers BLPOP it)
--   backlog            ZSET  tenant -> its items (waiting or in flight), for tenants that have any
--   work:<bucket>      HASH  tenant -> work (ms) its items finished in that WORK_BUCKET_MS bucket,
--                            "~total" -> all of it, "~weights" -> the weights of those tenants
--
-- Times are ms of Redis TIME. Tags and times always reach Redis through fq_num: Lua's own
-- number-to-string conversion keeps 14 digits only.

-- The capacity holder of a dispatched item is "fq:" .. item id (one namespace per subsystem).
local FQ_HOLDER = 'fq:'
-- A tenant parked at its ceiling is looked at again when its earliest lease ends (a slot
-- may free without passing through the fair queue), or after this long if it holds none
-- (a ceiling of 0; a changed ceiling also wakes it, through the next enqueue).
local FQ_BLOCKED_RECHECK_MS = 5000

-- The number of header ARGV every script starts with; its own arguments follow.
local FQ_HEADER = 16

local fq = {}

local function fq_init(argv)
  fq.tprefix, fq.ns, fq.scope, fq.holder, fq.rate, fq.gprefix =
    argv[1], argv[2], argv[3], argv[4], argv[5], argv[6]
  fq.tiers = {}
  for tier in string.gmatch(argv[7], '[^,]+') do fq.tiers[#fq.tiers + 1] = tier end
  fq.cap, fq.rates, fq.breaker, fq.rr, fq.fence = argv[8], argv[9], argv[10], argv[11], argv[12]
  fq.cost_mode, fq.max_cost, fq.first_cost = argv[13], tonumber(argv[14]), tonumber(argv[15])
  fq.quiet = argv[16] == '1'
  fq.now_us = cap_now_us()
  fq.now = math.floor(fq.now_us / 1000)
end

local function fq_num(x)
  return string.format('%.17g', x)
end

local function fq_tkey(tid, name)
  return fq.tprefix .. tid .. fq.ns .. name
end

-- The tenant's fence in this shard: every tenant-side script returns what this gives, when not
-- nil, before it reads or writes anything of the tenant (its keys are moving to another shard).
local function fq_fenced(tid)
  return fence_check(fq.tprefix .. tid .. fq.fence)
end

local function fq_gkey(name)
  return fq.gprefix .. name
end

local function fq_pkey(tid, tier, part)
  return fq_tkey(tid, 'p:' .. tier .. ':' .. part)
end

local function fq_split(member)
  local sep = string.find(member, '|', 1, true)
  return string.sub(member, 1, sep - 1), string.sub(member, sep + 1)
end

-- A JSON field of one of the tenant's hashes, decoded, or nil.
local function fq_json(tid, name, field)
  local raw = redis.call('HGET', fq_tkey(tid, name), field)
  if not raw then return nil end
  return cjson.decode(raw)
end

local function fq_item(tid, id)
  return fq_json(tid, 'items', id)
end

-- The shard's index of tenants with items (backlog: tenant -> its items, waiting or in flight), kept
-- as items are created and deleted: the metrics find the tenants with work, and the largest, in it.
local function fq_count(tid)
  local n = redis.call('HLEN', fq_tkey(tid, 'items'))
  if n > 0 then
    redis.call('ZADD', fq_gkey('backlog'), n, tid)
  else
    redis.call('ZREM', fq_gkey('backlog'), tid)
    -- Nothing waits or runs: the key level's state is idle, and goes (memory per idle key is nil).
    for _, tier in ipairs(fq.tiers) do
      redis.call('DEL', fq_tkey(tid, 'kready:' .. tier), fq_tkey(tid, 'ktimers:' .. tier),
        fq_tkey(tid, 'kfin:' .. tier), fq_tkey(tid, 'kv:' .. tier))
    end
    redis.call('DEL', fq_tkey(tid, 'pkey'))
  end
end

local function fq_save(tid, id, it)
  if redis.call('HSET', fq_tkey(tid, 'items'), id, cjson.encode(it)) == 1 then fq_count(tid) end
end

local function fq_delete(tid, id)
  redis.call('HDEL', fq_tkey(tid, 'items'), id)
  fq_count(tid)
end

-- An item's score in its partition and among the tenant's partitions: its due time, or, for
-- an item due now, the order key it was enqueued with (its run's start) when that is earlier,
-- so that the tenant's older work goes first. Never after its due time, and after now only
-- when its due time is: a score at or before now means due.
local function fq_score(it)
  if it.order ~= nil and it.due <= fq.now and it.order < it.due then return it.order end
  return it.due
end

local function fq_conf(tid)
  local c = redis.call('HMGET', fq_tkey(tid, 'conf'), 'weight', 'max_concurrency', 'rate_per_s', 'burst',
    'suspended')
  return {
    weight = tonumber(c[1]) or 1,
    limit = tonumber(c[2]) or -1,
    rate = tonumber(c[3]) or 0,
    burst = tonumber(c[4]) or 1,
    suspended = c[5] == '1',
  }
end

local function fq_rate_key(tid)
  return fq.tprefix .. tid .. fq.rate
end

local function fq_interval_us(conf)
  return 1000000 / conf.rate
end

-- ms from fq.now until a GCRA's wait of ``wait_us`` (from fq.now_us) has passed. Counted from
-- the µs clock: fq.now is floored, so fq.now + ceil(wait_us / 1000) can fall short of the moment
-- by up to a ms, and a timer set there would fire before the limiter admits.
local function fq_wait_ms(wait_us)
  return math.max(1, math.ceil((fq.now_us + wait_us) / 1000) - fq.now)
end

-- ms until the tenant's step rate admits one more start (0: now).
local function fq_rate_wait_ms(tid, conf)
  if conf.rate <= 0 then return 0 end
  local r = cap_gcra(fq_rate_key(tid), fq_interval_us(conf), conf.burst, 1, false, fq.now_us)
  if r[1] == 1 then return 0 end
  return fq_wait_ms(r[2])
end

-- Wake the shard's dispatchers. One token at most: a dispatcher that wakes drains everything
-- ready anyway.
local function fq_signal()
  local key = fq_gkey('wake')
  if redis.call('LLEN', key) == 0 then redis.call('LPUSH', key, '1') end
end

-- A tenant's tier became ready: wake the dispatchers, unless the call is one of a worker's
-- handoff round trip (fq.quiet). There the dequeue comes last and takes the next item itself;
-- a dispatcher woken for each of its enqueues and acks would find nothing left (a round of
-- credits and an empty dequeue for every step), so that dequeue wakes them once, for what it
-- leaves ready (fq_wake_if_ready). A timer still wakes them at once (fq_set_timer): their sleep
-- is measured by the earliest.
local function fq_wake()
  if not fq.quiet then fq_signal() end
end

-- At the end of a handoff's dequeue: wake the dispatchers if any tier of the shard has a tenant
-- ready, which that dequeue left (its round trip's wakes were held for this).
local function fq_wake_if_ready()
  if not fq.quiet then return end
  for _, tier in ipairs(fq.tiers) do
    if redis.call('ZCARD', fq_gkey('ready:' .. tier)) > 0 then
      fq_signal()
      return
    end
  end
end

local function fq_timer_member(tier, tid)
  return tier .. '|' .. tid
end

-- Look at the tenant's tier again at `at` (or earlier if a timer already says so). A timer
-- that becomes the shard's earliest wakes the dispatchers, which may be sleeping longer.
local function fq_set_timer(tier, tid, at)
  local key, member = fq_gkey('timers'), fq_timer_member(tier, tid)
  redis.call('ZADD', key, 'LT', fq_num(at), member)
  if redis.call('ZRANGE', key, 0, 0)[1] == member then fq_signal() end
end

-- The second level: a tenant's fairness keys. Inside a tenant's tier its keys are served by SFQ as
-- tenants are in the tier, with the tenant's own key virtual time (kv), start tags (kready), finish
-- tags (kfin), timers (ktimers) and key weights (kw); a key's partitions are served earliest head
-- first. Work without a key is key "". A key holds no state of its own while it has no partition.
-- Keys promoted from their timers, and keys looked at, per call of fq_head: bounded work.
local FQ_KEY_PROMOTE = 16
local FQ_KEY_LOOK = 8

local function fq_parts(tid, tier, key)
  if key == '' then return fq_tkey(tid, 'parts:' .. tier) end
  return fq_tkey(tid, 'parts:' .. tier .. ':' .. key)
end

-- The fairness key of one of the tenant's partitions.
local function fq_key_of(tid, part)
  return redis.call('HGET', fq_tkey(tid, 'pkey'), part) or ''
end

local function fq_kweight(tid, key)
  if key == '' then return 1 end
  return tonumber(redis.call('HGET', fq_tkey(tid, 'kw'), key)) or 1
end

-- Write the weights of some of the tenant's fairness keys: argv[j] is their count, then each key
-- and its weight follow (1, the default, is not stored). Returns the index of the last argument read,
-- and how many weights changed.
local function fq_set_kweights(tid, argv, j)
  local kw, changed = fq_tkey(tid, 'kw'), 0
  for _ = 1, tonumber(argv[j]) do
    local key, weight = argv[j + 1], tonumber(argv[j + 2])
    if (tonumber(redis.call('HGET', kw, key)) or 1) ~= weight then changed = changed + 1 end
    if weight == 1 then
      redis.call('HDEL', kw, key)
    else
      redis.call('HSET', kw, key, weight)
    end
    j = j + 2
  end
  return j, changed
end

local function fq_kvtime(tid, tier)
  return tonumber(redis.call('GET', fq_tkey(tid, 'kv:' .. tier))) or 0
end

-- Put a key where it belongs now: ready (at max(kv, its last finish)) when its earliest head is
-- due, else on a timer for when it will be, else nowhere (it has no partition). A ready key stays.
local function fq_kactivate(tid, tier, key)
  local kready = fq_tkey(tid, 'kready:' .. tier)
  if redis.call('ZSCORE', kready, key) then return end
  local timers = fq_tkey(tid, 'ktimers:' .. tier)
  local h = redis.call('ZRANGE', fq_parts(tid, tier, key), 0, 0, 'WITHSCORES')
  if h[1] == nil then
    redis.call('ZREM', timers, key)
    return
  end
  if tonumber(h[2]) > fq.now then
    redis.call('ZADD', timers, 'LT', h[2], key)
    return
  end
  redis.call('ZREM', timers, key)
  local kfin = fq_tkey(tid, 'kfin:' .. tier)
  local v = fq_kvtime(tid, tier)
  local f = tonumber(redis.call('ZSCORE', kfin, key))
  if f then redis.call('ZREM', kfin, key) end
  redis.call('ZADD', kready, fq_num(math.max(v, f or v)), key)
end

-- The key leaves the ready keys, remembering its tag while it is above kv.
local function fq_kleave(tid, tier, key, tag)
  redis.call('ZREM', fq_tkey(tid, 'kready:' .. tier), key)
  local kfin = fq_tkey(tid, 'kfin:' .. tier)
  if tag > fq_kvtime(tid, tier) then
    redis.call('ZADD', kfin, fq_num(tag), key)
  else
    redis.call('ZREM', kfin, key)
  end
end

-- Partition `part` (of fairness key `key`; nil: look it up) is unlocked with its head scored
-- `score` in the tier (only lowered when `lower`): its key is looked at again.
local function fq_add_part(tid, tier, part, score, lower, key)
  key = key or fq_key_of(tid, part)
  if lower then
    redis.call('ZADD', fq_parts(tid, tier, key), 'LT', score, part)
  else
    redis.call('ZADD', fq_parts(tid, tier, key), score, part)
  end
  fq_kactivate(tid, tier, key)
end

local function fq_drop_part(tid, tier, part, key)
  redis.call('ZREM', fq_parts(tid, tier, key or fq_key_of(tid, part)), part)
end

-- The tenant's head in the tier: the earliest unlocked partition of its ready key with the smallest
-- tag, as (partition, its head's score, key, the key's tag); or (nil, when the earliest key falls
-- due) when none is due; or (nil, nil) when it has no unlocked partition in the tier.
local function fq_head(tid, tier)
  local kready, timers = fq_tkey(tid, 'kready:' .. tier), fq_tkey(tid, 'ktimers:' .. tier)
  for _, key in ipairs(redis.call('ZRANGEBYSCORE', timers, '-inf', fq.now, 'LIMIT', 0, FQ_KEY_PROMOTE)) do
    redis.call('ZREM', timers, key)
    fq_kactivate(tid, tier, key)
  end
  for _ = 1, FQ_KEY_LOOK do
    local top = redis.call('ZRANGE', kready, 0, 0, 'WITHSCORES')
    if top[1] == nil then break end
    local key, tag = top[1], tonumber(top[2])
    local h = redis.call('ZRANGE', fq_parts(tid, tier, key), 0, 0, 'WITHSCORES')
    if h[1] == nil then
      fq_kleave(tid, tier, key, tag)
    elseif tonumber(h[2]) > fq.now then
      fq_kleave(tid, tier, key, tag)
      redis.call('ZADD', timers, 'LT', h[2], key)
    else
      return h[1], tonumber(h[2]), key, tag
    end
  end
  if redis.call('ZCARD', kready) > 0 then return nil, fq.now end  -- more keys to look at: soon
  local t = redis.call('ZRANGE', timers, 0, 0, 'WITHSCORES')
  if t[1] == nil then
    -- Partitions queued before keys existed (an upgrade) are of no key, and that key may be
    -- known to neither set: look at it, once, rather than lose them.
    local h = redis.call('ZRANGE', fq_parts(tid, tier, ''), 0, 0, 'WITHSCORES')
    if h[1] == nil then return nil, nil end
    fq_kactivate(tid, tier, '')
    if tonumber(h[2]) > fq.now then return nil, tonumber(h[2]) end
    return h[1], tonumber(h[2]), '', tonumber(redis.call('ZSCORE', kready, ''))
  end
  return nil, tonumber(t[2])
end

-- One of the tenant's keys was served at tag `tag`, charged `cost`: kv moves to it, the key's next
-- start is its finish tag, or it leaves (for its timer, or for good) when it has no due head.
local function fq_kserved(tid, tier, key, tag, cost)
  local kv = fq_tkey(tid, 'kv:' .. tier)
  redis.call('SET', kv, fq_num(tag))
  local finish = tag + cost / fq_kweight(tid, key)
  local h = redis.call('ZRANGE', fq_parts(tid, tier, key), 0, 0, 'WITHSCORES')
  if h[1] ~= nil and tonumber(h[2]) <= fq.now then
    redis.call('ZADD', fq_tkey(tid, 'kready:' .. tier), fq_num(finish), key)
  else
    fq_kleave(tid, tier, key, finish)
    if h[1] ~= nil then redis.call('ZADD', fq_tkey(tid, 'ktimers:' .. tier), 'LT', h[2], key) end
  end
  redis.call('ZREMRANGEBYSCORE', fq_tkey(tid, 'kfin:' .. tier), '-inf', fq_num(tag))
end

-- Move a key's tag by `delta` (fq_retag's second level).
local function fq_kretag(tid, tier, key, delta)
  local kready = fq_tkey(tid, 'kready:' .. tier)
  local tag = redis.call('ZSCORE', kready, key)
  if tag then
    redis.call('ZADD', kready, fq_num(tonumber(tag) + delta), key)
    return
  end
  local kfin, v = fq_tkey(tid, 'kfin:' .. tier), fq_kvtime(tid, tier)
  local finish = (tonumber(redis.call('ZSCORE', kfin, key)) or v) + delta
  if finish > v then
    redis.call('ZADD', kfin, fq_num(finish), key)
  else
    redis.call('ZREM', kfin, key)
  end
end

local function fq_vtime(tier)
  return tonumber(redis.call('GET', fq_gkey('vtime:' .. tier))) or 0
end

-- Start tag of a tenant that becomes backlogged: max(V, its last finish tag). Never below V,
-- so time spent idle, parked or blocked earns no credit.
local function fq_start_tag(tier, tid)
  local key = fq_gkey('finish:' .. tier)
  local v = fq_vtime(tier)
  local f = tonumber(redis.call('HGET', key, tid))
  if f == nil then return v end
  redis.call('HDEL', key, tid)
  return math.max(v, f)
end

-- Take the tenant out of the ready set, remembering its tag for when it comes back. A tag
-- at or below V would be replaced by V anyway, so it is not kept.
local function fq_leave(tier, tid, tag)
  redis.call('ZREM', fq_gkey('ready:' .. tier), tid)
  if tag > fq_vtime(tier) then
    redis.call('HSET', fq_gkey('finish:' .. tier), tid, fq_num(tag))
  else
    redis.call('HDEL', fq_gkey('finish:' .. tier), tid)
  end
end

-- Put a tenant's tier where it belongs now: ready when its earliest head is due and its
-- rate admits a start, else a timer for when that will be. A tenant that is already ready,
-- or parked at its ceiling, stays where it is. O(log n).
local function fq_activate(tier, tid)
  local ready = fq_gkey('ready:' .. tier)
  if redis.call('ZSCORE', ready, tid) then return end
  if redis.call('SISMEMBER', fq_gkey('blocked:' .. tier), tid) == 1 then return end
  local part, due = fq_head(tid, tier)
  if due == nil then
    redis.call('ZREM', fq_gkey('timers'), fq_timer_member(tier, tid))
    return
  end
  local at = math.max(due, fq.now + fq_rate_wait_ms(tid, fq_conf(tid)))
  if at <= fq.now then
    redis.call('ZREM', fq_gkey('timers'), fq_timer_member(tier, tid))
    redis.call('ZADD', ready, fq_num(fq_start_tag(tier, tid)), tid)
    fq_wake()
  else
    fq_set_timer(tier, tid, at)
  end
end

-- The tenant has no unlocked partition left in the tier: drop it from the tier's indexes.
local function fq_forget(tier, tid)
  local tag = redis.call('ZSCORE', fq_gkey('ready:' .. tier), tid)
  if tag then fq_leave(tier, tid, tonumber(tag)) end
  redis.call('ZREM', fq_gkey('timers'), fq_timer_member(tier, tid))
  redis.call('SREM', fq_gkey('blocked:' .. tier), tid)
end

-- A slot of the tenant freed (ack, nack, reap) or its limits changed: every tier parked
-- at the ceiling is looked at again.
local function fq_unblock(tid)
  for _, tier in ipairs(fq.tiers) do
    if redis.call('SREM', fq_gkey('blocked:' .. tier), tid) == 1 then
      redis.call('ZREM', fq_gkey('timers'), fq_timer_member(tier, tid))
      fq_activate(tier, tid)
    end
  end
end

-- Park a tenant's tier at its concurrency ceiling until a slot frees. The timer is a safety
-- net for slots freed outside the fair queue (another holder of the scope, a lapsed lease).
local function fq_block(tier, tid, tag)
  fq_leave(tier, tid, tag)
  redis.call('SADD', fq_gkey('blocked:' .. tier), tid)
  local first = redis.call('ZRANGE', fq.tprefix .. tid .. fq.scope, 0, 0, 'WITHSCORES')
  local at = fq.now + FQ_BLOCKED_RECHECK_MS
  if first[2] ~= nil then at = math.max(fq.now + 1, tonumber(first[2])) end
  fq_set_timer(tier, tid, at)
end

-- Park a suspended tenant's tier: nothing of it is dispatched until its reactivation unblocks it
-- (fq_configure, or an enqueue that brings the new status).
local function fq_suspend(tier, tid, tag)
  fq_leave(tier, tid, tag)
  redis.call('SADD', fq_gkey('blocked:' .. tier), tid)
  redis.call('ZREM', fq_gkey('timers'), fq_timer_member(tier, tid))
end

-- The tenant's step rate or burst changed: a TAT its old limits pushed further ahead than the
-- new ones allow (one start admitted now, the rest of the burst used) is brought back to that,
-- so a raised rate counts at once, not once the old rate's debt is paid. None: no rate.
local function fq_rate_rebase(tid, conf)
  local key = fq_rate_key(tid)
  if conf.rate <= 0 then
    redis.call('DEL', key)
    return
  end
  local most = fq.now_us + fq_interval_us(conf) * (math.max(conf.burst, 1) - 1)
  local tat = tonumber(redis.call('GET', key))
  if tat ~= nil and tat > most then
    redis.call('SET', key, string.format('%.17g', most), 'PX', math.ceil((most - fq.now_us) / 1000) + CAP_GRACE_MS)
  end
end

-- Write a tenant's conf from ARGV[i..i+5]: weight, max_concurrency, rate_per_s, burst,
-- suspended (1/0) and the version of the tenant row that status was read from. A status read
-- from an older row than the one already written is not written (a process that read the tenant
-- before its suspension must not undo it). New limits or a new status unblock the tiers parked
-- under the old ones; a new rate or burst also the tiers waiting for the rate's timer.
local FQ_CONF_ARGS = 6

local function fq_set_conf(tid, argv, i)
  local key = fq_tkey(tid, 'conf')
  local old = redis.call('HMGET', key, 'max_concurrency', 'rate_per_s', 'suspended', 'status_version', 'burst')
  local suspended, version = argv[i + 4], tonumber(argv[i + 5])
  if old[4] and tonumber(old[4]) > version then suspended, version = old[3], tonumber(old[4]) end
  redis.call('HSET', key, 'weight', argv[i], 'max_concurrency', argv[i + 1], 'rate_per_s', argv[i + 2],
    'burst', argv[i + 3], 'suspended', suspended, 'status_version', fq_num(version))
  if old[1] and (old[1] ~= argv[i + 1] or old[2] ~= argv[i + 2] or (old[3] or '0') ~= suspended) then
    fq_unblock(tid)
  end
  if old[2] and (old[2] ~= argv[i + 2] or old[5] ~= argv[i + 3]) then
    fq_rate_rebase(tid, fq_conf(tid))
    for _, tier in ipairs(fq.tiers) do fq_activate(tier, tid) end
  end
end

-- Fair by work. A dispatch charges an item what the tenant's items of its kind took lately (its
-- moving average, FQ_EST_ALPHA per sample; fq.first_cost before any), or its cost in "items"
-- mode; when it leaves flight the tenant's tag is corrected by the difference between its
-- measured work (at most fq.max_cost) and that charge, divided by the weight.
local FQ_EST_ALPHA = 0.2
local FQ_WORK_BUCKET_MS = 10000
local FQ_WORK_BUCKETS = 6

local function fq_charge(tid, it)
  if fq.cost_mode == 'items' then return it.cost end
  return tonumber(redis.call('HGET', fq_tkey(tid, 'est'), it.kind or '')) or fq.first_cost
end

-- Move the tenant's tag in the tier by `delta`, wherever it is kept: its start tag while it is
-- ready, else its last finish tag (one at or below V was dropped: it counts as V).
local function fq_retag(tier, tid, delta)
  local ready = fq_gkey('ready:' .. tier)
  local tag = redis.call('ZSCORE', ready, tid)
  if tag then
    redis.call('ZADD', ready, fq_num(tonumber(tag) + delta), tid)
    return
  end
  local key, v = fq_gkey('finish:' .. tier), fq_vtime(tier)
  local finish = (tonumber(redis.call('HGET', key, tid)) or v) + delta
  if finish > v then
    redis.call('HSET', key, tid, fq_num(finish))
  else
    redis.call('HDEL', key, tid)
  end
end

-- The work of the shard's tenants over the last FQ_WORK_BUCKETS buckets (what the queue views
-- show as shares of worker time). The system tier's is not a customer's share.
local function fq_record_work(tid, tier, weight, work)
  if tier == 'system' then return end
  local key = fq_gkey('work:' .. math.floor(fq.now / FQ_WORK_BUCKET_MS))
  if redis.call('HEXISTS', key, tid) == 0 then redis.call('HINCRBYFLOAT', key, '~weights', weight) end
  redis.call('HINCRBYFLOAT', key, tid, fq_num(work))
  redis.call('HINCRBYFLOAT', key, '~total', fq_num(work))
  redis.call('PEXPIRE', key, FQ_WORK_BUCKET_MS * (FQ_WORK_BUCKETS + 1))
end

-- The same, inside the tenant, per fairness key (the tenant's work of no key is what its keys'
-- leaves of its total): kwork:<bucket> (ZSET key -> work), kworkw:<bucket> (HASH, field "w": the
-- weights of the keys that worked then). Not INCRBYFLOAT: inside a script it rewrites the script
-- client's arguments as a whole, which Redis 6.2 frees from under the script (a crash).
local function fq_record_key_work(tid, tier, key, work)
  if tier == 'system' or key == nil or key == '' then return end
  local b = math.floor(fq.now / FQ_WORK_BUCKET_MS)
  local bucket, weights = fq_tkey(tid, 'kwork:' .. b), fq_tkey(tid, 'kworkw:' .. b)
  local ttl = FQ_WORK_BUCKET_MS * (FQ_WORK_BUCKETS + 1)
  if not redis.call('ZSCORE', bucket, key) then
    redis.call('HINCRBYFLOAT', weights, 'w', fq_kweight(tid, key))
    redis.call('PEXPIRE', weights, ttl)
  end
  redis.call('ZINCRBY', bucket, fq_num(work), key)
  redis.call('PEXPIRE', bucket, ttl)
end

-- An item whose worker reported no work (a task node run by a team's worker without ductor_sdk's
-- hook) is charged its time in flight, which also counts its wait in the team's broker (workers
-- down, or busy with other work): at most FQ_UNREPORTED_FACTOR times what the tenant's items of
-- its kind usually take. An outage is then not charged to whichever tenants had items out, and a
-- kind that really grew is learnt within a few items (each sample may move the estimate from est
-- to est * (1 + FQ_EST_ALPHA * (FQ_UNREPORTED_FACTOR - 1))).
local FQ_UNREPORTED_FACTOR = 4

-- Settle an item that leaves flight, having done `work` ms (nil: unreported, see above): its
-- kind's estimate learns it, and in "time" mode the tenant is charged the difference from what its
-- dispatch charged. Before fq_unlock, which may re-tag the tenant.
local function fq_settle(tid, it, work)
  if it.at == nil then return end
  if work == nil then
    local est = tonumber(redis.call('HGET', fq_tkey(tid, 'est'), it.kind or '')) or fq.first_cost
    work = math.min((fq.now_us - it.at) / 1000, FQ_UNREPORTED_FACTOR * est)
  end
  work = math.max(0, math.min(work, fq.max_cost))
  local conf = fq_conf(tid)
  fq_record_work(tid, it.tier, conf.weight, work)
  fq_record_key_work(tid, it.tier, it.key, work)
  if fq.cost_mode == 'items' or it.charged == nil then return end
  local key, kind = fq_tkey(tid, 'est'), it.kind or ''
  local old = tonumber(redis.call('HGET', key, kind))
  redis.call('HSET', key, kind, fq_num(old and old + FQ_EST_ALPHA * (work - old) or work))
  local delta = (work - it.charged) / conf.weight
  if delta ~= 0 then
    fq_retag(it.tier, tid, delta)
    local key = it.key or ''
    fq_kretag(tid, it.tier, key, (work - it.charged) / fq_kweight(tid, key))
  end
end

-- The partition's item went out of flight: its heads in every tier are eligible again.
-- (A partition is one serialization domain of the tenant, whatever the tiers of its items.)
-- A partition left with no item at all forgets its key.
local function fq_unlock(tid, part)
  redis.call('HDEL', fq_tkey(tid, 'locks'), part)
  local key, empty = nil, true
  for _, tier in ipairs(fq.tiers) do
    local h = redis.call('ZRANGE', fq_pkey(tid, tier, part), 0, 0, 'WITHSCORES')
    if h[1] ~= nil then
      key = key or fq_key_of(tid, part)
      fq_add_part(tid, tier, part, h[2], false, key)
      fq_activate(tier, tid)
      empty = false
    end
  end
  if empty then redis.call('HDEL', fq_tkey(tid, 'pkey'), part) end
end

local function fq_holder_record(tid, id)
  return fq.tprefix .. tid .. fq.holder .. FQ_HOLDER .. id
end

-- The JSON conf of one of the tenant's admission scopes ("pool:<id>", "connection:<id>"), or nil.
local function fq_scope_conf(tid, field)
  return fq_json(tid, 'scopes', field)
end

-- Wake up to n partitions parked on the pool (earliest head first): each goes back to its
-- tier's partitions at its head's due time and its tenant is looked at again. One freed slot
-- wakes one; a partition that was emptied or locked meanwhile is dropped (its unlock puts it
-- back). O(log n) per partition woken. Returns how many woke, and the head item of the last.
local function fq_wake_parked(tid, pool, n)
  local key = fq_tkey(tid, 'w:' .. pool)
  local locks = fq_tkey(tid, 'locks')
  local woken, tries, head = 0, 0, nil
  while woken < n and tries < n + 8 do
    local top = redis.call('ZPOPMIN', key)
    if top[1] == nil then break end
    tries = tries + 1
    local tier, part = fq_split(top[1])
    if redis.call('HEXISTS', locks, part) == 0 then
      local h = redis.call('ZRANGE', fq_pkey(tid, tier, part), 0, 0, 'WITHSCORES')
      if h[1] ~= nil then
        fq_add_part(tid, tier, part, h[2], false, nil)
        fq_activate(tier, tid)
        woken, head = woken + 1, h[1]
      end
    end
  end
  return woken, head
end

-- Whether the tenant's own limits keep it from taking any slot now: it is suspended, at its
-- concurrency ceiling (for as long as its items in flight run, which may be hours), or its step
-- rate admits no start yet (up to 1,000 s at the slowest rate a plan may have).
local function fq_held_back(tid)
  local conf = fq_conf(tid)
  if conf.suspended then return true end
  if conf.limit >= 0 and cap_in_flight(fq.tprefix .. tid .. fq.scope, fq.now) >= conf.limit then return true end
  return fq_rate_wait_ms(tid, conf) > 0
end

-- Wake one partition of the share's waiter `member` (start tag `tag`, in the waiters `key`): it
-- leaves them, or stays with its tag advanced by one item's share (1 / weight), as its service
-- would advance it, when it has more parked there. False when none of its was left (it is dropped).
local function fq_wake_waiter(key, member, tag)
  redis.call('ZREM', key, member)
  local wtid, pool = fq_split(member)
  local woken, head = fq_wake_parked(wtid, pool, 1)
  if woken == 0 then return false end
  if redis.call('ZCARD', fq_tkey(wtid, 'w:' .. pool)) > 0 then
    local cost = fq_charge(wtid, fq_item(wtid, head) or {cost = 1})
    redis.call('ZADD', key, fq_num(tag + cost / fq_conf(wtid).weight), member)
  end
  return true
end

-- Waiters of a queue share looked at per tier when one of its slots frees.
local FQ_SHARE_LOOK = 8

-- A slot of a queue share freed: the waiter with the smallest start tag, in the highest tier
-- that has one, has one partition parked on its pool woken, passing over the waiters that their
-- own limits hold back (fq_held_back): woken, such a tenant would keep the slot free, and every
-- other tenant's task waiting, until one of its own items ends. They keep their tags, first again
-- at the next slot freed; when no other waiter can take this one, the first of them is woken. O(log
-- n); waiters whose parked partitions are gone are dropped (a few per call).
local function fq_wake_share(share)
  local held = {}
  for _, tier in ipairs(fq.tiers) do
    local key = fq_gkey('sw:' .. tier .. ':' .. share)
    local top = redis.call('ZRANGE', key, 0, FQ_SHARE_LOOK - 1, 'WITHSCORES')
    for i = 1, #top, 2 do
      local member, tag = top[i], tonumber(top[i + 1])
      if fq_held_back((fq_split(member))) then
        held[#held + 1] = {key, member, tag}
      elseif fq_wake_waiter(key, member, tag) then
        return
      end
    end
  end
  for _, h in ipairs(held) do
    if fq_wake_waiter(h[1], h[2], h[3]) then return end
  end
end

-- A slot an item held freed: one partition parked on its pool wakes, and one of every other
-- pool its connection serves (a connection may be a member of several of the tenant's pools);
-- for a slot of a queue share, the share's next waiter of any tenant.
local function fq_wake_for(tid, it)
  if it.share ~= nil then fq_wake_share(it.share) end
  if it.scope == nil then return end
  fq_wake_parked(tid, it.scope, 1)
  if it.conn == nil then return end
  local conf = fq_scope_conf(tid, 'connection:' .. it.conn)
  for _, pool in ipairs((conf and conf.pools) or {}) do
    if pool ~= it.scope then fq_wake_parked(tid, pool, 1) end
  end
end

-- End an item's lease: out of the in-flight index, its capacity slots given back, and a
-- partition parked on the scopes it held woken.
local function fq_end_lease(tid, id, it)
  redis.call('ZREM', fq_gkey('inflight'), tid .. '|' .. id)
  redis.call('HINCRBY', fq_tkey(tid, 'flight'), it.tier, -1)
  cap_release(fq_holder_record(tid, id), FQ_HOLDER .. id, fq.now)
  fq_wake_for(tid, it)
end

-- How many partitions to wake when a scope's limits change: enough to fill it at once.
local FQ_WAKE_ON_CHANGE = 64

-- Write one admission scope's conf ("pool:<id>" / "connection:<id>" -> JSON, or false to
-- delete it). A change wakes the partitions parked on it (for a connection: on its pools),
-- which look at the new limits; an unchanged conf costs one HGET.
local function fq_set_scope(tid, field, json)
  local key = fq_tkey(tid, 'scopes')
  local old = redis.call('HGET', key, field)
  if old == json or (not old and not json) then return end
  if json then redis.call('HSET', key, field, json) else redis.call('HDEL', key, field) end
  local kind, id = string.match(field, '^(%a+):(.+)$')
  if kind == 'pool' then
    fq_wake_parked(tid, id, FQ_WAKE_ON_CHANGE)
  elseif kind == 'connection' then
    local pools = {}
    for _, raw in ipairs({old or '{}', json or '{}'}) do
      for _, pool in ipairs(cjson.decode(raw).pools or {}) do pools[pool] = true end
    end
    for pool in pairs(pools) do fq_wake_parked(tid, pool, FQ_WAKE_ON_CHANGE) end
  end
end

-- Put an item that was in flight back in its partition, due at `due` (or earlier when a
-- run again was asked for while it was in flight; that request's payload then wins).
-- The partition stays locked: the caller unlocks it.
local function fq_requeue(tid, id, it, due)
  if it.again ~= nil then
    due = math.min(due, it.again)
    if it.again_payload ~= nil then it.payload = it.again_payload end
  end
  it.state, it.due, it.lease, it.token, it.again, it.again_payload = 'waiting', due, nil, nil, nil, nil
  it.conn, it.share, it.charged, it.at = nil, nil, nil, nil
  fq_save(tid, id, it)
  redis.call('ZADD', fq_pkey(tid, it.tier, it.partition), fq_num(fq_score(it)), id)
  redis.call('ZADD', fq_tkey(tid, 'wait:' .. it.tier), fq_num(due), id)
end

-- The item if it is in flight, and (when the caller names one) in that delivery.
local function fq_in_flight(tid, id, delivery)
  local it = fq_item(tid, id)
  if it == nil or it.state ~= 'inflight' then return nil end
  if delivery ~= '' and tonumber(delivery) ~= it.token then return nil end
  return it
end
