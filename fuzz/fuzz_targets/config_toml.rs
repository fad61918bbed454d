//! `probe run --config FILE`: any text gives a Config or an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use probe_user::config::Config;

fuzz_target!(|text: &str| {
    if let Ok(c) = Config::from_toml(text) {
        // What validation promises the daemon (it divides by the tick, sizes maps with these).
        assert!(c.tick >= std::time::Duration::from_millis(10));
        assert!(c.top_peers >= 1);
        assert!((16..=4_194_304).contains(&c.maps.flows));
    }
});
