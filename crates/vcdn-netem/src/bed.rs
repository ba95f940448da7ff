//! What the two namespace test beds ([`crate::testbed`], [`crate::lan`])
//! have in common, so that a harness starting programs in nodes (the vcdn
//! tests' `start_in`) works with either.

use std::ffi::OsStr;
use std::io;
use std::net::Ipv4Addr;
use std::process::Command;

/// A test bed of nodes, each a network namespace.
pub trait Bed {
    /// A command that runs `program` inside `node` (its namespace and,
    /// where the bed limits it, its CPU).
    fn command(&self, node: &str, program: &OsStr) -> io::Result<Command>;
    /// `node`'s address, reachable from every other node.
    fn addr(&self, node: &str) -> io::Result<Ipv4Addr>;
}

impl Bed for crate::testbed::Testbed {
    fn command(&self, node: &str, program: &OsStr) -> io::Result<Command> {
        crate::testbed::Testbed::command(self, node, program)
    }
    fn addr(&self, node: &str) -> io::Result<Ipv4Addr> {
        crate::testbed::Testbed::addr(self, node)
    }
}

impl Bed for crate::lan::Lan {
    fn command(&self, node: &str, program: &OsStr) -> io::Result<Command> {
        crate::lan::Lan::command(self, node, program)
    }
    fn addr(&self, node: &str) -> io::Result<Ipv4Addr> {
        crate::lan::Lan::addr(self, node)
    }
}
