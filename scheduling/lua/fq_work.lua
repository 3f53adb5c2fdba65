-- The work the shard's items did over the last FQ_WORK_BUCKETS buckets of FQ_WORK_BUCKET_MS
-- (fq_record_work), read only. KEYS[1] = a key of the shard (it routes the call).
-- ARGV[1..FQ_HEADER] = fq_init; ARGV[A + 1] = a tenant id, or "" for every tenant.
-- Returns one row per bucket, oldest first: for a tenant {its work (ms), all of it, the weights of
-- the tenants that worked, whether it worked (1/0), the weights of its fairness keys that worked,
-- then key, work, weight (now) for each of the FQ_WORK_KEYS keys that worked most}; for every
-- tenant {all of it, the weights, then tenant, work, weight (now) per tenant that worked}.
fq_init(ARGV)
local A = FQ_HEADER
local tid = ARGV[A + 1]
if tid ~= '' then
  local fenced = fq_fenced(tid)
  if fenced then return fenced end
end
local now = math.floor(fq.now / FQ_WORK_BUCKET_MS)
local FQ_WORK_KEYS = 50
local out = {}
for b = now - FQ_WORK_BUCKETS + 1, now do
  local key = fq_gkey('work:' .. b)
  if tid ~= '' then
    local r = redis.call('HMGET', key, tid, '~total', '~weights')
    local row = {r[1] or '0', r[2] or '0', r[3] or '0', r[1] and 1 or 0,
                 redis.call('HGET', fq_tkey(tid, 'kworkw:' .. b), 'w') or '0'}
    local keys = redis.call('ZREVRANGE', fq_tkey(tid, 'kwork:' .. b), 0, FQ_WORK_KEYS - 1, 'WITHSCORES')
    for i = 1, #keys, 2 do
      row[#row + 1] = keys[i]
      row[#row + 1] = keys[i + 1]
      row[#row + 1] = fq_kweight(tid, keys[i])
    end
    out[#out + 1] = row
  else
    local row = {redis.call('HGET', key, '~total') or '0', redis.call('HGET', key, '~weights') or '0'}
    local all = redis.call('HGETALL', key)
    for i = 1, #all, 2 do
      if string.sub(all[i], 1, 1) ~= '~' then
        row[#row + 1] = all[i]
        row[#row + 1] = all[i + 1]
        row[#row + 1] = fq_conf(all[i]).weight
      end
    end
    out[#out + 1] = row
  end
end
return out
