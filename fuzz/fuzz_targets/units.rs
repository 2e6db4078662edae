//! Durations, rates and sizes: the first 28 bytes are figures (a duration, a rate, a size) that
//! must format and parse back to themselves; the rest is text that parses or is refused without
//! a panic, and what parses formats back to the same value.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (figures, text) = data.split_at(data.len().min(28));
    tollgate_fuzz::check_units_values(figures);
    tollgate_fuzz::check_units_text(&String::from_utf8_lossy(text));
});
