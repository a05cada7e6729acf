//! The C ABI: the committed headers (header.rs, headers.rs), the ABI record and its
//! version rule (abi.rs, abi_record.rs), the C and C++ programs, and PyTorch's entry
//! points.
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

#[path = "../common/mod.rs"]
mod common;

mod abi;
mod abi_record;
mod c_programs;
mod header;
mod headers;
mod torch_entry_points;
mod torch_sleep_and_wake;
