//! The scripts that read a name's holders, and the leader's announcement of its value.

use std::sync::LazyLock;

use super::Lua;
use super::helpers::PURGE;

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
