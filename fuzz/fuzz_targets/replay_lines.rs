//! libFuzzer entry: see `kvb_fuzz::replay_lines`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvb_fuzz::replay_lines(data));
