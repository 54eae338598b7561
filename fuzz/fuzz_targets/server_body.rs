//! libFuzzer entry: see `kvb_fuzz::server_body`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvb_fuzz::server_body(data));
