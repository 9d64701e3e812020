//! The Lua helpers the scripts paste in before their own body.

/// Lua helpers shared by the scripts that read the queue head: `purge` drops the waiters whose
/// liveness ran out (from both sets, and their asks when given) and says how many; `tell`
/// publishes "your turn" to a waiter on its client's channel (a waiter with no ask, queued by
/// an older client, hears nothing and finds its turn at its next re-check); `dequeue` takes a
/// member out of the queue, its liveness and its ask; `enqueue` puts it in (arrival order, first
/// join only, with its ask) and refreshes its liveness deadline; `clock` is the
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
local function dequeue(queue, alive, asks, member)
  redis.call('ZREM', queue, member)
  redis.call('ZREM', alive, member)
  redis.call('HDEL', asks, member)
end
local function enqueue(queue, alive, asks, member, arrival, live, wttl, ask)
  if redis.call('ZADD', queue, 'NX', arrival, member) == 1 then
    redis.call('HSET', asks, member, ask)
  end
  redis.call('ZADD', alive, live, member)
  redis.call('PEXPIRE', queue, wttl)
  redis.call('PEXPIRE', alive, wttl)
  redis.call('PEXPIRE', asks, wttl)
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

/// The Lua helpers (after [`PURGE`]'s) that hand a free lock, free permits or a free read-write
/// lock on. A policy's waiter (a permit, a reader, a writer: [`ADMIT`](super::ADMIT)) asks
/// `:<policy><ttl ms><holder>:<channel>`, `<policy>` one of `p`, `s`, `x`; an ask of another
/// shape (a Redlock arbiter's waiter, an older client's) is only told.
///
/// `admit_heads(lock, fence, queue, alive, shared, asks, now)` counts the holders (the lock
/// key's 1, each live shared field's limit; expired fields dropped) and, while the queue's head
/// fits beside them by the policy rule (fewer holders than the smallest limit among them and
/// it), grants it: INCR the counter, take the lock key (a writer) or a shared field (a permit,
/// a reader) for its TTL but no longer than its liveness has left, take it out of the queue,
/// and publish `g<token>:<secret>` on its client's channel. The head that does not fit waits;
/// one that asked another way, or a permit of another limit than the holders', is told "your
/// turn" and asks itself (the permit is then refused). So a writer's release grants every
/// reader queued behind it in one script call.
///
/// `hand_on(lock, fence, queue, alive, asks, leaving, shared)` takes `leaving` (if not nil) out
/// of the queue, drops the dead waiters, then
/// * grants the lock to the live head when it is a lock's waiter (its ask `<ttl>:<holder>:
///   <channel>` has a TTL), as above: the waiter holds on receipt, with no request of its own.
///   Its validity counts from the send time of its last re-check, which set that liveness (see
///   `wait`);
/// * admits the heads by `admit_heads` when they are a policy's waiters (`shared` given);
/// * else tells the head "your turn" (a Redlock arbiter's waiter).
pub(super) const HAND_ON: &str = r#"
local function limit_of(m)
  return tonumber(string.match(m, '#(%d+)$')) or 1
end
local function admit_heads(lock, fence, queue, alive, shared, asks, now)
  local ahead, smallest = {}, math.huge
  local cur = redis.call('GET', lock)
  if cur then
    if not distlock_value(cur) then
      return
    end
    ahead[1], smallest = 1, 1
  end
  local held = redis.call('HGETALL', shared)
  for i = 1, #held, 2 do
    local exp, lim = string.match(held[i + 1], '^(%d+):%d+:(%d+)')
    if tonumber(exp) <= now then
      redis.call('HDEL', shared, held[i])
    else
      ahead[#ahead + 1] = tonumber(lim)
      smallest = math.min(smallest, tonumber(lim))
    end
  end
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
      return
    end
    local limit = limit_of(head)
    if #ahead >= math.min(smallest, limit) then
      return
    end
    local ask = redis.call('HGET', asks, head) or ''
    local policy, ttl, who, grants = string.match(ask, '^:([psx])(%d+)([^:]*):(.+)$')
    local live = tonumber(redis.call('ZSCORE', alive, head))
    local other = false
    if policy == 'p' then
      for _, l in ipairs(ahead) do
        other = other or l ~= limit
      end
    end
    if not policy or not live or live <= now or other then
      tell(asks, head)
      return
    end
    local secret = string.sub(head, 1, 32)
    local token = redis.call('INCR', fence)
    local ms = math.min(tonumber(ttl), live - now)
    if policy == 'x' then
      redis.call('SET', lock, secret .. ':' .. token .. who, 'PX', ms)
    else
      redis.call('HSET', shared, secret, (now + ms) .. ':' .. token .. ':' .. limit .. who)
      keep_hash(shared, ms)
    end
    dequeue(queue, alive, asks, head)
    redis.call('PUBLISH', grants, 'g' .. token .. ':' .. secret)
    ahead[#ahead + 1] = limit
    smallest = math.min(smallest, limit)
  end
end
local function hand_on(lock, fence, queue, alive, asks, leaving, shared)
  if redis.call('EXISTS', queue) == 0 then
    return
  end
  if leaving then
    dequeue(queue, alive, asks, leaving)
  end
  local now = now_ms()
  purge(queue, alive, now, asks)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if not head then
    return
  end
  local ask = redis.call('HGET', asks, head)
  if shared and ask and string.sub(ask, 1, 1) == ':' then
    admit_heads(lock, fence, queue, alive, shared, asks, now)
    return
  end
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
  dequeue(queue, alive, asks, head)
  redis.call('PUBLISH', grants, 'g' .. token .. ':' .. head)
end
"#;
