//! libFuzzer entry: see `kvb_fuzz::tokenizer_json`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvb_fuzz::tokenizer_json(data));
