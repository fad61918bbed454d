//! Malformed input: every case is an `Err` with a one-line message, never a panic.

use super::common::{read_fixture, SplitMix64};
use crate::model::lgbm::Booster;

fn err(text: &str) -> String {
    match Booster::parse(text) {
        Ok(_) => panic!("parse unexpectedly succeeded"),
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(!msg.contains('\n'), "multi-line message: {msg:?}");
            assert!(!msg.is_empty());
            msg
        }
    }
}

fn assert_err(text: &str, phrase: &str) {
    let msg = err(text);
    assert!(msg.contains(phrase), "expected {phrase:?} in {msg:?}");
    println!("{msg}");
}

/// Replace the value of `key=` inside block `Tree=tree` (or the header when `tree` is None).
fn set_field(text: &str, tree: Option<usize>, key: &str, f: impl Fn(&str) -> String) -> String {
    let start = match tree {
        Some(t) => text.find(&format!("\nTree={t}\n")).expect("tree") + 1,
        None => 0,
    };
    let at = start + text[start..].find(&format!("\n{key}=")).expect("key") + 1;
    let vstart = at + key.len() + 1;
    let vend = vstart + text[vstart..].find('\n').unwrap();
    format!(
        "{}{}{}",
        &text[..vstart],
        f(&text[vstart..vend]),
        &text[vend..]
    )
}

fn replace_token(v: &str, idx: usize, new: &str) -> String {
    let mut t: Vec<&str> = v.split(' ').collect();
    t[idx] = new;
    t.join(" ")
}

fn without_tree_sizes(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with("tree_sizes="))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn model() -> String {
    read_fixture("a_binary.txt")
}

#[test]
fn empty_and_garbage() {
    assert_err("", "empty model text");
    assert_err("\n\n  \n", "empty model text");
    assert_err("hello world", "not a LightGBM text model");
    assert_err("{\"name\": \"tree\"}", "not a LightGBM text model");
    assert_err("tree\n", "truncated: header ends before the first tree");
}

#[test]
fn truncated_everywhere() {
    // every cut point of a small model, from the first tree to just before "end of trees"
    let text = read_fixture("d_single_leaf.txt");
    let first = text.find("Tree=0\n").unwrap();
    let end = text.find("end of trees\n").unwrap();
    for cut in first..end + "end of trees".len() {
        let msg = err(&text[..cut]);
        assert!(msg.starts_with("truncated"), "cut at {cut}: {msg}");
    }
    // every cut inside the header is an error too
    for cut in 0..first {
        err(&text[..cut]);
    }
    // sampled cut points of the large model (which has tree_sizes) as well
    let big = model();
    let first = big.find("Tree=0\n").unwrap();
    let end = big.find("end of trees\n").unwrap();
    for cut in (first..end).step_by(397) {
        let msg = err(&big[..cut]);
        assert!(msg.starts_with("truncated"), "cut at {cut}: {msg}");
    }
    // cuts after "end of trees" (feature importances, parameters) are harmless
    assert!(Booster::parse(&big[..end + "end of trees".len()]).is_ok());
    assert!(Booster::parse(&big[..end + 40]).is_ok());
}

#[test]
fn truncated_named_points() {
    let text = model();
    let t12 = text.find("\nTree=12\n").unwrap() + 1;
    let lv = t12 + text[t12..].find("leaf_value=").unwrap();
    assert_err(&text[..lv], "truncated: tree 12 has no leaf_value");
    assert_err(&text[..lv + 20], "truncated: tree 12: leaf_value has");
    assert_err(&text[..t12], "truncated: no \"end of trees\" after tree 11");
    assert_err(
        &text[..t12 + 3],
        "truncated: file ends in the middle of line \"Tre\"",
    );
    let header_cut = text.find("feature_infos=").unwrap() + 30;
    assert_err(
        &text[..header_cut],
        "truncated: header ends before the first tree",
    );
    let end = text.find("end of trees").unwrap();
    assert_err(&text[..end + 5], "truncated");
}

#[test]
fn tree_sizes() {
    let text = model();
    let bad = set_field(&text, None, "tree_sizes", |v| {
        let n: usize = v.split(' ').nth(3).unwrap().parse().unwrap();
        replace_token(v, 3, &(n + 1).to_string())
    });
    assert_err(&bad, "tree_sizes mismatch: tree 3 block is");
    let short = set_field(&text, None, "tree_sizes", |v| {
        v.rsplit_once(' ').unwrap().0.into()
    });
    assert_err(&short, "tree_sizes lists 49 trees but the file has more");
    let long = set_field(&text, None, "tree_sizes", |v| format!("{v} 100"));
    assert_err(&long, "tree_sizes lists 51 trees, the file has 50");
    let junk = set_field(&text, None, "tree_sizes", |v| replace_token(v, 0, "x"));
    assert_err(&junk, "tree_sizes has a value that is not a count");
    // CRLF line endings change the block sizes (LightGBM cannot load such a file either)
    let crlf = text.replace('\n', "\r\n");
    assert_err(&crlf, "tree_sizes mismatch");
    // without tree_sizes, both LF and CRLF load and score identically
    let reference = Booster::parse(&text).unwrap();
    for t in [
        without_tree_sizes(&text),
        without_tree_sizes(&text).replace('\n', "\r\n"),
    ] {
        let b = Booster::parse(&t).unwrap();
        let row: Vec<f64> = (0..60).map(|i| i as f64 * 0.37).collect();
        assert_eq!(
            b.raw_score(&row).to_bits(),
            reference.raw_score(&row).to_bits()
        );
    }
}

#[test]
fn bad_values() {
    let text = model();
    assert_err(
        &set_field(&text, Some(7), "threshold", |v| replace_token(v, 2, "nan")),
        "tree 7: threshold 2 is NaN",
    );
    assert_err(
        &set_field(&text, Some(7), "threshold", |v| replace_token(v, 2, "0.5x")),
        "tree 7: threshold value 2 \"0.5x\" is not a valid number",
    );
    assert_err(
        &set_field(&text, Some(4), "split_feature", |v| {
            replace_token(v, 1, "60")
        }),
        "tree 4: split_feature 60 at node 1 is beyond max_feature_idx=59",
    );
    assert_err(
        &set_field(&text, Some(4), "split_feature", |v| {
            replace_token(v, 1, "-1")
        }),
        "tree 4: split_feature value 1 \"-1\" is not a valid number",
    );
    assert_err(
        &set_field(&text, Some(9), "leaf_value", |v| replace_token(v, 0, "inf")),
        "tree 9: leaf_value 0 is inf",
    );
    assert_err(
        &set_field(&text, Some(5), "decision_type", |v| {
            replace_token(v, 0, "12")
        }),
        "tree 5: decision_type 12 at node 0 has unknown missing type 3",
    );
    assert_err(
        &set_field(&text, Some(5), "decision_type", |v| {
            replace_token(v, 0, "64")
        }),
        "tree 5: decision_type 64 at node 0 is not in 0..15",
    );
    assert_err(
        &set_field(&text, Some(5), "decision_type", |v| {
            replace_token(v, 0, "1")
        }),
        "tree 5: node 0 is a categorical split but num_cat is 0",
    );
    assert_err(
        &set_field(&text, Some(2), "is_linear", |_| "1".into()),
        "tree 2: linear trees (is_linear=1) are not supported",
    );
    assert_err(
        &set_field(&text, Some(2), "num_leaves", |_| "0".into()),
        "tree 2: num_leaves is 0",
    );
    assert_err(
        &set_field(&text, Some(2), "num_leaves", |_| "many".into()),
        "tree 2: num_leaves \"many\" is not a count",
    );
}

#[test]
fn mismatched_arrays() {
    let text = model();
    for key in [
        "split_feature",
        "threshold",
        "decision_type",
        "left_child",
        "right_child",
    ] {
        let bad = set_field(&text, Some(3), key, |v| {
            v.rsplit_once(' ').unwrap().0.into()
        });
        assert_err(
            &bad,
            &format!("tree 3: {key} has 29 values, num_leaves 31 needs 30"),
        );
    }
    let bad = set_field(&text, Some(3), "leaf_value", |v| format!("{v} 0.5"));
    assert_err(
        &bad,
        "tree 3: leaf_value has 32 values, num_leaves 31 needs 31",
    );
    let bad = set_field(&text, Some(3), "num_leaves", |_| "6".into());
    assert_err(
        &bad,
        "tree 3: leaf_value has 31 values, num_leaves 6 needs 6",
    );
    // a required field missing entirely (not at end of file)
    let t = text.find("\nTree=3\n").unwrap();
    let a = t + text[t..].find("\nright_child=").unwrap();
    let b = a + 1 + text[a + 1..].find('\n').unwrap();
    let mut gone = text.clone();
    gone.replace_range(a..b, "");
    assert_err(&gone, "tree 3 has no right_child");
}

#[test]
fn broken_structure() {
    let text = model();
    // child pointing back at the root
    assert_err(
        &set_field(&text, Some(6), "left_child", |v| replace_token(v, 1, "0")),
        "tree 6: node 0 is reached twice",
    );
    // child beyond the node / leaf arrays
    assert_err(
        &set_field(&text, Some(6), "left_child", |v| replace_token(v, 0, "30")),
        "tree 6: node 0 has child node 30, but there are only 30 internal nodes",
    );
    assert_err(
        &set_field(&text, Some(6), "right_child", |v| {
            replace_token(v, 0, "-32")
        }),
        "tree 6: node 0 has child leaf 31, but num_leaves is 31",
    );
    // a leaf used twice leaves another unreachable
    let t6 = text.find("\nTree=6\n").unwrap();
    let lc = &text[t6..];
    let line = lc[lc.find("\nleft_child=").unwrap() + 12..]
        .lines()
        .next()
        .unwrap();
    let leaf = line
        .split(' ')
        .find(|t| t.starts_with('-'))
        .unwrap()
        .to_string();
    let msg = err(&set_field(&text, Some(6), "right_child", |v| {
        let pos = v.split(' ').position(|t| t.starts_with('-')).unwrap();
        replace_token(v, pos, &leaf)
    }));
    assert!(
        msg.contains("is reached twice") || msg.contains("not reachable"),
        "{msg}"
    );
}

#[test]
fn bad_header() {
    let text = model();
    assert_err(
        &set_field(&text, None, "objective", |_| "foo bar:1".into()),
        "unknown objective \"foo\"",
    );
    assert_err(
        &set_field(&text, None, "objective", |_| "binary".into()),
        "objective binary has no sigmoid parameter",
    );
    assert_err(
        &set_field(&text, None, "objective", |_| "binary sigmoid:-1".into()),
        "sigmoid -1 must be a positive number",
    );
    assert_err(
        &set_field(&text, None, "objective", |_| {
            "multiclass num_class:3".into()
        }),
        "multiclass objective multiclass is not supported",
    );
    assert_err(
        &set_field(&text, None, "num_class", |_| "3".into()),
        "multiclass models are not supported (num_class=3",
    );
    assert_err(
        &set_field(&text, None, "version", |_| "v5".into()),
        "unsupported model version \"v5\"",
    );
    assert_err(
        &text.replace("max_feature_idx=59\n", ""),
        "unknown feature count: header has no max_feature_idx",
    );
    assert_err(
        &set_field(&text, None, "max_feature_idx", |_| "-1".into()),
        "unknown feature count: max_feature_idx \"-1\" is not a count",
    );
    assert_err(
        &set_field(&text, None, "max_feature_idx", |_| "60".into()),
        "feature_names has 60 names, max_feature_idx=60 needs 61",
    );
    assert_err(
        &set_field(&text, None, "feature_infos", |v| {
            v.rsplit_once(' ').unwrap().0.into()
        }),
        "feature_infos has 59 entries, max_feature_idx=59 needs 60",
    );
    assert_err(
        &text.replace("num_class=1\n", ""),
        "header has no num_class",
    );
    assert_err(
        &text.replace("version=v4\n", "version=v4\nversion=v4\n"),
        "duplicate header key \"version\"",
    );
    assert_err(
        &text.replace("\nTree=4\n", "\nTree=5\n"),
        "expected \"Tree=4\", found \"Tree=5\"",
    );
    let end = text.find("Tree=0\n").unwrap();
    let start = text.find("\nend of trees\n").unwrap() + 1;
    let no_trees = format!("{}{}", &text[..end], &text[start..]);
    assert_err(&no_trees.replace("tree_sizes=", "x="), "model has no trees");
}

#[test]
fn categorical_errors() {
    let text = read_fixture("e_categorical.txt");
    // find a tree with a categorical split
    let t = (0..20)
        .find(|t| {
            let s = text.find(&format!("\nTree={t}\n")).unwrap();
            !text[s..]
                .split("\n\n")
                .next()
                .unwrap()
                .contains("num_cat=0\n")
        })
        .unwrap();
    assert_err(
        &set_field(&text, Some(t), "cat_boundaries", |v| {
            v.rsplit_once(' ').unwrap().0.into()
        }),
        &format!("tree {t}: cat_boundaries has"),
    );
    assert_err(
        &set_field(&text, Some(t), "cat_threshold", |v| format!("{v} 7")),
        &format!("tree {t}: cat_threshold has"),
    );
    assert_err(
        &set_field(&text, Some(t), "cat_boundaries", |v| {
            replace_token(v, 0, "1")
        }),
        "cat_boundaries must start at 0",
    );
    // a categorical node whose threshold is not a category-set index
    let msg = err(&set_field(&text, Some(t), "threshold", |v| {
        let toks: Vec<&str> = v.split(' ').collect();
        let dec_line = text[text.find(&format!("\nTree={t}\n")).unwrap()..]
            .lines()
            .find_map(|l| l.strip_prefix("decision_type="))
            .unwrap()
            .to_string();
        let j = dec_line
            .split(' ')
            .position(|d| d.parse::<i32>().unwrap() & 1 == 1)
            .unwrap();
        let mut toks: Vec<String> = toks.iter().map(|s| s.to_string()).collect();
        toks[j] = "99".into();
        toks.join(" ")
    }));
    assert!(msg.contains("not a category set index"), "{msg}");
}

/// Mutate random bytes of valid models: `parse` must never panic, and any model it
/// accepts must score rows without panicking.
#[test]
fn fuzz_mutations_never_panic() {
    let models = [
        read_fixture("a_binary.txt"),
        read_fixture("c_zero_as_missing.txt"),
        read_fixture("d_single_leaf.txt"),
        read_fixture("e_categorical.txt"),
        read_fixture("f_rf.txt"),
    ];
    let alphabet = b"0123456789-+.e =\nnaTrex_,:\r";
    let mut rng = SplitMix64::new(99);
    let (mut ok, mut errs) = (0, 0);
    // LGBM_FUZZ_ITERS=200000 cargo test --release --test bad_input fuzz  for a longer run
    let iters: usize = std::env::var("LGBM_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    for iter in 0..iters {
        let src = &models[iter % models.len()];
        let mut bytes = src.as_bytes().to_vec();
        let n_mut = 1 + (rng.next() % 4) as usize;
        for _ in 0..n_mut {
            let pos = (rng.next() % bytes.len() as u64) as usize;
            let r = rng.next();
            match r % 5 {
                0 => {
                    bytes.remove(pos);
                }
                1 => bytes.insert(pos, alphabet[(r >> 8) as usize % alphabet.len()]),
                2 => bytes[pos] = 0x20 + ((r >> 8) % 95) as u8, // any printable ASCII
                _ => bytes[pos] = alphabet[(r >> 8) as usize % alphabet.len()],
            }
        }
        if rng.next().is_multiple_of(10) {
            let cut = (rng.next() % bytes.len() as u64) as usize;
            bytes.truncate(cut);
        }
        let text = String::from_utf8(bytes).expect("ascii");
        match Booster::parse(&text) {
            Ok(b) => {
                ok += 1;
                let n = b.num_features();
                for row in [
                    vec![f64::NAN; n],
                    vec![0.0; n],
                    vec![-1e300; n],
                    (0..n).map(|i| i as f64 * 3.3).collect(),
                ] {
                    b.raw_score(&row);
                    b.predict(&row);
                }
                b.predict(&[]);
            }
            Err(e) => {
                errs += 1;
                let msg = format!("{e:#}");
                assert!(!msg.contains('\n') && !msg.is_empty(), "{msg:?}");
            }
        }
    }
    println!("fuzz: {ok} mutated models still parsed, {errs} rejected");
    assert!(errs > iters / 2);
}
