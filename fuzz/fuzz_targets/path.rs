//! Request-path normalisation on any text, with and without a leading `/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|path: &str| {
    tollgate_fuzz::check_path(path);
    tollgate_fuzz::check_path(&format!("/{path}"));
});
