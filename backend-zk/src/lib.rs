//! The ZooKeeper backend of distlock (correctness grade).
//!
//! Not implemented yet: issue 7 tracks it. Until then this crate exports nothing, and the
//! conformance suite and the facade do not list ZooKeeper.
#![deny(missing_docs)]
