//! Every toolgate.v1 request message decoded from the bytes and converted as its handler does.
//! The checks are in `toolgate::fuzzing::request_conversion`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| toolgate::fuzzing::request_conversion(data));
