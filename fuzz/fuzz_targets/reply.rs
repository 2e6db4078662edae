//! Redis script replies: RESP bytes, reply trees and the documented shapes, decoded for every
//! algorithm.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tollgate_fuzz::check_reply(data);
});
