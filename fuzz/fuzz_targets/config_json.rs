//! libFuzzer entry: see `kvb_fuzz::config_json`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvb_fuzz::config_json(data));
