"""The Lua script that decides a shared circuit in one round trip per decision.

Each member of a chain has, under the store's prefix (``{namespace}:circuit:``; the
braces are a Redis Cluster hash tag, so every key of a namespace lives on one node):

* ``m:<member key>``, a hash that exists only while the member is open or half-open:
  ``open_until`` (server milliseconds since the epoch), ``half_open`` (``1`` from the
  opening until a success), ``probe_owner`` and ``probe_until`` (the worker that owns the
  half-open probe, and when its claim lapses), ``reason`` (``failures``,
  ``retry_after`` or ``probe_failed``), ``opened_at`` and ``opened_by``;
* ``f:<member key>``, a sorted set of the fleet's failures in the window, scored by
  server milliseconds;
* ``i:<member key>``, a sorted set of the requests in flight to the member that a call
  tries first, one entry per request, scored by when its lease lapses (server
  milliseconds: the chain's per-attempt timeout, else ``duration``), so a lost outcome
  frees its place; the outcome (failure, success, or a release after a healthy success)
  removes it;
* ``members``, a hash of every member key seen to its ``window`` in milliseconds (what
  ``llm-resilience health`` lists).

Admission: a closed member the call would try first always takes an in-flight entry, but
only while it is *suspect* (at least one failure counted in the window) is it refused when
``failures counted + requests in flight >= failures``; a refused member is skipped as if
open (``BUSY``). So the fleet never sends a dead member more than ``failures`` requests
beyond those already in flight when its first failure arrived, and those are counted too.

Time is the Redis server's (``TIME``), so the hosts' clocks never matter. Every key but
``members`` expires: a hash one window plus one duration after its cooldown ends (the
member reads closed again), a failure set one window after its last failure.
"""

from __future__ import annotations

import hashlib
from typing import Final

#: Modes (ARGV[1]).
ORDER: Final = "order"
FAILED: Final = "failed"
SUCCEEDED: Final = "succeeded"
RELEASE: Final = "release"
READ: Final = "read"

#: Codes of the ``order`` reply, per member.
CLOSED: Final = 0  # try it in order
OPEN: Final = 1  # skip it
PROBE: Final = 2  # half-open, and this worker now owns the probe: try it
PROBE_OUT: Final = 3  # half-open, another call owns the probe: leave it for last
BUSY: Final = 4  # suspect, and the fleet's failures plus requests in flight fill it: skip

# KEYS[1] is the ``members`` hash; then a (hash, failure set, in-flight set) triple per
# member.
# order:     ARGV = mode, worker, duration_ms, window_ms, failures, lease_ms, request id,
#            then one member key per triple
#            -> {now, code_1, open_until_1, failures_1, held_1, code_2, ...} (held: 1
#            when the request took an in-flight entry of that member under its id)
# failed:    ARGV = mode, worker, duration_ms, window_ms, failures, retry_after_ms, entry,
#            released request id ('' for none)
#            -> {now, open_until, opened (1 when this failure opened it), failures}
# succeeded: ARGV = mode, released request id -> {now, was_half_open}
# release:   ARGV = mode, request ids -> {now}
# read:      ARGV = mode, window_ms per pair
#            -> {now, then per member: open_until, half_open, probe_owner, probe_until,
#                reason, opened_at, failures}
SCRIPT: Final = """
local mode = ARGV[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local out = {now}

if mode == 'order' then
  local worker = ARGV[2]
  local duration = tonumber(ARGV[3])
  local window = tonumber(ARGV[4])
  local threshold = tonumber(ARGV[5])
  local lease = tonumber(ARGV[6])
  local first = true
  for i = 1, (#KEYS - 1) / 3 do
    local h, f, q = KEYS[3 * i - 1], KEYS[3 * i], KEYS[3 * i + 1]
    redis.call('HSET', KEYS[1], ARGV[7 + i], window)
    local s = redis.call('HMGET', h, 'open_until', 'half_open', 'probe_until')
    local open_until = tonumber(s[1]) or 0
    local code = 0
    if open_until > now then
      code = 1
    elseif s[2] == '1' then
      if (tonumber(s[3]) or 0) <= now then
        redis.call('HSET', h, 'probe_owner', worker, 'probe_until', now + duration)
        code = 2
      else
        code = 3
      end
    end
    local failures = 0
    local held = 0
    if code == 0 then failures = redis.call('ZCOUNT', f, '(' .. (now - window), '+inf') end
    if code == 0 and first then
      redis.call('ZREMRANGEBYSCORE', q, '-inf', now)
      if failures > 0 and failures + redis.call('ZCARD', q) >= threshold then
        code = 4
      else
        redis.call('ZADD', q, now + lease, ARGV[7])
        redis.call('PEXPIRE', q, lease)
        held = 1
        first = false
      end
    elseif code == 2 then
      first = false
    end
    table.insert(out, code)
    table.insert(out, open_until)
    table.insert(out, failures)
    table.insert(out, held)
  end
  return out
end

if mode == 'failed' then
  local h, f = KEYS[2], KEYS[3]
  local worker = ARGV[2]
  local duration = tonumber(ARGV[3])
  local window = tonumber(ARGV[4])
  local threshold = tonumber(ARGV[5])
  local retry_after = tonumber(ARGV[6])
  if ARGV[8] ~= '' then redis.call('ZREM', KEYS[4], ARGV[8]) end
  local s = redis.call('HMGET', h, 'open_until', 'half_open')
  local open_until = tonumber(s[1]) or 0
  local was_open = open_until > now
  local reason = false
  local failures = 0
  if s[2] == '1' and open_until <= now then
    -- The probe (or a call that fell back on the half-open member) failed: not back yet.
    open_until = now + duration
    reason = 'probe_failed'
    redis.call('DEL', f)
  else
    redis.call('ZADD', f, now, ARGV[7])
    redis.call('ZREMRANGEBYSCORE', f, '-inf', now - window)
    redis.call('PEXPIRE', f, window)
    failures = redis.call('ZCARD', f)
    if failures >= threshold then
      if now + duration > open_until then
        open_until = now + duration
        reason = 'failures'
      end
      redis.call('DEL', f)
      failures = 0
    end
  end
  if retry_after > 0 and now + retry_after > open_until then
    open_until = now + retry_after
    reason = 'retry_after'
  end
  local opened = 0
  if reason then
    if not was_open then opened = 1 end
    redis.call('HSET', h, 'open_until', open_until, 'half_open', 1, 'probe_until', 0,
      'probe_owner', '', 'reason', reason, 'opened_at', now, 'opened_by', worker)
    redis.call('PEXPIRE', h, open_until - now + duration + window)
  end
  return {now, open_until, opened, failures}
end

if mode == 'succeeded' then
  if ARGV[2] ~= '' then redis.call('ZREM', KEYS[4], ARGV[2]) end
  local was = redis.call('HGET', KEYS[2], 'half_open')
  redis.call('DEL', KEYS[2], KEYS[3])
  if was == '1' then return {now, 1} end
  return {now, 0}
end

if mode == 'release' then
  redis.call('ZREM', KEYS[4], unpack(ARGV, 2))
  return out
end

if mode == 'read' then
  for i = 1, (#KEYS - 1) / 3 do
    local h, f = KEYS[3 * i - 1], KEYS[3 * i]
    local s = redis.call('HMGET', h, 'open_until', 'half_open', 'probe_owner', 'probe_until',
      'reason', 'opened_at')
    local window = tonumber(ARGV[1 + i])
    table.insert(out, tonumber(s[1]) or 0)
    table.insert(out, s[2] or '0')
    table.insert(out, s[3] or '')
    table.insert(out, tonumber(s[4]) or 0)
    table.insert(out, s[5] or '')
    table.insert(out, tonumber(s[6]) or 0)
    table.insert(out, redis.call('ZCOUNT', f, '(' .. (now - window), '+inf'))
  end
  return out
end
return redis.error_reply('unknown mode ' .. mode)
"""
SCRIPT_SHA: Final = hashlib.sha1(SCRIPT.encode()).hexdigest()
