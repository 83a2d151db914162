#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cni_rs_fuzz::netconf(data));
