//! `--tick`, `--burst-gap`, `[rdma] interval`...: durations from flags and the config file.
#![no_main]
use libfuzzer_sys::fuzz_target;
use probe_user::duration::parse_duration;

fuzz_target!(|text: &str| {
    if let Ok(d) = parse_duration(text) {
        assert!(!d.is_zero(), "{text:?} parsed to zero");
        // What is accepted prints back to the same duration (the daemon logs it that way).
        let shown = humantime::format_duration(d).to_string();
        assert_eq!(parse_duration(&shown), Ok(d), "{text:?} -> {shown:?}");
    }
});
