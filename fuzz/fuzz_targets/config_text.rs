//! Any bytes as `proxy.yaml`: a config or problems placed inside the text, never a panic or a
//! slow path (invalid UTF-8 is read lossily, as a file with a stray byte would be rejected
//! before this; the loader itself takes `&str`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = tollgate_fuzz::check_config(&text);
});
