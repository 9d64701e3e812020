//! The etcd backend of distlock (correctness grade).
//!
//! Not implemented yet: issue 6 tracks it. Until then this crate exports nothing, and the
//! conformance suite and the facade do not list etcd.
#![deny(missing_docs)]
