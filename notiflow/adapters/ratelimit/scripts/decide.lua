
local W = tonumber(ARGV[4])
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local tier = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local ttl = tonumber(ARGV[5])
local E = tonumber(ARGV[6])
local cap, pre = {}, {}
for h = 0, 3 do
  cap[h] = tonumber(ARGV[8 + h])
  pre[h] = tonumber(ARGV[12 + h])
end
local meta = KEYS[6]
local mv = redis.call('HMGET', meta, 'last', 'seq', 'em',
  'g0', 'g1', 'g2', 'g3', 'd0', 'd1', 'd2', 'd3')
if mv[1] and now < tonumber(mv[1]) then now = tonumber(mv[1]) end
local nowstr = string.format('%d', now)
local seq = tonumber(mv[2]) or 0
local em = tonumber(mv[3]) or 0
local g, d = {}, {}
for h = 0, 3 do
  g[h] = tonumber(mv[4 + h]) or 0
  d[h] = tonumber(mv[8 + h]) or 0
end
local cutoff = string.format('%d', now - W)
for h = 0, 3 do
  local old = redis.call('ZRANGEBYSCORE', KEYS[h + 1], '-inf', cutoff)
  if #old > 0 then
    for _, m in ipairs(old) do
      local _, dn, gk = string.match(m, '^(%d+):(%d+):(%d+)$')
      d[h] = d[h] - tonumber(dn)
      g[h] = g[h] - tonumber(gk)
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[h + 1], '-inf', cutoff)
  end
end
local oldem = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', cutoff)
if #oldem > 0 then
  for _, m in ipairs(oldem) do em = em - tonumber(string.match(m, ':(%d+)$')) end
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', cutoff)
end

local function room(gg, dd)
  local used = 0
  for h = 0, tier - 1 do used = used + math.max(gg[h], math.min(dd[h], cap[h])) end
  local best = math.huge
  for m = tier, 3 do
    used = used + gg[m]
    best = math.min(best, math.floor(pre[m] - used))
  end
  return best
end

local avail = n
local tokens, trate = 0, 0
local tkey = KEYS[7]
if tkey then
  trate = tonumber(ARGV[7])
  local burst = math.max(1, trate)
  local tv = redis.call('HMGET', tkey, 'tokens', 'ts')
  if tv[1] then
    local el = now - tonumber(tv[2])
    if el < 0 then el = 0 end
    tokens = math.min(burst, tonumber(tv[1]) + el * trate / 1000000)
  else
    tokens = burst
  end
  avail = math.max(0, math.min(n, math.floor(tokens)))
end

local room_now = room(g, d)
local kreg = math.max(0, math.min(avail, room_now))
local kem = 0
if tier == 0 and E > 0 then
  kem = math.max(0, math.min(avail - kreg, math.floor(E - em)))
end
local k = kreg + kem
if avail > 0 then
  seq = seq + 1
  redis.call('ZADD', KEYS[tier + 1], nowstr, string.format('%d:%d:%d', seq, avail, kreg))
  d[tier] = d[tier] + avail
  g[tier] = g[tier] + kreg
end
if kem > 0 then
  seq = seq + 1
  redis.call('ZADD', KEYS[5], nowstr, string.format('%d:%d', seq, kem))
  em = em + kem
end
if tkey then
  tokens = tokens - k
  redis.call('HSET', tkey, 'tokens', string.format('%.17g', tokens), 'ts', nowstr)
  redis.call('PEXPIRE', tkey, ttl + math.ceil(math.max(1, trate) / trate * 1000))
end
redis.call('HSET', meta, 'last', nowstr, 'seq', string.format('%d', seq),
  'em', string.format('%d', em),
  'g0', string.format('%d', g[0]), 'g1', string.format('%d', g[1]),
  'g2', string.format('%d', g[2]), 'g3', string.format('%d', g[3]),
  'd0', string.format('%d', d[0]), 'd1', string.format('%d', d[1]),
  'd2', string.format('%d', d[2]), 'd3', string.format('%d', d[3]))
for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], ttl) end

local CHUNK = 32
local function cursor(key)
  return {key = key, buf = {}, pos = 1, off = 0, done = false}
end
local function head(c)
  if c.pos > #c.buf then
    if c.done then return nil end
    c.buf = redis.call('ZRANGE', c.key, c.off, c.off + CHUNK - 1, 'WITHSCORES')
    c.off = c.off + CHUNK
    c.pos = 1
    c.done = #c.buf < 2 * CHUNK
    if #c.buf == 0 then return nil end
  end
  return tonumber(c.buf[c.pos + 1])
end

local room_after = math.max(0, room(g, d))
local wait = 0
if k == 0 then
  local pw = 0
  if room_now < 1 then
    pw = W
    local cs = {}
    for h = 0, 3 do cs[h] = cursor(KEYS[h + 1]) end
    while true do
      local best, bh = nil, nil
      for h = 0, 3 do
        local at = head(cs[h])
        if at and (best == nil or at < best) then best, bh = at, h end
      end
      if best == nil then break end
      local c = cs[bh]
      local _, dn, gk = string.match(c.buf[c.pos], '^(%d+):(%d+):(%d+)$')
      c.pos = c.pos + 2
      d[bh] = d[bh] - tonumber(dn)
      g[bh] = g[bh] - tonumber(gk)
      if room(g, d) >= 1 then
        pw = best + W - now
        break
      end
    end
  end
  if tier == 0 and E >= 1 then
    local ew = 0
    if math.floor(E - em) < 1 then
      ew = W
      local left = em
      local c = cursor(KEYS[5])
      while true do
        local at = head(c)
        if at == nil then break end
        left = left - tonumber(string.match(c.buf[c.pos], ':(%d+)$'))
        c.pos = c.pos + 2
        if math.floor(E - left) >= 1 then
          ew = at + W - now
          break
        end
      end
    end
    pw = math.min(pw, ew)
  end
  local tw = 0
  if tkey and tokens < 1 then tw = math.ceil((1 - tokens) * 1000000 / trate) + 1 end
  wait = math.max(pw, tw, 1)
end
return {k, kem, wait, now, room_after}
