//! Canonical JSON: parse, print, reparse, reprint (SPEC §1).
//! The checks are in `toolgate::fuzzing::canonical_round_trip`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| toolgate::fuzzing::canonical_round_trip(data));
