//! A valid `proxy.yaml` skeleton with fuzzed values in its slots: valid values load, one bad
//! value is reported on its own line, anything else is handled like any text.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tollgate_fuzz::check_config_skeleton(data);
});
