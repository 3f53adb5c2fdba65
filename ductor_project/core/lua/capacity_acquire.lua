-- KEYS[1] = the holder's lease record, KEYS[2..n+1] = the scope ZSETs.
-- ARGV[1] = holder id, ARGV[2] = lease (ms), ARGV[3..n+2] = the scopes' limits.
local scopes, limits = {}, {}
for i = 2, #KEYS do
  scopes[#scopes + 1] = KEYS[i]
  limits[#limits + 1] = tonumber(ARGV[i + 1])
end
return cap_acquire(KEYS[1], scopes, limits, ARGV[1], tonumber(ARGV[2]), cap_now_ms())
