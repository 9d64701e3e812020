//! The Redis key layout: the one place that decides where a lock lives.
//!
//! For a lock name `n` (encoded by the shared naming rule, [`distlock_api::LockName::encoded`])
//! under prefix `p`:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{p:B}:lock:<encoded n>` | string, with PX | `<owner secret hex>:<fencing token>` while held; `...:<value>` appended once an election's leader announced `value` |
//! | `{p:B}:fence` | integer, no TTL | the last fencing token handed out in bucket `B` |
//! | `{p:B}:released:<encoded n>` | pub/sub channel | on Redlock nodes, a message at every release (Redlock waiters listen there; they do not queue) |
//! | `{p:grants:<client id>}` | pub/sub channel | one client's queued waiters: `t:<owner secret hex>` "your turn", `g<token>:<owner secret hex>` a grant a release made to the waiter (the lock key or a shared field) |
//! | `{p:B}:leader:<encoded n>` | pub/sub channel | a message at every announcement of an election's leader (observers listen there) |
//! | `{p:B}:queue:<encoded n>` | sorted set, with PX | waiting owners by arrival (server time, µs) |
//! | `{p:B}:alive:<encoded n>` | sorted set, with PX | waiting owners by liveness deadline (ms) |
//! | `{p:B}:asks:<encoded n>` | hash, with PX | waiting owners (queue members) -> `<ttl ms>:<holder>:<client channel>` (a lock's), `:<policy><ttl ms><holder>:<client channel>` (a permit's `p`, reader's `s`, writer's `x`): where to tell each, and what a release needs to grant it on its behalf (a Redlock arbiter's, `:<holder>:<channel>`: only told) |
//! | `{p:B}:shared:<encoded n>` | hash, with PX | a semaphore's permit holders or a read-write lock's readers: owner secret -> `<expiry ms>:<fencing token>:<limit>` |
//!
//! `B` is a bucket, `fnv1a64(encoded n) % 1024`, inside the hash tag. Why buckets: the fencing
//! counter must live in the same hash slot as the lock key (one script touches both, also on
//! Redis Cluster), and a counter per *name* would leak one key per name forever (Redisson's
//! `RFencedLock` left millions behind). With buckets there are at most 1 024 counter keys per
//! prefix, ever; a name's tokens still strictly increase, because its bucket's counter does.
//! The bucket function is part of the on-server format and must never change.

use std::fmt;
use std::io::Write;

use distlock_api::LockName;
use redis::{RedisWrite, ToRedisArgs};

/// How many fencing buckets (and so counter keys) a prefix has.
pub const BUCKETS: u64 = 1024;

/// The keys of one lock name. Only the lock key is a `String` (it is the grant's resource); the
/// others are read off it and written straight into a command ([`Key`]), because building six
/// strings twice per acquire + release pair measured ~10 % of the client's instructions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    /// The lock key, `{p:B}:lock:<encoded n>`.
    pub lock: String,
    /// The length of its hash tag part, `{p:B}:`.
    tag: usize,
    /// A [`plain_keys`] key: the lock key alone, none of the others.
    plain: bool,
}

impl LockKeys {
    fn key(&self, kind: &'static str, named: bool) -> Key<'_> {
        let (tag, rest) = self.lock.split_at(self.tag);
        Key {
            tag,
            kind,
            // A plain key has no other keys: it never reaches here, and must not panic if it did.
            name: if named {
                rest.get(LOCK.len()..).unwrap_or("")
            } else {
                ""
            },
        }
    }

    /// The bucket's fencing counter.
    pub fn fence(&self) -> Key<'_> {
        self.key("fence", false)
    }

    /// The release notification channel.
    pub fn channel(&self) -> Key<'_> {
        self.key("released:", true)
    }

    /// The leader announcement channel (elections).
    pub fn leader(&self) -> Key<'_> {
        self.key("leader:", true)
    }

    /// The waiters' queue (arrival order).
    pub fn queue(&self) -> Key<'_> {
        self.key("queue:", true)
    }

    /// The waiters' liveness deadlines.
    pub fn alive(&self) -> Key<'_> {
        self.key("alive:", true)
    }

    /// What each waiter asks for (TTL, holder, policy), read by the release that grants it.
    pub fn asks(&self) -> Key<'_> {
        self.key("asks:", true)
    }

    /// The shared holders (permits, readers).
    pub fn shared(&self) -> Key<'_> {
        self.key("shared:", true)
    }

    /// Whether `resource` is the shared hash's key (a permit's or a reader's grant), compared
    /// piece by piece: every release asks, and a lock's must not build a string for it.
    pub fn is_shared(&self, resource: &str) -> bool {
        if self.plain {
            return false;
        }
        let k = self.shared();
        resource
            .strip_prefix(k.tag)
            .and_then(|r| r.strip_prefix(k.kind))
            == Some(k.name)
    }

    /// Whether this is the plain layout's one key ([`plain_keys`]).
    pub fn is_plain(&self) -> bool {
        self.plain
    }
}

/// The turn channel of one client (`id`: random, 32 hex digits) under `prefix`. It starts with
/// `{p:` as every key and channel of the prefix does (one ACL pattern covers them all). Its tag
/// is its own, not a bucket's: a client's waiters wait on names of every slot (pub/sub reaches
/// every Cluster node), and clients' channels spread over the nodes, so one node lost leaves
/// the others' waiters told.
pub fn grants_channel(prefix: &str, id: u128) -> String {
    format!("{{{prefix}:grants:{id:032x}}}")
}

/// The part of the lock key between the tag and the name.
const LOCK: &str = "lock:";

/// One key of a name (tag, kind, encoded name): a command argument written in place, with no
/// `String` of its own; `to_string()` gives the key text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key<'a> {
    tag: &'a str,
    kind: &'static str,
    name: &'a str,
}

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.tag, self.kind, self.name)
    }
}

impl ToRedisArgs for Key<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // Writes into the command's own buffer: they cannot fail.
        for part in [self.tag, self.kind, self.name] {
            let _ = arg.write_all(part.as_bytes());
        }
    }
}

/// FNV-1a, 64 bits: small, stable across versions and platforms.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key
/// when it has none, modulo 16 384. Renewals are batched per slot with it.
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|b| *b == b'}')
            .filter(|close| *close > 0)
            .map(|close| &rest[..close])
    });
    let mut crc: u16 = 0;
    for b in tagged.unwrap_or(bytes) {
        crc ^= u16::from(*b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

/// The keys of `name` under `prefix`.
pub fn lock_keys(prefix: &str, name: &LockName) -> LockKeys {
    let encoded = name.encoded();
    let bucket = fnv1a64(encoded.as_bytes()) % BUCKETS;
    let mut lock = String::with_capacity(prefix.len() + 12 + LOCK.len() + encoded.len());
    // Writing into a String cannot fail.
    let _ = fmt::Write::write_fmt(&mut lock, format_args!("{{{prefix}:{bucket}}}:"));
    let tag = lock.len();
    lock.push_str(LOCK);
    lock.push_str(encoded);
    LockKeys {
        lock,
        tag,
        plain: false,
    }
}

/// The key of `name` in the plain layout ([`crate::RedisLayout::Plain`]): `<prefix><name>`,
/// verbatim (not encoded: the other languages' clients use the name as it is), and no other
/// key. On Redis Cluster it lives in the slot of the whole key, as theirs does.
pub fn plain_keys(prefix: &str, name: &LockName) -> LockKeys {
    LockKeys {
        lock: format!("{prefix}{}", name.as_str()),
        tag: 0,
        plain: true,
    }
}

/// Whether a plain key would read as distlock's shared-holders hash (`{...}:shared:...`): the
/// renewal script tells a lock from a hash by that shape, so such a key is refused.
pub fn looks_shared(key: &str) -> bool {
    let mut depth = 0usize;
    for (i, c) in key.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return key[i + 1..].starts_with(":shared:");
                }
            }
            _ if i == 0 => return false,
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag_and_the_bucket_is_stable() {
        let k = lock_keys("distlock", &LockName::new("orders/42").expect("valid"));
        // Pinned: the bucket function and the layout are part of the on-server format.
        assert_eq!(k.lock, "{distlock:833}:lock:orders%2F42");
        let texts = [
            k.fence(),
            k.channel(),
            k.queue(),
            k.alive(),
            k.asks(),
            k.leader(),
            k.shared(),
        ]
        .map(|k| k.to_string());
        assert_eq!(
            texts,
            [
                "{distlock:833}:fence",
                "{distlock:833}:released:orders%2F42",
                "{distlock:833}:queue:orders%2F42",
                "{distlock:833}:alive:orders%2F42",
                "{distlock:833}:asks:orders%2F42",
                "{distlock:833}:leader:orders%2F42",
                "{distlock:833}:shared:orders%2F42",
            ]
        );
        assert!(k.is_shared("{distlock:833}:shared:orders%2F42"));
        assert!(!k.is_shared(&k.lock));
        assert!(!k.is_shared("{distlock:833}:shared:orders%2F4"));
        // Written into a command, a key is the same one argument.
        for key in [k.fence(), k.queue(), k.asks()] {
            assert_eq!(key.to_redis_args(), vec![key.to_string().into_bytes()]);
        }
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    }

    #[test]
    fn plain_keys_are_the_name_under_the_prefix() {
        let name = LockName::new("orders/42").expect("valid");
        let k = plain_keys("", &name);
        assert_eq!(k.lock, "orders/42");
        assert!(k.is_plain() && !k.is_shared("orders/42"));
        assert_eq!(plain_keys("lock:", &name).lock, "lock:orders/42");
        // Short names do not reach into a layout they do not have.
        assert_eq!(
            plain_keys("", &LockName::new("a").expect("valid"))
                .queue()
                .to_string(),
            "queue:"
        );
        assert!(looks_shared("{a}:shared:b") && looks_shared("{a{b}}:shared:"));
        assert!(
            !looks_shared("a{b}:shared:") && !looks_shared("{a}:lock:b") && !looks_shared("{a")
        );
    }

    #[test]
    fn slots_match_redis_cluster() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{foo}:lock:x"), 12182);
        assert_eq!(slot("{}foo"), slot("{}foo"));
        assert_eq!(slot("123456789"), 0x31c3); // the CRC-16/XMODEM check value
    }
}
