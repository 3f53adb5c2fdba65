-- Enqueue items, of one tenant (the tenant side) or of several tenants of one shard (bulk
-- loads). KEYS[1] = the first tenant's items HASH (it routes the call to the shard).
-- ARGV[1..FQ_HEADER] = fq_init; then per tenant: its id; its weight, max_concurrency (-1:
-- none), rate_per_s (0: none), burst, suspended (1/0) and the version of the tenant row its
-- status was read from (fq_set_conf), from its entitlements and status; the number
-- of admission scope confs, then each as field and JSON (the pools and connections its items
-- use, from the routing table); the number of fairness key weights, then each as key and
-- weight (the weights of its items' keys); its item count; then per item ten ARGV: id, tier,
-- partition, delay (ms), cost, payload (JSON text), pool id ("" for none), kind (what its
-- work is estimated by), order key (Unix ms, "" for none: see fq_score), fairness key ("" for
-- none). A partition keeps the key its first item came with.
-- Returns one code per item, in order: 1 queued, 2 already waiting (unchanged), 3 already
-- waiting and now due earlier, 4 in flight (it runs again after its ack).
fq_init(ARGV)
local codes = {}
local ITEM_ARGS = 10

local function enqueue_item(tid, locks, id, tier, part, due, cost, payload, scope, kind, order, key)
  local it = fq_item(tid, id)
  if it == nil then
    if key ~= '' then redis.call('HSETNX', fq_tkey(tid, 'pkey'), part, key) end
    key = fq_key_of(tid, part)
    it = {tier = tier, partition = part, cost = cost, payload = payload, state = 'waiting', due = due, n = 0,
      scope = scope, kind = kind, order = order, key = key ~= '' and key or nil}
    fq_save(tid, id, it)
    local score = fq_num(fq_score(it))
    redis.call('ZADD', fq_pkey(tid, tier, part), score, id)
    redis.call('ZADD', fq_tkey(tid, 'wait:' .. tier), fq_num(due), id)
    if redis.call('HEXISTS', locks, part) == 0 then
      fq_add_part(tid, tier, part, score, true, key)
      fq_activate(tier, tid)
    end
    return 1
  end
  if it.state == 'waiting' then
    -- Coalesce: the waiting item keeps its tier, partition, payload and scope, and the earlier due.
    if due >= it.due then return 2 end
    it.due = due
    if order ~= nil and (it.order == nil or order < it.order) then it.order = order end
    fq_save(tid, id, it)
    local score = fq_num(fq_score(it))
    redis.call('ZADD', fq_pkey(tid, it.tier, it.partition), score, id)
    redis.call('ZADD', fq_tkey(tid, 'wait:' .. it.tier), fq_num(due), id)
    if redis.call('HEXISTS', locks, it.partition) == 0 then
      fq_add_part(tid, it.tier, it.partition, score, true, it.key or '')
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

-- Every tenant of the call is looked at before anything is written: a call one of whose tenants
-- is fenced (moving to another shard) changes nothing, and its caller sends it again.
local function first_fenced()
  local i = FQ_HEADER + 1
  while i <= #ARGV do
    local fenced = fq_fenced(ARGV[i])
    if fenced then return fenced end
    local j = i + 1 + FQ_CONF_ARGS
    j = j + 1 + 2 * tonumber(ARGV[j])
    j = j + 1 + 2 * tonumber(ARGV[j])
    i = j + 1 + ITEM_ARGS * tonumber(ARGV[j])
  end
  return nil
end

local fenced = first_fenced()
if fenced then return fenced end

local i = FQ_HEADER + 1
while i <= #ARGV do
  local tid = ARGV[i]
  fq_set_conf(tid, ARGV, i + 1)
  local j = i + 1 + FQ_CONF_ARGS
  for _ = 1, tonumber(ARGV[j]) do
    fq_set_scope(tid, ARGV[j + 1], ARGV[j + 2])
    j = j + 2
  end
  j = fq_set_kweights(tid, ARGV, j + 1)
  local locks = fq_tkey(tid, 'locks')
  local count = tonumber(ARGV[j + 1])
  j = j + 2
  for _ = 1, count do
    local scope = ARGV[j + 6]
    codes[#codes + 1] = enqueue_item(tid, locks, ARGV[j], ARGV[j + 1], ARGV[j + 2],
      fq.now + tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4]), ARGV[j + 5], scope ~= '' and scope or nil,
      ARGV[j + 7], tonumber(ARGV[j + 8]), ARGV[j + 9])
    j = j + ITEM_ARGS
  end
  i = j
end
return codes
