//! The scripts of the policies a queue admits more than one holder under (permits, readers),
//! and of exclusive holders queued beside them (writers).

use std::sync::LazyLock;

use super::Lua;
use super::helpers::{HAND_ON, PURGE};

/// KEYS: lock, fence, queue, alive, shared, asks. ARGV: secret, ttl ms, waiting (0/1), waiter
/// ttl ms, limit, policy (`x` exclusive: the holder is the lock key; `p` a permit and `s` a
/// reader: a field of the shared hash), holder segment, the client's turn channel. The queue
/// for every policy but a plain lock's ([`ACQUIRE`](super::ACQUIRE), which keeps its
/// three-command fast path; a lock's name never has shared holders). In order:
/// * ours already (a retry after a lost reply): refresh, return `{1, token}`;
/// * the lock key held under a value distlock does not write: return `{-4, 0}` (as
///   [`ACQUIRE`](super::ACQUIRE));
/// * the limits ahead of us: the lock key's holder (1), each live shared holder (expired fields
///   are dropped), each live waiter queued before us;
/// * a permit seeing another limit ahead leaves the queue and returns `{-2, their limit}`;
/// * admitted (fewer ahead than the smallest limit among them and us): INCR the counter, take
///   the lock key or a shared field, leave the queue, and grant the heads that fit beside us
///   now too (`admit_heads` in `HAND_ON`); return `{1, token}`;
/// * else a waiter joins (first join only, with its ask `:<policy><ttl><holder>:<channel>`,
///   what a release needs to grant it) and refreshes its liveness; return `{0, bound}`, the
///   time until the first holder's expiry (the next re-check), or -3.
pub static ADMIT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"{PURGE}{HAND_ON}
local lock, fence, queue, alive, shared, asks = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local me, ttl, waiting, wttl = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1', tonumber(ARGV[4])
local limit, policy = tonumber(ARGV[5]), ARGV[6]
local member = me
if limit ~= 1 then
  member = me .. '#' .. limit
end
local now, arrival = clock()
local holders, ahead, bound = {{}}, {{}}, -3
local function soon(ms)
  if ms >= 0 and (bound < 0 or ms < bound) then
    bound = ms
  end
end
local cur = redis.call('GET', lock)
if cur then
  if string.sub(cur, 1, 33) == me .. ':' then
    redis.call('PEXPIRE', lock, ttl)
    return {{1, tonumber(string.match(cur, '^%x+:(%d+)'))}}
  end
  if not distlock_value(cur) then
    return {{-4, 0}}
  end
  holders[#holders + 1] = 1
  soon(redis.call('PTTL', lock))
end
local held = redis.call('HGETALL', shared)
for i = 1, #held, 2 do
  local exp, token, lim, who = string.match(held[i + 1], '^(%d+):(%d+):(%d+)(.*)$')
  exp = tonumber(exp)
  if exp <= now then
    redis.call('HDEL', shared, held[i])
  elseif held[i] == me then
    redis.call('HSET', shared, me, (now + ttl) .. ':' .. token .. ':' .. lim .. who)
    keep_hash(shared, ttl)
    return {{1, tonumber(token)}}
  else
    holders[#holders + 1] = tonumber(lim)
    soon(exp - now)
  end
end
for _, l in ipairs(holders) do
  ahead[#ahead + 1] = l
end
purge(queue, alive, now, asks)
for _, w in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
  if w == member then
    break
  end
  ahead[#ahead + 1] = limit_of(w)
end
if policy == 'p' then
  for _, l in ipairs(ahead) do
    if l ~= limit then
      dequeue(queue, alive, asks, member)
      return {{-2, l}}
    end
  end
end
local smallest = limit
for _, l in ipairs(ahead) do
  smallest = math.min(smallest, l)
end
if #ahead < smallest then
  local token = redis.call('INCR', fence)
  if policy == 'x' then
    redis.call('SET', lock, me .. ':' .. token .. ARGV[7], 'PX', ttl)
  else
    redis.call('HSET', shared, me, (now + ttl) .. ':' .. token .. ':' .. limit .. ARGV[7])
    keep_hash(shared, ttl)
  end
  dequeue(queue, alive, asks, member)
  if redis.call('EXISTS', queue) == 1 then
    admit_heads(lock, fence, queue, alive, shared, asks, now)
  end
  return {{1, token}}
end
if waiting then
  enqueue(queue, alive, asks, member, arrival, now + wttl, wttl, ':' .. policy .. ttl .. ARGV[7] .. ':' .. ARGV[8])
end
return {{0, bound}}
"#
    ))
});

/// KEYS: shared, queue, alive, asks, lock, fence. ARGV: secret. Removes our shared field (a
/// permit's or a reader's), then grants the queue's live heads that fit now (`admit_heads` in
/// `HAND_ON`): a waiter holds on the message, with no request of its own. Returns 1 if it was
/// ours and live, 0 otherwise (an expired field of ours is removed all the same).
pub static RELEASE_SHARED: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"{PURGE}{HAND_ON}
local shared, queue, alive, asks, lock, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local cur = redis.call('HGET', shared, ARGV[1])
if not cur then
  return 0
end
redis.call('HDEL', shared, ARGV[1])
local now = now_ms()
if redis.call('EXISTS', queue) == 1 then
  purge(queue, alive, now, asks)
  admit_heads(lock, fence, queue, alive, shared, asks, now)
end
if tonumber(string.match(cur, '^(%d+):')) <= now then
  return 0
end
return 1
"#
    ))
});
