//! Test-row generator mirroring `gen_fixtures.py` bit for bit (splitmix64, integer ops
//! and single correctly rounded IEEE multiplications / divisions only), plus fixture
//! loading helpers. `fixtures/rows.digest` proves both sides produced the same rows.
#![allow(dead_code)]

use std::path::PathBuf;

pub const N_FEAT: usize = 60;
pub const N_TEST: usize = 2000;
pub const N_EDGE: usize = 500;
pub const N_CAT_FEAT: usize = 12;
pub const N_CAT_ODD: usize = 400;
/// Fixtures on the 60-feature schema, in the order gen_fixtures.py collects thresholds.
pub const NUMERIC_MODELS: [&str; 7] = [
    "a_binary",
    "b_regression",
    "c_zero_as_missing",
    "d_single_leaf",
    "f_rf",
    "g_regression_sqrt",
    "h_poisson",
];

const K_ZERO: f64 = 1e-35_f32 as f64;
const CONSTS: [f64; 5] = [0.0, 1.0, 1e9, 1e-6, 42.0];

fn pow10(k: usize) -> f64 {
    const P: [f64; 23] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
        1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
    ];
    P[k]
}

pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn dec(mant: u64, exp10: i64) -> f64 {
    if exp10 >= 0 {
        mant as f64 * pow10(exp10 as usize)
    } else {
        mant as f64 / pow10((-exp10) as usize)
    }
}

fn magnitude(u: u64, lo: i64, hi: i64) -> f64 {
    let e = lo + (u % (hi - lo) as u64) as i64;
    let mant = 100 + (u >> 8) % 900;
    dec(mant, e - 2)
}

fn gen_row(rng: &mut SplitMix64) -> Vec<f64> {
    let mut r = vec![0.0; N_FEAT];
    for (j, slot) in r.iter_mut().enumerate() {
        let u = rng.next();
        let ji = j as i64;
        *slot = if j < 30 {
            let lo = -6 + ji % 10;
            let hi = 9.min(lo + 3 + ji % 7);
            if j < 10 && (u >> 40).is_multiple_of(10) {
                f64::NAN
            } else {
                magnitude(u, lo, hi)
            }
        } else if j < 40 {
            let v = if (u >> 40) % 10 < 3 {
                0.0
            } else {
                ((u >> 8) % 10u64.pow(1 + (u % 9) as u32)) as f64
            };
            if j < 33 && (u >> 50).is_multiple_of(10) {
                f64::NAN
            } else {
                v
            }
        } else if j < 45 {
            if (u >> 40) % 100 < 15 {
                0.0
            } else {
                let v = magnitude(u, -8, 1);
                if (u >> 60) & 1 == 1 {
                    -v
                } else {
                    v
                }
            }
        } else if j < 50 {
            ((u >> 8) % 1001) as f64 / 1000.0
        } else if j < 55 {
            CONSTS[j - 50]
        } else if j < 59 {
            if (u >> 40) % 10 < 8 {
                f64::NAN
            } else {
                magnitude(u, -3, 6)
            }
        } else {
            f64::NAN
        };
    }
    r
}

pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lgbm")
}

pub fn read_fixture(name: &str) -> String {
    let p = fixture_dir().join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// (feature, threshold) of every numerical split, in file order (as gen_fixtures.py).
fn numerical_thresholds(text: &str) -> Vec<(usize, f64)> {
    let mut out = Vec::new();
    let (mut feats, mut thr) = (Vec::new(), Vec::new());
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("split_feature=") {
            feats = v.split_whitespace().map(|t| t.parse().unwrap()).collect();
        } else if let Some(v) = line.strip_prefix("threshold=") {
            thr = v.split_whitespace().map(|t| t.parse().unwrap()).collect();
        } else if let Some(v) = line.strip_prefix("decision_type=") {
            for (k, d) in v.split_whitespace().enumerate() {
                let d: i32 = d.parse().unwrap();
                if d & 1 == 0 {
                    out.push((feats[k], thr[k]));
                }
            }
        }
    }
    out
}

/// The 2000 test rows of the 60-feature schema: 1500 random + 500 threshold-edge rows.
pub fn numeric_rows() -> Vec<Vec<f64>> {
    let mut rng = SplitMix64::new(2);
    let mut rows: Vec<Vec<f64>> = (0..N_TEST - N_EDGE).map(|_| gen_row(&mut rng)).collect();
    let pairs: Vec<(usize, f64)> = NUMERIC_MODELS
        .iter()
        .flat_map(|m| numerical_thresholds(&read_fixture(&format!("{m}.txt"))))
        .collect();
    let specials = [
        0.0,
        -0.0,
        1e-36,
        -1e-36,
        K_ZERO,
        -K_ZERO,
        K_ZERO.next_up(),
        -K_ZERO.next_up(),
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ];
    let mut rng = SplitMix64::new(3);
    let base_len = rows.len() as u64;
    for _ in 0..N_EDGE {
        let mut r = rows[(rng.next() % base_len) as usize].clone();
        for _ in 0..10 {
            let (f, t) = pairs[(rng.next() % pairs.len() as u64) as usize];
            r[f] = match rng.next() % 3 {
                0 => t,
                1 => t.next_down(),
                _ => t.next_up(),
            };
        }
        for _ in 0..3 {
            let c = (rng.next() % N_FEAT as u64) as usize;
            r[c] = specials[(rng.next() % specials.len() as u64) as usize];
        }
        rows.push(r);
    }
    rows
}

/// The 2000 test rows of the categorical schema (first 400 with odd category values).
pub fn categorical_rows() -> Vec<Vec<f64>> {
    let odd = [
        f64::NAN,
        -1.0,
        -0.5,
        0.5,
        2.7,
        -0.0,
        31.0,
        32.0,
        63.999,
        1e10,
        -1e10,
        2147483647.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ];
    let mut rng = SplitMix64::new(5);
    (0..N_TEST)
        .map(|i| {
            let mut r = vec![0.0; N_CAT_FEAT];
            r[0] = (rng.next() % 7) as f64;
            r[1] = (rng.next() % 45) as f64;
            r[2] = (rng.next() % 320) as f64;
            let u = rng.next();
            r[3] = if (u >> 40) % 10 < 2 {
                f64::NAN
            } else {
                (u % 14) as f64
            };
            for (j, slot) in r.iter_mut().enumerate().skip(4) {
                let u = rng.next();
                *slot = magnitude(u, -6, 9);
                if j == 5 && (u >> 40).is_multiple_of(10) {
                    *slot = f64::NAN;
                }
            }
            if i < N_CAT_ODD {
                for slot in r.iter_mut().take(4) {
                    let v = rng.next();
                    if v.is_multiple_of(2) {
                        *slot = odd[((v >> 8) % odd.len() as u64) as usize];
                    }
                }
            }
            r
        })
        .collect()
}

pub fn fnv1a(rows: &[Vec<f64>]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in rows.iter().flatten().flat_map(|v| v.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
    }
    h
}

/// Digest recorded by gen_fixtures.py for `key` ("rows" / "rows_categorical").
pub fn recorded_digest(key: &str) -> u64 {
    let text = read_fixture("rows.digest");
    let hex = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {key} in rows.digest"));
    u64::from_str_radix(hex.trim(), 16).unwrap()
}

/// Expected outputs: (raw, pred) per row; pred == raw for identity objectives.
pub fn expected(name: &str) -> Vec<(f64, f64)> {
    let text = read_fixture(&format!("{name}.expected.csv"));
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let parse = |s: &str| -> f64 {
        if s.is_empty() {
            f64::NAN
        } else {
            s.parse().unwrap()
        }
    };
    lines
        .map(|l| match header {
            "raw" => (parse(l), parse(l)),
            "raw,pred" => {
                let (a, b) = l.split_once(',').unwrap();
                (parse(a), parse(b))
            }
            h => panic!("unexpected header {h}"),
        })
        .collect()
}
