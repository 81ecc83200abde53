//! Integration tests: the real `bulkhead-agent` binary on a Unix socket, driven over HTTP/1.1
//! the way the E2B SDKs drive envd.

mod auth;
mod files;
mod filesystem;
mod harness;
mod pid1;
mod process;
