-- KEYS[1] = a scope ZSET.
return cap_in_flight(KEYS[1], cap_now_ms())
