//! `--web.config.file`: the exporter-toolkit YAML (TLS, client CA, basic-auth users, headers).
#![no_main]
use libfuzzer_sys::fuzz_target;
use probe_user::export::webconfig::WebConfig;

fuzz_target!(|text: &str| {
    // Relative certificate paths resolve against this (empty) directory: they fail to read,
    // which is an error like any other.
    let _ = WebConfig::parse(text, std::path::Path::new("/nonexistent-probe-fuzz"));
});
