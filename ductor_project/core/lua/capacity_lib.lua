-- Capacity counters: the Lua shared by every capacity script. scheduling/scripts.py
-- prepends it, as the library "capacity_lib", to each capacity_*.lua body; a script of
-- another module that must take capacity in the same atomic step (the fair queue's
-- dequeue) is loaded with it too. The signatures of the cap_* functions are its API.
--
-- Concurrency: one ZSET per scope; member = holder id, score = lease expiry in ms of
-- Redis TIME. A lease is live while its expiry is > now. One HASH per holder records
-- the lease: field "_exp" = the expiry, plus one field per scope key it holds, so that
-- extend and release need only the holder. Every key a caller passes, and every scope
-- key a record names, carries the tenant's hash tag: one Redis Cluster slot.
--
-- Rate: GCRA, one STRING per limiter holding its theoretical arrival time (TAT) in µs.

local CAP_EXP = '_exp'
-- Records and scope keys outlive their leases a little: key expiry runs on the server's
-- cached clock, which may be a little behind TIME, and a slot must never free early.
-- Whether a lease is live is decided by its expiry (the "_exp" field, the ZSET score),
-- never by a key's TTL.
local CAP_GRACE_MS = 1000
-- GCRA compares µs timestamps around 1.7e15, where a double has ~0.25 µs of precision;
-- one µs of slack keeps float rounding from refusing a call that is exactly on time.
local CAP_GCRA_SLACK_US = 1

local function cap_now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function cap_now_ms()
  return math.floor(cap_now_us() / 1000)
end

-- Keep a key alive for at least ttl_ms: a counter nobody uses any more vanishes by itself.
local function cap_keep_alive(key, ttl_ms)
  if redis.call('PTTL', key) < ttl_ms then
    redis.call('PEXPIRE', key, ttl_ms)
  end
end

-- The scope keys a lease record names, and its expiry (nil when there is no record).
local function cap_record(record)
  local flat = redis.call('HGETALL', record)
  local scopes, expiry = {}, nil
  for i = 1, #flat, 2 do
    if flat[i] == CAP_EXP then
      expiry = tonumber(flat[i + 1])
    else
      scopes[#scopes + 1] = flat[i]
    end
  end
  return scopes, expiry
end

-- Take one slot for holder in every scope, or in none.
-- Returns 1 when taken (or refreshed: a holder that already holds these scopes keeps its
-- slots and gets the new expiry), 0 when a scope is full, and -1 when the holder has a
-- live lease on another set of scopes. Only 1 changes any lease.
local function cap_acquire(record, scopes, limits, holder, lease_ms, now)
  local old = tonumber(redis.call('HGET', record, CAP_EXP))
  local live = old ~= nil and old > now
  if live then
    if redis.call('HLEN', record) ~= #scopes + 1 then return -1 end
    for i = 1, #scopes do
      if redis.call('HEXISTS', record, scopes[i]) == 0 then return -1 end
    end
  end
  for i = 1, #scopes do
    -- ZCARD counts expired entries too, so below the limit there is room for sure; only a
    -- scope that looks full is pruned and counted again. Expired entries stay bounded by
    -- the limit, and the scope's TTL clears them once it is idle.
    if redis.call('ZCARD', scopes[i]) >= limits[i] then
      redis.call('ZREMRANGEBYSCORE', scopes[i], '-inf', now)
      -- A holder renewing its live lease needs no new slot (a live record's entries are live).
      if redis.call('ZCARD', scopes[i]) >= limits[i]
          and not (live and redis.call('ZSCORE', scopes[i], holder)) then
        return 0
      end
    end
  end
  local expiry = now + lease_ms
  for i = 1, #scopes do
    redis.call('ZADD', scopes[i], expiry, holder)
    cap_keep_alive(scopes[i], lease_ms + CAP_GRACE_MS)
  end
  if live then
    redis.call('HSET', record, CAP_EXP, expiry)
  else
    local fields = {CAP_EXP, expiry}
    for i = 1, #scopes do
      fields[#fields + 1] = scopes[i]
      fields[#fields + 1] = 1
    end
    if old ~= nil then redis.call('DEL', record) end
    redis.call('HSET', record, unpack(fields))
  end
  redis.call('PEXPIRE', record, lease_ms + CAP_GRACE_MS)
  return 1
end

-- Drop whatever is left of holder's lease. Returns how many live slots that freed.
local function cap_release(record, holder, now)
  local scopes, expiry = cap_record(record)
  local live = expiry ~= nil and expiry > now
  local freed = 0
  for i = 1, #scopes do
    -- Every entry of a lease carries the record's expiry: live together, or not at all.
    if redis.call('ZREM', scopes[i], holder) == 1 and live then freed = freed + 1 end
  end
  if expiry ~= nil then redis.call('DEL', record) end
  return freed
end

-- Renew a live lease in all of its scopes. Returns 1, or 0 (changing nothing but
-- clean-up) when the lease had ended: a lost slot is never taken back here.
local function cap_extend(record, holder, lease_ms, now)
  local scopes, old = cap_record(record)
  if old == nil or old <= now then
    cap_release(record, holder, now)
    return 0
  end
  local expiry = now + lease_ms
  for i = 1, #scopes do
    -- XX: only an entry that is still there is renewed, none is ever added.
    redis.call('ZADD', scopes[i], 'XX', expiry, holder)
    cap_keep_alive(scopes[i], lease_ms + CAP_GRACE_MS)
  end
  redis.call('HSET', record, CAP_EXP, expiry)
  redis.call('PEXPIRE', record, lease_ms + CAP_GRACE_MS)
  return 1
end

-- Live leases of a scope (read only).
local function cap_in_flight(scope, now)
  return redis.call('ZCOUNT', scope, '(' .. string.format('%.0f', now), '+inf')
end

-- GCRA. interval = emission interval (µs), tolerance = interval * burst: from idle,
-- exactly `burst` calls of cost 1 pass at once, then one every interval.
-- Returns {allowed 0|1, retry_after_us, remaining, reset_after_us}; with consume false
-- (peek) nothing is written.
local function cap_gcra(key, interval, burst, cost, consume, now)
  local tolerance = interval * burst
  local tat = tonumber(redis.call('GET', key))
  if tat == nil or tat < now then tat = now end
  -- Limits lowered since the TAT was written (a raised rate, a smaller burst) count at once: a TAT
  -- further ahead than these limits ever leave one is taken as their furthest (the burst used).
  if tat > now + tolerance then tat = now + tolerance end
  local new_tat = tat + interval * cost
  local wait = new_tat - tolerance - now
  local allowed = wait <= CAP_GCRA_SLACK_US
  local state = tat
  if allowed and consume then
    state = new_tat
    -- Once now passes the TAT the limiter is idle again, so the key may vanish then.
    local ttl_ms = math.ceil((new_tat - now) / 1000) + CAP_GRACE_MS
    redis.call('SET', key, string.format('%.17g', new_tat), 'PX', ttl_ms)
  end
  local remaining = math.max(0, math.floor((tolerance - (state - now) + CAP_GCRA_SLACK_US) / interval))
  local retry_after = 0
  if not allowed then retry_after = math.ceil(wait) end
  return {allowed and 1 or 0, retry_after, remaining, math.ceil(state - now)}
end
