//! Redis script replies: RESP bytes (parsed by redis-rs and by the store's own parser, which
//! must agree), reply trees and the documented shapes, decoded for every algorithm.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tollgate_fuzz::check_reply(data);
});
