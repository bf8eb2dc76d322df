"""The Lua script that decides every request on a Redis bucket in one round trip."""

from __future__ import annotations

import hashlib
from typing import Any, Final

from llm_resilience.ratelimit._protocol import PERIOD_SECONDS

# Modes of the script (ARGV[1]).
_RESERVE: Final = "reserve"  # grant now, or reserve the permit and answer when it is due
_TRY: Final = "try"  # grant now, or refuse without reserving anything
_REFUND: Final = "refund"  # give a permit back, unless its due time (ARGV[7]) has passed
_ADJUST: Final = "adjust"  # add to the token field (negative: charge), capped at capacity
#: A due time (server microseconds) no clock reaches: a refund carrying it always applies.
#: A cancelled caller gives back what it was granted or reserved, due or not.
_NEVER_DUE: Final = 2**62

# One script, one round trip per decision. Fields: r = request permits, t = token permits,
# ts = start of the current refill period, in server microseconds. A missing key is a full
# bucket, so the key expires exactly when the bucket would have refilled to capacity
# (and is deleted when a refund or give-back fills it): expiry never changes an answer.
# Numbers are written with %.0f because Lua's default tostring keeps 14 digits and
# microsecond timestamps have 16.
_SCRIPT: Final = """
local key = KEYS[1]
local mode = ARGV[1]
local capacity = tonumber(ARGV[2])
local per_period = tonumber(ARGV[3])
local token_capacity = tonumber(ARGV[4])
local tokens_per_period = tonumber(ARGV[5])
local amount = tonumber(ARGV[6])
local due = tonumber(ARGV[7])
local period = tonumber(ARGV[8])
local weighed = token_capacity > 0

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local state = redis.call('HMGET', key, 'r', 't', 'ts')
local permits = tonumber(state[1]) or capacity
local tokens = tonumber(state[2]) or token_capacity
local last = tonumber(state[3]) or now
if last > now then last = now end
local steps = math.floor((now - last) / period)
if steps > 0 then
  permits = math.min(capacity, permits + steps * per_period)
  if weighed then tokens = math.min(token_capacity, tokens + steps * tokens_per_period) end
  last = last + steps * period
end

-- Periods until the request and token fields are both >= 0 (both pay off every reservation).
local function periods_until_paid(p, t)
  local n = 0
  if p < 0 then n = math.ceil(-p / per_period) end
  if weighed and t < 0 then n = math.max(n, math.ceil(-t / tokens_per_period)) end
  return n
end

local granted = 1
local due_at = now
if mode == 'reserve' then
  permits = permits - 1
  if weighed then tokens = tokens - amount end
  local n = periods_until_paid(permits, tokens)
  if n > 0 then due_at = last + n * period end
elseif mode == 'try' then
  if permits < 1 or (weighed and tokens < amount) then
    local n = periods_until_paid(permits - 1, tokens - amount)
    return {0, last + n * period - now, now}
  end
  permits = permits - 1
  if weighed then tokens = tokens - amount end
elseif mode == 'refund' then
  if now >= due then return {0, 0, now} end
  permits = math.min(capacity, permits + 1)
  if weighed then tokens = math.min(token_capacity, tokens + amount) end
elseif mode == 'adjust' then
  tokens = math.min(token_capacity, tokens + amount)
end

local n = 0
if permits < capacity then n = math.ceil((capacity - permits) / per_period) end
if weighed and tokens < token_capacity then
  n = math.max(n, math.ceil((token_capacity - tokens) / tokens_per_period))
end
if n == 0 then
  redis.call('DEL', key)
else
  redis.call('HSET', key, 'r', string.format('%.0f', permits), 'ts', string.format('%.0f', last))
  if weighed then redis.call('HSET', key, 't', string.format('%.0f', tokens)) end
  redis.call('PEXPIRE', key, math.ceil((last + n * period - now) / 1000))
end
return {granted, due_at - now, due_at}
"""
_SCRIPT_SHA: Final = hashlib.sha1(_SCRIPT.encode()).hexdigest()
_PERIOD_MICROSECONDS: Final = round(PERIOD_SECONDS * 1_000_000)

# (granted, microseconds until due, due time in server microseconds)
_Reply = tuple[bool, int, int]


def _parse(raw: Any) -> _Reply:
    granted, wait_us, due_us = raw
    return bool(int(granted)), int(wait_us), int(due_us)
