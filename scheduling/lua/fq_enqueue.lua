-- Enqueue items, of one tenant (the tenant side) or of several tenants of one shard (bulk
-- loads). KEYS[1] = the first tenant's items HASH (it routes the call to the shard).
-- ARGV[1..7] = fq_init; then per tenant: its id; its weight, max_concurrency (-1: none),
-- rate_per_s (0: none) and burst, from its entitlements; its item count; then per item
-- six ARGV: id, tier, partition, delay (ms), cost, payload (JSON text).
-- Returns one code per item, in order: 1 queued, 2 already waiting (unchanged), 3 already
-- waiting and now due earlier, 4 in flight (it runs again after its ack).
fq_init(ARGV)
local codes = {}

local function enqueue_item(tid, locks, id, tier, part, due, cost, payload)
  local it = fq_item(tid, id)
  if it == nil then
    fq_save(tid, id, {tier = tier, partition = part, cost = cost, payload = payload, state = 'waiting',
      due = due, n = 0})
    redis.call('ZADD', fq_pkey(tid, tier, part), fq_num(due), id)
    redis.call('ZADD', fq_tkey(tid, 'wait:' .. tier), fq_num(due), id)
    if redis.call('HEXISTS', locks, part) == 0 then
      redis.call('ZADD', fq_tkey(tid, 'parts:' .. tier), 'LT', fq_num(due), part)
      fq_activate(tier, tid)
    end
    return 1
  end
  if it.state == 'waiting' then
    -- Coalesce: the waiting item keeps its tier, partition and payload, and the earlier due.
    if due >= it.due then return 2 end
    it.due = due
    fq_save(tid, id, it)
    redis.call('ZADD', fq_pkey(tid, it.tier, it.partition), fq_num(due), id)
    redis.call('ZADD', fq_tkey(tid, 'wait:' .. it.tier), fq_num(due), id)
    if redis.call('HEXISTS', locks, it.partition) == 0 then
      redis.call('ZADD', fq_tkey(tid, 'parts:' .. it.tier), 'LT', fq_num(due), it.partition)
      fq_activate(it.tier, tid)
    end
    return 3
  end
  -- In flight: run it again after its ack, so that a wake-up is never lost.
  if it.again == nil or due < it.again then it.again = due end
  it.again_payload = payload
  fq_save(tid, id, it)
  return 4
end

local i = 8
while i <= #ARGV do
  local tid = ARGV[i]
  local conf_key = fq_tkey(tid, 'conf')
  local old = redis.call('HMGET', conf_key, 'max_concurrency', 'rate_per_s')
  redis.call('HSET', conf_key, 'weight', ARGV[i + 1], 'max_concurrency', ARGV[i + 2],
    'rate_per_s', ARGV[i + 3], 'burst', ARGV[i + 4])
  if old[1] and (old[1] ~= ARGV[i + 2] or old[2] ~= ARGV[i + 3]) then
    -- New limits: tiers parked at the old ceiling are looked at again.
    fq_unblock(tid)
  end
  local locks = fq_tkey(tid, 'locks')
  local last = i + 6 + 6 * tonumber(ARGV[i + 5]) - 1
  for j = i + 6, last, 6 do
    codes[#codes + 1] = enqueue_item(tid, locks, ARGV[j], ARGV[j + 1], ARGV[j + 2],
      fq.now + tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4]), ARGV[j + 5])
  end
  i = last + 1
end
return codes
