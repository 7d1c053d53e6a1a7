//! Test support shared by the two integration-test binaries (`tests/it`, `tests/chaos`),
//! included by path from each: one copy of the HTTP request reader and of the cleanup code.

#![allow(dead_code)] // each test binary uses a different part of this module

pub mod cleanup;
pub mod http_request;
