//! Integration tests: the real `bulkhead-agent` binary on a Unix socket, driven over HTTP/1.1
//! the way the E2B SDKs drive envd.

mod auth;
mod bad_input;
mod files;
mod filesystem;
mod harness;
mod interpreter;
mod pid1;
mod process;
