//! The server-side scripts. Each runs atomically on the server, which is what makes "check the
//! owner, then act" safe: nothing can run between the check and the act.
//!
//! The lock value is `<secret>:<token>`; the secret is always 32 hex characters, so the owner
//! check compares the first 33 bytes with `<secret>:`.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: lock, fence. ARGV: secret, ttl ms.
/// Free: INCR the bucket counter, SET the lock with PX, return `{1, token}`.
/// Already ours (a retry after a lost reply): refresh the TTL, return `{1, token}`.
/// Held by another: return `{0, pttl}` (the waiter's next re-check bound).
pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local cur = redis.call('GET', KEYS[1])
if not cur then
  local token = redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], ARGV[1] .. ':' .. token, 'PX', ARGV[2])
  return {1, token}
end
if string.sub(cur, 1, 33) == ARGV[1] .. ':' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(string.sub(cur, 34))}
end
return {0, redis.call('PTTL', KEYS[1])}
"#,
    )
});

/// KEYS: lock 1..n. ARGV: secret 1, ttl ms 1, ..., secret n, ttl ms n.
/// PEXPIREs each lock that is still ours; never creates a key. Returns one 1 (renewed) or 0 (not
/// ours: expired, taken or released) per key. One call renews every lease a watchdog tick finds
/// due (all in one hash slot on Cluster), so renewal traffic does not grow with the lease count.
pub static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local out = {}
for i, key in ipairs(KEYS) do
  local cur = redis.call('GET', key)
  if cur and string.sub(cur, 1, 33) == ARGV[2 * i - 1] .. ':' then
    out[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    out[i] = 0
  end
end
return out
"#,
    )
});

/// KEYS: lock. ARGV: secret, channel. DEL only if ours, then PUBLISH so waiters retry at once.
/// Returns 1 if released, 0 if it was not ours (never deletes another owner's lock).
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, 33) == ARGV[1] .. ':' then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
"#,
    )
});
