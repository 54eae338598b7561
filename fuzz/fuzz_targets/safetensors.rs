//! libFuzzer entry: see `kvb_fuzz::safetensors`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvb_fuzz::safetensors(data));
