//! The one naming rule every backend follows.
//!
//! **Valid names**: any UTF-8 string of 1 to [`MAX_NAME_BYTES`] bytes with no control character
//! (so no NUL, no newline). Everything else (`/`, spaces, unicode) is allowed and behaves the same
//! on every backend. A bad name is rejected by [`LockName::new`] before any I/O, with a typed
//! error that quotes it.
//!
//! **Mapping to backend keys**: [`LockName::encoded`] turns a name into a string that is safe as
//! a Redis key part, an etcd key segment and a ZooKeeper node name: ASCII letters, digits and
//! `-_:@+=,` stay, every other byte becomes `%XX` (so `/` never splits a path, and `.` / `..`
//! cannot appear as a ZooKeeper node name). An encoding longer than [`MAX_ENCODED_LEN`] is
//! shortened to its first [`HASHED_PREFIX_LEN`] characters, `~`, and the hex SHA-256 of the
//! whole name; `~` is never produced by the escaping, so a hashed key cannot collide with a
//! plain one. Each backend then puts the encoded name under its own namespace prefix.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::error::{LockError, Result};

/// The longest valid lock name, in UTF-8 bytes.
pub const MAX_NAME_BYTES: usize = 1024;
/// The longest encoded key part before hashing kicks in.
pub const MAX_ENCODED_LEN: usize = 200;
/// How much of an over-long encoding is kept in front of its hash, for readability.
pub const HASHED_PREFIX_LEN: usize = 64;

/// A validated lock name and its backend-safe encoding.
///
/// Guarantees: the name obeys the module's rule, and two different names never share an
/// encoding (up to SHA-256 collisions for names whose encoding is over-long).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LockName {
    /// The name, then its encoding unless that is the name itself: one allocation per name (a
    /// process holding 100 000 leases keeps one per lease).
    text: Box<str>,
    /// Where the name ends in `text`.
    split: usize,
}

impl LockName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`LockError::InvalidName`] quoting the name when it is empty, longer than
    /// [`MAX_NAME_BYTES`], or contains a control character.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let reason = if name.is_empty() {
            Some("a lock name must not be empty")
        } else if name.len() > MAX_NAME_BYTES {
            Some("a lock name must be at most 1024 UTF-8 bytes")
        } else if name.chars().any(char::is_control) {
            Some("a lock name must not contain control characters (NUL, newline, ...)")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(LockError::InvalidName { name, reason });
        }
        let encoded = encode(&name);
        let split = name.len();
        let mut text = name;
        if text != encoded {
            text.push_str(&encoded);
        }
        Ok(LockName {
            text: text.into_boxed_str(),
            split,
        })
    }

    /// The name as the caller wrote it.
    pub fn as_str(&self) -> &str {
        &self.text[..self.split]
    }

    /// The backend-safe encoding described in the module docs.
    pub fn encoded(&self) -> &str {
        if self.split == self.text.len() {
            &self.text
        } else {
            &self.text[self.split..]
        }
    }
}

/// By name (the encoding follows from it).
impl PartialOrd for LockName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LockName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

fn keeps(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_:@+=,".contains(&b)
}

fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if keeps(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() <= MAX_ENCODED_LEN {
        return out;
    }
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    // The prefix is ASCII, so cutting at a byte index is a char boundary; but never cut a `%XX`.
    let mut cut = HASHED_PREFIX_LEN;
    while out.as_bytes()[cut - 1] == b'%' || out.as_bytes()[cut - 2] == b'%' {
        cut -= 1;
    }
    format!("{}~{hex}", &out[..cut])
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<&str> for LockName {
    type Error = LockError;
    fn try_from(value: &str) -> Result<Self> {
        LockName::new(value)
    }
}

impl TryFrom<String> for LockName {
    type Error = LockError;
    fn try_from(value: String) -> Result<Self> {
        LockName::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_names_and_quotes_them() {
        for (bad, rule) in [
            (String::new(), "empty"),
            ("a\0b".to_string(), "control"),
            ("line\nbreak".to_string(), "control"),
            ("x".repeat(MAX_NAME_BYTES + 1), "1024"),
        ] {
            let err = LockName::new(bad.clone()).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, LockError::InvalidName { ref name, .. } if *name == bad));
            assert!(msg.contains(rule), "{msg}");
            // Quoted, and cut past 120 characters.
            assert!(
                msg.contains(&crate::shown(&bad).to_string()),
                "message quotes the name: {msg}"
            );
        }
    }

    #[test]
    fn accepts_slashes_spaces_unicode_and_max_length() {
        for good in [
            "a/b",
            "with space",
            "péché/日本",
            "../..",
            &"y".repeat(MAX_NAME_BYTES),
        ] {
            let n = LockName::new(good).unwrap();
            assert_eq!(n.as_str(), good);
            assert!(n.encoded().len() <= MAX_ENCODED_LEN + 1 + 64);
            assert!(!n.encoded().contains('/'));
            assert!(!n.encoded().contains(' '));
            assert!(!n.encoded().contains('.'));
            assert!(n.encoded().is_ascii());
        }
    }

    #[test]
    fn a_name_that_needs_no_escaping_is_its_own_encoding() {
        let n = LockName::new("jobs-nightly_2").unwrap();
        assert_eq!(
            (n.as_str(), n.encoded()),
            ("jobs-nightly_2", "jobs-nightly_2")
        );
        let m = LockName::new("jobs/nightly").unwrap();
        assert_eq!(
            (m.as_str(), m.encoded()),
            ("jobs/nightly", "jobs%2Fnightly")
        );
        assert!(n < m && n != m, "ordered by name");
    }

    #[test]
    fn encoding_is_injective_on_tricky_pairs() {
        let pairs = [
            ("a/b", "a%2Fb"),
            ("a b", "a%20b"),
            ("%", "%25"),
            ("~", "%7E"),
        ];
        for (x, y) in pairs {
            assert_ne!(
                LockName::new(x).unwrap().encoded(),
                LockName::new(y).unwrap().encoded()
            );
        }
        let long_a = "é".repeat(300);
        let long_b = format!("{}è", "é".repeat(299));
        let (a, b) = (
            LockName::new(long_a).unwrap(),
            LockName::new(long_b).unwrap(),
        );
        assert_ne!(a.encoded(), b.encoded());
        assert!(a.encoded().contains('~'));
        assert!(a.encoded().len() <= HASHED_PREFIX_LEN + 1 + 64);
    }
}
