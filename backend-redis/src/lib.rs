//! The Redis backend of distlock (efficiency grade).
//!
//! Not implemented yet: issue 4 tracks it. Until then this crate exports nothing, and the
//! conformance suite and the facade do not list Redis.
#![deny(missing_docs)]
