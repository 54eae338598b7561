//! libFuzzer entry: see `kvb_fuzz::gguf`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvb_fuzz::gguf(data));
