local key = KEYS[1]
local W, B, N = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local FT, EBP, MINC = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local QBP, MINL, OPENUS = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local GAP, MINP, CBP = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local MAXP, TF, TGAP = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
local WMIN, REC, TTL = tonumber(ARGV[17]), tonumber(ARGV[18]), tonumber(ARGV[19])
local NOPS = tonumber(ARGV[20])
local BP = 10000

local v = redis.call('HMGET', key, 'st', 'since', 'until', 'ep', 'why', 'last', 'fl', 'head',
  'c', 'x', 's', 'pn', 'pok', 'psl', 'pl', 'w', 'wt', 'wc', 'n', 'bw')
local st = tonumber(v[1]) or 0
local since = tonumber(v[2]) or 0
local untl = tonumber(v[3]) or 0
local ep = tonumber(v[4]) or 0
local why = v[5] or ''
local last = tonumber(v[6])
local fl = {}
if v[7] then
  for t in string.gmatch(v[7], '[^,]+') do fl[#fl + 1] = tonumber(t) end
end
local head = tonumber(v[8]) or -1
local c, x, s = tonumber(v[9]) or 0, tonumber(v[10]) or 0, tonumber(v[11]) or 0
local pn, pok, psl = tonumber(v[12]) or 0, tonumber(v[13]) or 0, tonumber(v[14]) or 0
local pl = tonumber(v[15]) or -1
local w, wt, wc = tonumber(v[16]) or 1, tonumber(v[17]) or 0, tonumber(v[18]) or -1

if last and now < last then now = last end
local oldn = tonumber(v[19])
if oldn and (oldn ~= N or tonumber(v[20]) ~= B) then
  local f = {}
  for i = 0, oldn - 1 do f[#f + 1] = 'b' .. i end
  redis.call('HDEL', key, unpack(f))
  head, c, x, s = -1, 0, 0, 0
end

local function fmt(n) return string.format('%d', n) end
local tr = {}

local bk = nil

local function clear_buckets()
  if c > 0 then
    local f = {}
    for i = 0, N - 1 do f[#f + 1] = 'b' .. i end
    redis.call('HDEL', key, unpack(f))
  end
  c, x, s = 0, 0, 0
  bk = nil
end

local function enter(new, at, reason)
  tr[#tr + 1] = {st, new, at, reason}
  st, since, why = new, at, reason
  pn, pok, psl, pl = 0, 0, 0, -1
  if new == 1 then
    ep = ep + 1
    untl = at + OPENUS
    clear_buckets()
    fl = {}
  end
end

local function parse(e)
  local bi, bc, bx, bs = string.match(e, '^(%-?%d+):(%d+):(%d+):(%d+)$')
  return tonumber(bi), tonumber(bc), tonumber(bx), tonumber(bs)
end

local function roll()
  local cur = math.floor(now / B)
  if cur <= head then return end
  if head < 0 or cur - head >= N then
    clear_buckets()
  else
    for j = head - N + 1, cur - N do
      local f = 'b' .. (j % N)
      local e = redis.call('HGET', key, f)
      if e then
        local bi, bc, bx, bs = parse(e)
        if bi == j then
          c, x, s = c - bc, x - bx, s - bs
          redis.call('HDEL', key, f)
        end
      end
    end
  end
  head = cur
end

local function add_call(fail, slow)
  if not bk then
    bk = {head, 0, 0, 0}
    local e = redis.call('HGET', key, 'b' .. (head % N))
    if e then
      local bi, bc, bx, bs = parse(e)
      if bi == head then bk = {head, bc, bx, bs} end
    end
  end
  bk[2], c = bk[2] + 1, c + 1
  if fail then bk[3], x = bk[3] + 1, x + 1 end
  if slow then bk[4], s = bk[4] + 1, s + 1 end
end

local function record_closed(fail, slow)
  add_call(fail, slow)
  if fail then
    fl[#fl + 1] = now
    if #fl >= FT and fl[#fl - FT + 1] > now - W then
      enter(1, now, 'failures:' .. fmt(FT))
      return
    end
    if #fl > FT - 1 then
      local keep = {}
      for i = #fl - FT + 2, #fl do keep[#keep + 1] = fl[i] end
      fl = keep
    end
  end
  if c >= MINC and x * BP > EBP * c then
    enter(1, now, 'error_rate:' .. fmt(x) .. '/' .. fmt(c))
    return
  end
  local rank = math.floor((QBP * c + BP - 1) / BP)
  if c >= MINL and s > c - rank then
    enter(1, now, 'latency:' .. fmt(s) .. '/' .. fmt(c))
  end
end

local function record_probe(fail, slow, reason)
  if fail then
    if reason == '' then enter(1, now, 'probe_failed')
    else enter(1, now, 'probe_failed:' .. reason) end
    return
  end
  pn = pn + 1
  if slow then psl = psl + 1 else pok = pok + 1 end
  if pn >= MINP and pok * BP >= CBP * pn then
    enter(0, now, 'probes_ok:' .. fmt(pok) .. '/' .. fmt(pn))
  elseif psl * BP > (BP - CBP) * MAXP then
    enter(1, now, 'probes_slow:' .. fmt(psl) .. '/' .. fmt(pn))
  end
end

local granted = {}
for i = 0, NOPS - 1 do
  local base = 21 + i * 6
  local kind, verdict = ARGV[base], ARGV[base + 1]
  local slow, probe = ARGV[base + 2] == '1', ARGV[base + 3] == '1'
  local pep, reason = tonumber(ARGV[base + 4]), ARGV[base + 5]
  if st == 1 and now >= untl then enter(2, untl, 'open_elapsed') end
  roll()
  local g = '0'
  if kind == 'n' or kind == 'g' then
    if st == 2 and (kind == 'n' or pl < 0 or now - pl >= GAP) then
      pl = now
      g = '1'
    end
  elseif kind == 'r' then
    if verdict == 't' then
      if wc < 0 or now - wc >= TGAP then
        local cw = math.min(1, w + (now - wt) / REC)
        w = math.max(WMIN, cw * TF)
        wt, wc = now, now
      end
    elseif st == 0 then
      record_closed(verdict == 'f', slow)
    elseif st == 2 and probe and (pep < 0 or pep == ep) then
      record_probe(verdict == 'f', slow, reason)
    end
  end
  granted[#granted + 1] = g
end

if bk then
  redis.call('HSET', key, 'b' .. (bk[1] % N),
    fmt(bk[1]) .. ':' .. fmt(bk[2]) .. ':' .. fmt(bk[3]) .. ':' .. fmt(bk[4]))
end
local flo = {}
for i = 1, #fl do flo[i] = fmt(fl[i]) end
redis.call('HSET', key, 'st', fmt(st), 'since', fmt(since), 'until', fmt(untl), 'ep', fmt(ep),
  'why', why, 'last', fmt(now), 'fl', table.concat(flo, ','), 'head', fmt(head),
  'c', fmt(c), 'x', fmt(x), 's', fmt(s), 'pn', fmt(pn), 'pok', fmt(pok), 'psl', fmt(psl),
  'pl', fmt(pl), 'w', string.format('%.17g', w), 'wt', fmt(wt), 'wc', fmt(wc),
  'n', fmt(N), 'bw', fmt(B))
redis.call('PEXPIRE', key, TTL)

local out = {table.concat(granted), st, since, untl, ep, why, now, c, x, s, pn, pok, psl, pl,
  string.format('%.17g', math.min(1, w + (now - wt) / REC)), #tr}
for i = 1, #tr do
  for j = 1, 4 do out[#out + 1] = tr[i][j] end
end
return out
