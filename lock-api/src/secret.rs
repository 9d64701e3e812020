//! Owner secrets: the proof of holding a lease that a backend writes with its entry.

use std::fmt;

use crate::error::{LockError, Result};

/// A random 128-bit secret that proves a lease is ours: whoever knows it can renew or release
/// the lock. Drawn from the OS RNG for every acquisition. `Debug` never prints it, and no log
/// line or error carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct OwnerSecret([u8; 16]);

impl OwnerSecret {
    /// A fresh secret from the operating system's RNG.
    ///
    /// # Errors
    /// A non-retryable backend error if the OS RNG fails (it does not on supported platforms).
    pub fn random() -> Result<Self> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).map_err(|e| LockError::backend("os-rng", false, e.to_string()))?;
        Ok(OwnerSecret(b))
    }

    /// The secret as 32 lowercase hex characters, for writing into the backend. Backends only.
    pub fn expose_hex(&self) -> String {
        self.expose_hex_bytes()
            .iter()
            .copied()
            .map(char::from)
            .collect()
    }

    /// [`OwnerSecret::expose_hex`] on the stack: for a backend that writes the secret straight
    /// into a request (every acquire and release), with no allocation. Always ASCII.
    pub fn expose_hex_bytes(&self) -> [u8; 32] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = HEX[usize::from(b >> 4)];
            out[2 * i + 1] = HEX[usize::from(b & 0x0f)];
        }
        out
    }
}

impl fmt::Debug for OwnerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OwnerSecret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_random_and_never_printed() {
        let a = OwnerSecret::random().unwrap();
        let b = OwnerSecret::random().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.expose_hex().len(), 32);
        let dbg = format!("{a:?}");
        assert!(!dbg.contains(&a.expose_hex()), "{dbg}");
    }

    #[test]
    fn hex_is_lowercase_and_keeps_byte_order() {
        let s = OwnerSecret([
            0x00, 0x01, 0xab, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0x9c,
        ]);
        assert_eq!(s.expose_hex(), "0001abff00000000000000000000109c");
        assert_eq!(s.expose_hex_bytes(), *b"0001abff00000000000000000000109c");
    }
}
