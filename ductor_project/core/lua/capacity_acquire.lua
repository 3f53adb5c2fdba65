-- KEYS[1] = the holder's lease record, KEYS[2..n+1] = the scope ZSETs, KEYS[n+2] = the tenant's fence.
-- ARGV[1] = holder id, ARGV[2] = lease (ms), ARGV[3..n+2] = the scopes' limits.
local fenced = fence_check(KEYS[#KEYS])
if fenced then return fenced end
local scopes, limits = {}, {}
for i = 2, #KEYS - 1 do
  scopes[#scopes + 1] = KEYS[i]
  limits[#limits + 1] = tonumber(ARGV[i + 1])
end
return cap_acquire(KEYS[1], scopes, limits, ARGV[1], tonumber(ARGV[2]), cap_now_ms())
