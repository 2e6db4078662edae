//! Request-path normalisation and every `paths` setting on any text, with and without a
//! leading `/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|path: &str| {
    tollgate_fuzz::check_path(path);
    tollgate_fuzz::check_path(&format!("/{path}"));
    tollgate_fuzz::check_path_policy(path);
    tollgate_fuzz::check_path_policy(&format!("/{path}"));
});
