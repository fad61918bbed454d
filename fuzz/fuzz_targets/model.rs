//! A model directory (`--model`, SIGHUP reload): LightGBM text models and the manifest. The
//! input is `manifest.json`, a line `=====`, then the text every listed model file reads as.
#![no_main]
use libfuzzer_sys::fuzz_target;
use probe_user::model::{bundle::Bundle, lgbm::Booster};

fuzz_target!(|text: &str| {
    let (manifest, model) = text.split_once("\n=====\n").unwrap_or(("", text));
    if let Ok(b) = Booster::parse(model) {
        // Scoring must take any feature vector: missing (NaN), infinite, huge.
        let n = b.num_features();
        for fill in [0.0, f64::NAN, f64::INFINITY, -1e308] {
            let _ = b.predict(&vec![fill; n]);
        }
        // Too few features: documented as NaN, not a panic or a read past the slice.
        if n > 0 {
            assert!(b.predict(&[]).is_nan());
        }
    }
    if !manifest.is_empty() {
        let _ = Bundle::from_parts("fuzz", manifest, |_| Ok(model.to_owned()));
    }
});
