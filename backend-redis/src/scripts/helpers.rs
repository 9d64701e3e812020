//! The Lua helpers the scripts paste in before their own body.

/// Lua helpers shared by the scripts that read the queue head: `purge` drops the waiters whose
/// liveness ran out (from both sets, and their asks when given) and says how many; `tell`
/// publishes "your turn" to a waiter on its client's channel (a waiter with no ask, queued by
/// an older client, hears nothing and finds its turn at its next re-check); `clock` is the
/// server's time in ms and µs;
/// `distlock_value` says whether a lock value has our layout (`<32 hex>:<token>...`), not another
/// recipe's (redis-py's `Lock` on our key, say).
pub(super) const PURGE: &str = r#"
local function purge(queue, alive, now, asks)
  local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', now)
  for _, w in ipairs(dead) do
    redis.call('ZREM', alive, w)
    redis.call('ZREM', queue, w)
    if asks then
      redis.call('HDEL', asks, w)
    end
  end
  return #dead
end
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end
local function now_ms()
  local ms = clock()
  return ms
end
local function tell(asks, member)
  local ask = redis.call('HGET', asks, member)
  local channel = ask and string.match(ask, '^%d*:[^:]*:(.+)$')
  if channel then
    redis.call('PUBLISH', channel, 't:' .. string.sub(member, 1, 32))
  end
end
local function distlock_value(v)
  return string.find(v, '^' .. string.rep('%x', 32) .. ':%d') ~= nil
end
local function keep_hash(shared, ttl)
  if redis.call('PTTL', shared) < ttl then
    redis.call('PEXPIRE', shared, ttl)
  end
end
"#;

/// The Lua helper (after [`PURGE`]'s) that hands a free lock on: `hand_on(lock, fence, queue,
/// alive, asks, leaving)` takes `leaving` (if not nil) out of the queue, drops the dead
/// waiters, then
/// * grants the lock to the live head when it is a lock's waiter (its ask has a TTL): INCR the
///   counter, `SET` the head's value for its TTL but no longer than its liveness has left (a
///   waiter that died meanwhile holds it up no longer than a dead waiter holds up the queue),
///   take it out of the queue, and publish `g<token>:<secret>` on its client's channel: the
///   waiter holds on receipt, with no request of its own. Its validity counts from the send
///   time of its last re-check, which set that liveness (see `wait`);
/// * else tells the head "your turn" (a semaphore's or a read-write lock's waiter, a Redlock
///   arbiter's).
pub(super) const HAND_ON: &str = r#"
local function hand_on(lock, fence, queue, alive, asks, leaving)
  if redis.call('EXISTS', queue) == 0 then
    return
  end
  if leaving then
    redis.call('ZREM', queue, leaving)
    redis.call('ZREM', alive, leaving)
    redis.call('HDEL', asks, leaving)
  end
  local now = now_ms()
  purge(queue, alive, now, asks)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if not head then
    return
  end
  local ask = redis.call('HGET', asks, head)
  local ttl, who, grants = nil, nil, nil
  if ask then
    ttl, who, grants = string.match(ask, '^(%d+):([^:]*):(.+)$')
  end
  local live = tonumber(redis.call('ZSCORE', alive, head))
  if not ttl or not live or live <= now then
    tell(asks, head)
    return
  end
  local token = redis.call('INCR', fence)
  redis.call('SET', lock, head .. ':' .. token .. who, 'PX', math.min(tonumber(ttl), live - now))
  redis.call('ZREM', queue, head)
  redis.call('ZREM', alive, head)
  redis.call('HDEL', asks, head)
  redis.call('PUBLISH', grants, 'g' .. token .. ':' .. head)
end
"#;
