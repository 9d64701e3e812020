//! The lock's scripts: acquire (and queue), leave the queue, renew, release (and hand on).

use std::sync::LazyLock;

use super::Lua;
use super::helpers::{HAND_ON, PURGE};

/// KEYS: lock, fence, queue, alive, asks. ARGV: secret, ttl ms, waiting (0/1), waiter ttl ms,
/// arbiter (0/1), holder segment, the client's turn channel.
/// * Nobody queued and the lock free (the common case): INCR the bucket counter, `SET NX PX`,
///   return `{1, token}`. Three commands and no read, because on this path every extra command
///   measurably costs throughput (each `redis.call` is ~1-3 us of server time against a ~100 us
///   pair). The counter steps even when the `SET` finds the lock taken: tokens only have to
///   increase, not to be consecutive.
/// * Ours already (a retry after a lost reply): refresh the TTL, return `{1, token}`.
/// * Held under a value distlock does not write (another recipe's lock on our key, which jumps
///   our queue and wakes none of our waiters): return `{-4, 0}`, refused (nothing joined). Not on
///   a Redlock arbiter, whose queue is Redlock's own: there it is a holder like any other.
/// * Held by another: a waiter joins the queue (arrival order, first join only, with its ask:
///   `<ttl>:<holder>:<channel>`, what a release needs to grant it, `HAND_ON`; an arbiter's
///   waiter with no TTL: it is only woken) and refreshes its
///   liveness; return `{0, pttl}` (the next re-check bound). A re-check that finds the lock
///   handed to it already takes the case above.
/// * Free, but a live waiter other than us heads the queue: it is promised to that waiter; a
///   waiter joins the queue; return `{0, -3}`. If dead waiters were just dropped, the new head
///   is told.
/// * Free and we head the queue (or every waiter in it was dead): as the first case, and leave
///   the queue.
///
/// On a name's Redlock arbiter (`arbiter` = 1) no counter is kept (token 0: Redlock hands out
/// none) and a granted waiter joins or keeps the head of the queue instead of leaving it, until
/// its release leaves it ([`RELEASE`] with `leave`): the arbiter alone does not make a Redlock
/// grant, and a waiter the other nodes then refuse keeps its turn. Its place lives no longer
/// than the lock it was granted, so a holder that crashed holds up the queue only until its
/// lock expires. A first ask there (not waiting) with nobody queued is one `SET NX PX`; with a
/// live waiter other than us at the queue's head it returns `{0, -3}` while the lock is free or
/// held by that head, so the round gives back what the other nodes granted: the queue decides
/// who is next. Held by anyone else (a key a cut release left, a split round's), it is a holder
/// like any other, and a majority elsewhere still wins, as it would without a queue.
pub static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
local lock, fence, queue, alive, asks = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local me, ttl, waiting, wttl = ARGV[1], ARGV[2], ARGV[3] == '1', tonumber(ARGV[4])
local arbiter = ARGV[5] == '1'
local queued = redis.call('EXISTS', queue) == 1
if not queued and not arbiter then
  local token = redis.call('INCR', fence)
  if redis.call('SET', lock, me .. ':' .. token .. ARGV[6], 'NX', 'PX', ttl) then
    return {{1, token}}
  end
elseif not queued and not waiting then
  if redis.call('SET', lock, me .. ':0' .. ARGV[6], 'NX', 'PX', ttl) then
    return {{1, 0}}
  end
end
{PURGE}
local cur = redis.call('GET', lock)
if cur and string.sub(cur, 1, 33) == me .. ':' then
  redis.call('PEXPIRE', lock, ttl)
  return {{1, tonumber(string.match(cur, '^%x+:(%d+)'))}}
end
if cur and not arbiter and not distlock_value(cur) then
  return {{-4, 0}}
end
local now, arrival, purged, head = 0, 0, 0, nil
if queued or waiting then
  now, arrival = clock()
end
if queued then
  purged = purge(queue, alive, now, asks)
  head = redis.call('ZRANGE', queue, 0, 0)[1]
end
local function join(live)
  if waiting then
    local asked = ttl
    if arbiter then
      asked = ''
    end
    enqueue(queue, alive, asks, me, arrival, now + live, wttl, asked .. ':' .. ARGV[6] .. ':' .. ARGV[7])
  end
end
local passing = head and head ~= me and arbiter and not waiting
  and (not cur or string.sub(cur, 1, 32) == head)
if cur and not passing then
  join(wttl)
  return {{0, redis.call('PTTL', lock)}}
end
if head and head ~= me then
  join(wttl)
  if purged > 0 and not cur then
    tell(asks, head)
  end
  return {{0, -3}}
end
local token = 0
if not arbiter then
  token = redis.call('INCR', fence)
end
redis.call('SET', lock, me .. ':' .. token .. ARGV[6], 'PX', ttl)
if arbiter then
  join(math.min(wttl, tonumber(ttl)))
elseif head then
  dequeue(queue, alive, asks, me)
end
return {{1, token}}
"#
    ))
});

/// KEYS: queue, alive, lock, fence, asks, shared. ARGV: queue member (the secret, with
/// `#<limit>` for a permit or a reader, as [`ADMIT`](super::ADMIT) queued it).
/// A waiter that gives up (timeout, error, cancellation) leaves the queue. If a release granted
/// it the lock key or a shared field meanwhile (`HAND_ON`: the grant may be in flight to it, or
/// never read), it lets go of it. Unless the lock key is held, it then hands on to the new
/// heads at once instead of at their next re-check. Held by the queue's head (only on a Redlock
/// arbiter, whose granted waiter stays at the head until the other nodes grant it too), the head
/// is told: what the leaver held on those nodes is gone (it leaves after letting go there), and
/// a head that gives the arbiter back before asking them again would else not hear of it.
pub static LEAVE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"{PURGE}{HAND_ON}
local queue, alive, lock, fence, asks, shared = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local secret = string.sub(ARGV[1], 1, 32)
dequeue(queue, alive, asks, ARGV[1])
redis.call('HDEL', shared, secret)
local cur = redis.call('GET', lock)
if cur and string.sub(cur, 1, 33) == secret .. ':' then
  redis.call('DEL', lock)
  cur = false
end
if not cur then
  hand_on(lock, fence, queue, alive, asks, nil, shared)
elseif string.sub(cur, 1, 32) == redis.call('ZRANGE', queue, 0, 0)[1] then
  tell(asks, string.sub(cur, 1, 32))
end
return 1
"#
    ))
});

/// KEYS: lock or shared hash 1..n (a grant's resource). ARGV: secret 1, ttl ms 1, ..., secret
/// n, ttl ms n. PEXPIREs each lock that is still ours, and moves the expiry of each shared field
/// that is still ours and live; never creates anything. Returns one 1 (renewed) or 0 (not ours:
/// expired, taken or released) per key. One call renews every lease a watchdog tick finds due
/// (all in one hash slot on Cluster), so renewal traffic does not grow with the lease count.
pub static RENEW: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"{PURGE}
local out, now = {{}}, nil
for i, key in ipairs(KEYS) do
  local me, ttl = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  if string.match(key, '^%b{{}}:shared:') then
    now = now or now_ms()
    local cur = redis.call('HGET', key, me)
    local exp, rest = nil, nil
    if cur then
      exp, rest = string.match(cur, '^(%d+):(.*)$')
    end
    if exp and tonumber(exp) > now then
      redis.call('HSET', key, me, (now + ttl) .. ':' .. rest)
      keep_hash(key, ttl)
      out[i] = 1
    else
      out[i] = 0
    end
  else
    local cur = redis.call('GET', key)
    if cur and string.sub(cur, 1, 33) == me .. ':' then
      out[i] = redis.call('PEXPIRE', key, ttl)
    else
      out[i] = 0
    end
  end
end
return out
"#
    ))
});

/// KEYS: lock, queue, alive, fence, asks, shared (the lock alone with `none`, which reads no
/// other key: a plain key has no queue, and on Cluster it shares no slot with one). ARGV:
/// secret, whom to tell (`head`, `leave` or `none`). DEL only if ours, then:
/// * `head`: hand the lock on to the live head of the queue (`HAND_ON`: granted to a lock's
///   waiter, to a writer or to the readers behind a writer that released, "your turn" to a
///   Redlock arbiter's waiter), if any. A release nobody waits for publishes nothing; one
///   message to one waiter: a release wakes one connection, not every waiter's.
/// * `leave`: the same, once we left the queue (a Redlock holder the name's arbiter granted
///   stays at its head until then; see [`ACQUIRE`]).
/// * `none`: nothing (a Redlock node that is not the name's arbiter, which keeps no queue; or a
///   waiter that keeps its turn).
///
/// Returns 1 if released, 0 if it was not ours (never deletes another owner's lock).
pub static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
local cur = redis.call('GET', KEYS[1])
if not cur or string.sub(cur, 1, 33) ~= ARGV[1] .. ':' then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[2] == 'none' then
  return 1
end
{PURGE}{HAND_ON}
local leaving = nil
if ARGV[2] == 'leave' then
  leaving = ARGV[1]
end
hand_on(KEYS[1], KEYS[4], KEYS[2], KEYS[3], KEYS[5], leaving, KEYS[6])
return 1
"#
    ))
});
