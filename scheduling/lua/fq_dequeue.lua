-- Dispatch the next items of the shard, one at a time as by a loop of single dequeues: strict
-- tier priority, then start-time fair queueing among the tenants of the tier, then the
-- tenant's earliest-due partition head.
-- KEYS[1] = the shard's timers ZSET (it routes the call).
-- ARGV[1..7] = fq_init; ARGV[8] = lease (ms); ARGV[9] = how many due timers to promote;
-- ARGV[10] = how many tenants to look at per item; ARGV[11] = how many items at most;
-- ARGV[12..] = the tiers to serve, highest first.
-- Returns {status, item...}: each item {tenant, item, tier, partition, payload, waited ms,
-- attempt, delivery token, lease expiry (ms, Redis clock)}; status "again" when a work bound was reached before the call
-- found all it could (call again), else "done".
fq_init(ARGV)
local lease_ms = tonumber(ARGV[8])
local want = tonumber(ARGV[11])
local timers = fq_gkey('timers')

-- Due timers: those tenants' tiers are looked at again (bounded per call).
for _, member in ipairs(redis.call('ZRANGEBYSCORE', timers, '-inf', fq.now, 'LIMIT', 0, tonumber(ARGV[9]))) do
  redis.call('ZREM', timers, member)
  local tier, tid = fq_split(member)
  redis.call('SREM', fq_gkey('blocked:' .. tier), tid)
  fq_activate(tier, tid)
end

-- The next item, or nil when none is eligible, or false when the tenant budget ran out first.
local function next_item()
  local budget = tonumber(ARGV[10])
  for t = 12, #ARGV do
    local tier = ARGV[t]
    local ready = fq_gkey('ready:' .. tier)
    local parts_name = 'parts:' .. tier
    while budget > 0 do
      local top = redis.call('ZRANGE', ready, 0, 0, 'WITHSCORES')
      if top[1] == nil then break end
      budget = budget - 1
      local tid, tag = top[1], tonumber(top[2])
      local part, due = fq_head(tid, tier)
      if part == nil then
        fq_leave(tier, tid, tag)
      elseif due > fq.now then
        fq_leave(tier, tid, tag)
        fq_set_timer(tier, tid, due)
      elseif redis.call('HEXISTS', fq_tkey(tid, 'locks'), part) == 1 then
        -- Locked by an item of another tier: it comes back when that one leaves flight.
        redis.call('ZREM', fq_tkey(tid, parts_name), part)
      else
        local pkey = fq_pkey(tid, tier, part)
        local id = redis.call('ZRANGE', pkey, 0, 0)[1]
        local it = id and fq_item(tid, id)
        if not it then
          -- An index entry without its item (never written so): drop it rather than stall.
          if id then redis.call('ZREM', pkey, id) end
          if redis.call('ZCARD', pkey) == 0 then redis.call('ZREM', fq_tkey(tid, parts_name), part) end
        elseif it.due > fq.now then
          -- The partition's score must be its head's due time; never dispatch early on a stale one.
          redis.call('ZADD', fq_tkey(tid, parts_name), fq_num(it.due), part)
        else
          local conf = fq_conf(tid)
          local rate_wait = fq_rate_wait_ms(tid, conf)
          local taken = 1
          if rate_wait == 0 and conf.limit >= 0 then
            taken = cap_acquire(fq_holder_record(tid, id), {fq.tprefix .. tid .. fq.scope}, {conf.limit},
              FQ_HOLDER .. id, lease_ms, fq.now)
            if taken == -1 then
              return redis.error_reply('fair queue: capacity holder ' .. FQ_HOLDER .. id .. ' holds other scopes')
            end
          end
          if rate_wait > 0 then
            fq_leave(tier, tid, tag)
            fq_set_timer(tier, tid, fq.now + rate_wait)
          elseif taken == 0 then
            fq_block(tier, tid, tag)
          else
            if conf.rate > 0 then
              cap_gcra(fq_rate_key(tid), fq_interval_us(conf), conf.burst, 1, true, fq.now_us)
            end
            local expiry = fq.now + lease_ms
            redis.call('ZREM', pkey, id)
            redis.call('ZREM', fq_tkey(tid, 'wait:' .. tier), id)
            redis.call('ZREM', fq_tkey(tid, parts_name), part)
            redis.call('HSET', fq_tkey(tid, 'locks'), part, id)
            it.state, it.n, it.lease = 'inflight', (it.n or 0) + 1, expiry
            it.token = redis.call('INCR', fq_tkey(tid, 'seq'))
            fq_save(tid, id, it)
            redis.call('ZADD', fq_gkey('inflight'), expiry, tid .. '|' .. id)
            redis.call('HINCRBY', fq_tkey(tid, 'flight'), tier, 1)
            -- SFQ: V = start tag of the item in service; the tenant's next start = its finish tag.
            redis.call('SET', fq_gkey('vtime:' .. tier), fq_num(tag))
            local finish = tag + it.cost / conf.weight
            local next_part, next_due = fq_head(tid, tier)
            if next_part ~= nil and next_due <= fq.now then
              redis.call('ZADD', ready, fq_num(finish), tid)
            else
              fq_leave(tier, tid, finish)
              if next_part ~= nil then fq_set_timer(tier, tid, next_due) end
            end
            return {tid, id, tier, part, it.payload, math.max(0, fq.now - it.due), it.n, it.token, expiry}
          end
        end
      end
    end
  end
  if budget == 0 then return false end
  return nil
end

local out = {'done'}
while #out - 1 < want do
  local item = next_item()
  if item == false then
    out[1] = 'again'
    break
  elseif item == nil then
    break
  elseif item.err then
    return item
  end
  out[#out + 1] = item
end
if #out - 1 < want and redis.call('ZCOUNT', timers, '-inf', fq.now) > 0 then
  out[1] = 'again'
end
return out
