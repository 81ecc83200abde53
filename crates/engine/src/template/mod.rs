//! Templates: the registry of what sandboxes start from (`registry`), custom builds through the
//! E2B Template API (`builds` the verbs, `builder` the execution, `spec` what a build is made of,
//! `image` its starting point, `exec` the build sandbox's agent, `types` their data) and the
//! limits builds run under (`admission`).

pub(crate) mod admission;
pub(crate) mod builder;
pub mod builds;
pub(crate) mod exec;
pub(crate) mod image;
pub(crate) mod names;
pub(crate) mod registry;
pub mod spec;
pub(crate) mod start;
pub(crate) mod types;
