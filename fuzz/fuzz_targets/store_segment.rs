//! libFuzzer entry: see `kvb_fuzz::store_segment`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvb_fuzz::store_segment(data));
