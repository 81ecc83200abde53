//! Integration tests of the server crate, one test binary: the HTTP listener's connection limits
//! on loopback ([`connections`]).

mod connections;
