//! The server-side scripts. Each runs atomically on the server, which is what makes "check the
//! owner, then act" safe: nothing can run between the check and the act.
//!
//! The lock value is `<secret>:<token><holder>`, and `<secret>:<token><holder>:<value>` once an
//! election's leader announced `value` ([`ANNOUNCE`]); the secret is always 32 hex characters, so
//! the owner check compares the first 33 bytes with `<secret>:`. `<holder>` is who holds it
//! (`~<since>,<pid>,<host>,<command>`, [`distlock_api::HolderInfo`]; no `:` in it), empty in a
//! value written by another client.
//!
//! One queue serves every policy ([`distlock_api::Admission`]): a queued member is the secret,
//! followed by `#<limit>` when its limit is not 1, so a waiter reads every limit ahead of it from
//! the queue itself. Each waiter's ask (`asks` hash, member -> `<ttl ms>:<holder>:<channel>`,
//! the TTL empty for a waiter that is only woken) names its client's turn channel, where a
//! message `t:<secret>` says "your turn" and `g<token>:<secret>` "granted" (`HAND_ON`). An
//! exclusive holder (a lock, a writer) is the lock key; shared holders (permits, readers) are the
//! fields of the name's `shared` hash, `<secret>` -> `<expiry ms>:<token>:<limit><holder>` by the
//! server's clock, the hash itself kept alive as long as its longest field ([`ADMIT`]).
//!
//! Waiters queue in arrival order (a sorted set scored by server time) with a liveness set
//! (scored by expiry, refreshed at every re-check): a release tells the live head on its client's
//! channel, and a free lock promised to a live head is refused to everyone else. A waiter that
//! crashed stops refreshing and is dropped within the waiter TTL; one that gives up leaves at
//! once ([`LEAVE`]). Both sets carry that TTL, so a name nobody waits on leaves no key behind.

use std::ops::Deref;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{
    Arg, Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, Script, ServerErrorKind,
    ToRedisArgs,
};

/// A script and its source: the source is what a call resends as `EVAL` when a server does not
/// know the script.
pub struct Lua {
    script: Script,
    source: String,
}

impl Lua {
    fn new(source: String) -> Self {
        Lua {
            script: Script::new(&source),
            source,
        }
    }
}

impl Deref for Lua {
    type Target = Script;

    fn deref(&self) -> &Script {
        &self.script
    }
}

/// One call of a script, written straight into one command (`EVALSHA <sha> <number of keys>`,
/// then the keys, then the arguments, in that order). `Script::key` / `arg` first copy every key
/// and argument into a buffer of its own: ~15 allocations per acquire + release pair, which
/// measured ~10 % of the client's instructions.
pub(crate) struct Call {
    lua: &'static Lua,
    cmd: Cmd,
}

impl Call {
    pub(crate) fn new(lua: &'static Lua, keys: usize) -> Self {
        // Room for our longest single-name call (acquire: 4 keys of a ~100-byte name, 5
        // arguments) at once, rather than growing the buffers six or seven times per call.
        let mut cmd = Cmd::with_capacity(3 + 9, 640);
        cmd.arg("EVALSHA").arg(lua.get_hash()).arg(keys);
        Call { lua, cmd }
    }

    /// Appends a key (while fewer than the declared number were written) or an argument.
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// The same call sent with the script's source (`EVAL`), in one send whatever the server's
    /// script cache holds: for a clean-up whose answer nobody may wait for (its caller gone, or
    /// a server that hangs and answers `NOSCRIPT` only later, when no resend would follow). It
    /// still runs whenever the server gets to it, in order behind the request it cleans up.
    pub(crate) fn with_source(mut self) -> Self {
        self.cmd = self.eval();
        self
    }

    /// Sends the call, each send cut off at `per_send` on its own. A server that does not know
    /// the script yet (restarted, failed over, flushed, a new Cluster node) answers `NOSCRIPT`;
    /// the call is then sent again as `EVAL` with the source, which also caches the script on
    /// that server. `SCRIPT LOAD` is not used: on a Cluster connection it goes to every node and
    /// waits for all, so one hung node would fail calls meant for healthy ones.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
        per_send: Duration,
    ) -> RedisResult<T> {
        match timed(per_send, self.cmd.query_async(conn)).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                timed(per_send, self.eval().query_async(conn)).await
            }
            answer => answer,
        }
    }

    /// The same call as `EVAL <source> ...` (unchanged if it is one already).
    fn eval(&self) -> Cmd {
        if self
            .cmd
            .args_iter()
            .next()
            .is_some_and(|a| matches!(a, Arg::Simple(b"EVAL")))
        {
            return self.cmd.clone();
        }
        let mut eval = Cmd::with_capacity(3 + 9, 640 + self.lua.source.len());
        eval.arg("EVAL").arg(&self.lua.source);
        for arg in self.cmd.args_iter().skip(2) {
            if let Arg::Simple(bytes) = arg {
                eval.arg(bytes);
            }
        }
        eval
    }
}

/// `send`, or a timeout error (retryable, like a dropped connection) after `limit`.
async fn timed<T>(limit: Duration, send: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
    tokio::time::timeout(limit, send).await.unwrap_or_else(|_| {
        Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {limit:?}"),
        )))
    })
}

/// Lua helpers shared by the scripts that read the queue head: `purge` drops the waiters whose
/// liveness ran out (from both sets, and their asks when given) and says how many; `tell`
/// publishes "your turn" to a waiter on its client's channel (a waiter with no ask, queued by
/// an older client, hears nothing and finds its turn at its next re-check); `clock` is the
/// server's time in ms and µs;
/// `distlock_value` says whether a lock value has our layout (`<32 hex>:<token>...`), not another
/// recipe's (redis-py's `Lock` on our key, say).
const PURGE: &str = r#"
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
const HAND_ON: &str = r#"
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
/// On a name's Redlock arbiter (`arbiter` = 1, always waiting) no counter is kept (token 0:
/// Redlock hands out none) and a granted waiter joins or keeps the head of the queue instead of
/// leaving it, until its release leaves it ([`RELEASE`] with `leave`): the arbiter alone does
/// not make a Redlock grant, and a waiter the other nodes then refuse keeps its turn. Its place
/// lives no longer than the lock it was granted, so a holder that crashed holds up the queue
/// only until its lock expires.
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
    if redis.call('ZADD', queue, 'NX', arrival, me) == 1 then
      local asked = ttl
      if arbiter then
        asked = ''
      end
      redis.call('HSET', asks, me, asked .. ':' .. ARGV[6] .. ':' .. ARGV[7])
    end
    redis.call('ZADD', alive, now + live, me)
    redis.call('PEXPIRE', queue, wttl)
    redis.call('PEXPIRE', alive, wttl)
    redis.call('PEXPIRE', asks, wttl)
  end
end
if cur then
  join(wttl)
  return {{0, redis.call('PTTL', lock)}}
end
if head and head ~= me then
  join(wttl)
  if purged > 0 then
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
  redis.call('ZREM', queue, me)
  redis.call('ZREM', alive, me)
  redis.call('HDEL', asks, me)
end
return {{1, token}}
"#
    ))
});

/// KEYS: queue, alive, lock, fence, asks. ARGV: queue member (the secret, with `#<limit>` for a
/// permit or a reader, as [`ADMIT`] queued it).
/// A waiter that gives up (timeout, error, cancellation) leaves the queue. If a release handed
/// it the lock meanwhile (`HAND_ON`: the grant may be in flight to it, or never read), it lets
/// go of it. If the lock is then free, it goes on to the new head at once instead of at its next
/// re-check.
pub static LEAVE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"{PURGE}{HAND_ON}
local queue, alive, lock, fence, asks = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
redis.call('ZREM', queue, ARGV[1])
redis.call('ZREM', alive, ARGV[1])
redis.call('HDEL', asks, ARGV[1])
local cur = redis.call('GET', lock)
if cur and string.sub(cur, 1, 33) == string.sub(ARGV[1], 1, 32) .. ':' then
  redis.call('DEL', lock)
  cur = false
end
if not cur then
  hand_on(lock, fence, queue, alive, asks, nil)
end
return 1
"#
    ))
});

/// KEYS: lock, alive, shared. Reads only: `{token or false, pttl, live waiters, shared,
/// holder}` (the waiters whose liveness deadline is still ahead, by the server's clock; not the
/// holder, which a Redlock arbiter keeps at the head of its queue), `shared` the live shared
/// holders (permits, readers) as `token, ms left, limit, holder` quadruples, and `holder` the
/// lock key's holder segment (empty when none); pttl -4 when the lock key holds a value
/// distlock does not write (another recipe's lock). The secret never leaves the server.
pub static INSPECT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"{PURGE}
local now = now_ms()
local cur = redis.call('GET', KEYS[1])
local token, who = false, ''
local live = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
if cur then
  if not distlock_value(cur) then
    return {{false, -4, 0, {{}}, ''}}
  end
  token = string.match(cur, '^%x+:(%d+)') or false
  who = string.match(cur, '^%x+:%d+(~[^:]*)') or ''
  local mine = redis.call('ZSCORE', KEYS[2], string.match(cur, '^(%x+):'))
  if mine and tonumber(mine) > now then
    live = live - 1
  end
end
local shared = {{}}
local held = redis.call('HGETALL', KEYS[3])
for i = 1, #held, 2 do
  local exp, tok, lim, w = string.match(held[i + 1], '^(%d+):(%d+):(%d+)(.*)$')
  if exp and tonumber(exp) > now then
    shared[#shared + 1] = tonumber(tok)
    shared[#shared + 1] = tonumber(exp) - now
    shared[#shared + 1] = tonumber(lim)
    shared[#shared + 1] = w
  end
end
return {{token, redis.call('PTTL', KEYS[1]), live, shared, who}}
"#
    ))
});

/// KEYS: lock. ARGV: secret, token, value, leader channel, holder segment. Writes
/// `<secret>:<token><holder>:<value>` into the lock, keeping its TTL, if it is still ours with
/// that token (announced before or not), then tells observers on the leader channel. Returns 1,
/// or 0 (not ours: nothing written). The value lives in the lock key itself so it expires and is
/// deleted with it.
pub static ANNOUNCE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ':' .. ARGV[2]
local after = cur and string.sub(cur, #mine + 1, #mine + 1)
if not cur or string.sub(cur, 1, #mine) ~= mine or (after ~= '' and after ~= ':' and after ~= '~') then
  return 0
end
redis.call('SET', KEYS[1], mine .. ARGV[5] .. ':' .. ARGV[3], 'KEEPTTL')
redis.call('PUBLISH', ARGV[4], '1')
return 1
"#
        .to_string(),
    )
});

/// KEYS: a plain lock key ([`crate::RedisLayout::Plain`]). Reads only: `{value or false, pttl}`,
/// in one step (two separate reads could pair one holder's value with the next one's TTL).
pub static PEEK: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
"#
        .to_string(),
    )
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

/// KEYS: lock, fence, queue, alive, shared, asks. ARGV: secret, ttl ms, waiting (0/1), waiter
/// ttl ms, limit, policy (`x` exclusive: the holder is the lock key; `p` a permit and `s` a
/// reader: a field of the shared hash), holder segment, the client's turn channel. The queue for every policy
/// but a plain lock's ([`ACQUIRE`], which keeps its three-command fast path; a lock's name never
/// has shared holders). In order:
/// * ours already (a retry after a lost reply): refresh, return `{1, token}`;
/// * the lock key held under a value distlock does not write: return `{-4, 0}` (as [`ACQUIRE`]);
/// * the limits ahead of us: the lock key's holder (1), each live shared holder (expired fields
///   are dropped), each live waiter queued before us;
/// * a permit seeing another limit ahead leaves the queue and returns `{-2, their limit}`;
/// * admitted (fewer ahead than the smallest limit among them and us): INCR the counter, take
///   the lock key or a shared field, leave the queue, and tell the new head if it is admitted
///   now too (readers behind a writer are woken one by one, each by the one before); return
///   `{1, token}`;
/// * else a waiter joins (first join only, with an ask that has no TTL: it is only woken) and
///   refreshes its liveness; return `{0, bound}`, the
///   time until the first holder's expiry (the next re-check), or -3.
pub static ADMIT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"{PURGE}
local lock, fence, queue, alive, shared, asks = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local me, ttl, waiting, wttl = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1', tonumber(ARGV[4])
local limit, policy = tonumber(ARGV[5]), ARGV[6]
local member = me
if limit ~= 1 then
  member = me .. '#' .. limit
end
local function limit_of(m)
  return tonumber(string.match(m, '#(%d+)$')) or 1
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
      redis.call('ZREM', queue, member)
      redis.call('ZREM', alive, member)
      redis.call('HDEL', asks, member)
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
  redis.call('ZREM', queue, member)
  redis.call('ZREM', alive, member)
  redis.call('HDEL', asks, member)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head then
    local small = math.min(limit, limit_of(head))
    for _, l in ipairs(holders) do
      small = math.min(small, l)
    end
    if #holders + 1 < small then
      tell(asks, head)
    end
  end
  return {{1, token}}
end
if waiting then
  if redis.call('ZADD', queue, 'NX', arrival, member) == 1 then
    redis.call('HSET', asks, member, ':' .. ARGV[7] .. ':' .. ARGV[8])
  end
  redis.call('ZADD', alive, now + wttl, member)
  redis.call('PEXPIRE', queue, wttl)
  redis.call('PEXPIRE', alive, wttl)
  redis.call('PEXPIRE', asks, wttl)
end
return {{0, bound}}
"#
    ))
});

/// KEYS: shared, queue, alive, asks. ARGV: secret. Removes our shared field
/// (a permit's or a reader's), then tells the queue's live head. Returns 1 if it was ours and
/// live, 0 otherwise (an expired field of ours is removed all the same).
pub static RELEASE_SHARED: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"{PURGE}
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
local now = now_ms()
if redis.call('EXISTS', KEYS[2]) == 1 then
  purge(KEYS[2], KEYS[3], now, KEYS[4])
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then
    tell(KEYS[4], head)
  end
end
if tonumber(string.match(cur, '^(%d+):')) <= now then
  return 0
end
return 1
"#
    ))
});

/// KEYS: lock, queue, alive, fence, asks (the lock alone with `none`, which reads no other key:
/// a plain key has no queue, and on Cluster it shares no slot with one). ARGV: secret, whom to
/// tell (`head`, `leave` or `none`). DEL only if ours, then:
/// * `head`: hand the lock on to the live head of the queue (`HAND_ON`: granted to a lock's
///   waiter, "your turn" to another), if any. A release nobody waits for publishes nothing; one
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
hand_on(KEYS[1], KEYS[4], KEYS[2], KEYS[3], KEYS[5], leaving)
return 1
"#
    ))
});
