//! X-Forwarded-For: the client address from a peer, trusted networks and header lines.
#![no_main]

libfuzzer_sys::fuzz_target!(|case: tollgate_fuzz::XffCase| {
    tollgate_fuzz::check_xff(&case);
});
