-- The step of a tenant's move that makes it live in this shard (scheduling/resharding.py), once
-- its keys were copied here: it enters this shard's indexes as reshard_out.lua took it out of the
-- old one's, in one atomic step.
-- KEYS[1] = the tenant's fq:moved-out here. ARGV[1..FQ_HEADER] = fq_init; ARGV[A + 1] = tenant
-- id; ARGV[A + 2] = the hash tag of the shard it comes from; ARGV[A + 3] = this shard's.
-- Its tags are placed relative to this shard's virtual time (it keeps its place among the
-- tenants here); its timers and lease ends keep their times, so the reaper and the acks work
-- here; the lease records of its items in flight name this shard's keys; its fence here (left by
-- an earlier move away) goes. Returns 1, or 0 when there was nothing to do (the step run again).
fq_init(ARGV)
local A = FQ_HEADER
local tid, from, to = ARGV[A + 1], ARGV[A + 2], ARGV[A + 3]
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local out = cjson.decode(raw)

for tier, t in pairs(out.tiers) do
  local v = fq_vtime(tier)
  if t.ready then redis.call('ZADD', fq_gkey('ready:' .. tier), fq_num(v + tonumber(t.ready)), tid) end
  if t.finish then redis.call('HSET', fq_gkey('finish:' .. tier), tid, fq_num(v + tonumber(t.finish))) end
  if t.blocked then redis.call('SADD', fq_gkey('blocked:' .. tier), tid) end
  if t.timer then redis.call('ZADD', fq_gkey('timers'), t.timer, fq_timer_member(tier, tid)) end
end

for _, w in ipairs(out.waiters) do
  local tier, share, pool, tag = w[1], w[2], w[3], tonumber(w[4])
  redis.call('ZADD', fq_gkey('sw:' .. tier .. ':' .. share), fq_num(fq_vtime(tier) + tag), tid .. '|' .. pool)
end

-- A lease record names the scope keys it holds: the old shard's, until renamed here.
local function retag(record)
  local flat = redis.call('HGETALL', record)
  for i = 1, #flat, 2 do
    if string.sub(flat[i], 1, #from) == from then
      redis.call('HDEL', record, flat[i])
      redis.call('HSET', record, to .. string.sub(flat[i], #from + 1), flat[i + 1])
    end
  end
end

for _, e in ipairs(out.inflight) do
  local id, lease, share, slot = e[1], e[2], e[3], e[4]
  redis.call('ZADD', fq_gkey('inflight'), lease, tid .. '|' .. id)
  if share then
    local cap = fq_gkey('cap:' .. share)
    redis.call('ZADD', cap, slot, FQ_HOLDER .. id)
    cap_keep_alive(cap, math.max(0, tonumber(slot) - fq.now) + CAP_GRACE_MS)
  end
  retag(fq_holder_record(tid, id))
end

fq_count(tid)
redis.call('DEL', fq.tprefix .. tid .. fq.fence, KEYS[1])
fq_signal()
return 1
