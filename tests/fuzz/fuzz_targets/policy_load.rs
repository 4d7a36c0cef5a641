//! The policy loader on arbitrary text.
//! The checks are in `toolgate::fuzzing::policy_load`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| toolgate::fuzzing::policy_load(data));
