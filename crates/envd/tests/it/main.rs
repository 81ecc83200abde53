//! Integration tests of the envd wire types, one test binary: the exact proto3 JSON of the
//! messages ([`wire_json`]).

mod wire_json;
